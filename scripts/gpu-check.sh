#!/usr/bin/env bash
# The GPU check on a CUDA machine without network (docs/install.md, "GPU check on an offline
# node"): installs the wheels of `make gpu-bundle` into a scratch folder with no package index,
# puts it and this checkout on PYTHONPATH, and runs `myriad bench gpu --offline` with the node's
# own Python and PyTorch.
#
#   scripts/gpu-check.sh [myriad bench gpu options]        e.g.  --stages nav_envs,pretrain
#
# GPU_BUNDLE: the bundle folder (default gpu-bundle/); GPU_TARGET: where it is installed (default
# a fresh temporary folder); PYTHON: the node's Python (default python3).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
BUNDLE="${GPU_BUNDLE:-gpu-bundle}"
if ! ls "$BUNDLE"/*.whl >/dev/null 2>&1; then
  echo "gpu-check: no wheels in $BUNDLE/: run 'make gpu-bundle' on a machine with network and copy the folder here (or set GPU_BUNDLE)" >&2
  exit 2
fi
TARGET="${GPU_TARGET:-$(mktemp -d -t myriad-gpu-bundle-XXXXXX)}"
"$PYTHON" -m pip install -q --no-index --no-deps --no-compile --disable-pip-version-check --upgrade \
  --target "$TARGET" "$BUNDLE"/*.whl
export PYTHONPATH="$TARGET:$PWD${PYTHONPATH:+:$PYTHONPATH}"
exec "$PYTHON" -m myriad.cli bench gpu --offline "$@"
