#!/usr/bin/env bash
# `make gpu-bundle`: the wheels that `scripts/gpu-check.sh` installs on a CUDA machine without
# network (docs/install.md, "GPU check on an offline node").
#
# Such machines (cluster compute nodes, rented GPU boxes) usually have PyTorch with CUDA, NumPy,
# SciPy, h5py, Matplotlib and PyYAML preinstalled; the bundle holds what myriad needs beyond
# that for `myriad bench gpu`, and nothing that is built for one CUDA version (faiss-gpu, the
# CUDA wheels of warp-lang): the check uses the torch CUDA k-NN backend instead and skips the
# MuJoCo Warp stage with one line. The list, and why each is there, is BUNDLE below.
#
#   scripts/gpu-bundle.sh [OUT_DIR]          (default: gpu-bundle/)
#   GPU_PYTHON=3.12 scripts/gpu-bundle.sh    (the node's Python; default: this machine's)
#
# Needs network (this machine's package index); writes OUT_DIR/MANIFEST.txt with each wheel's
# size.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-gpu-bundle}"
PYTHON="${PYTHON:-python3}"
GPU_PYTHON="${GPU_PYTHON:-$("$PYTHON" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')}"

# name==version  why
BUNDLE=(
  "hydra-core==1.3.2"               # the config system of every command
  "omegaconf==2.3.0"                # hydra's config objects
  "antlr4-python3-runtime==4.9.3"   # omegaconf's interpolation grammar (sdist only: built here)
  "pykdtree==1.4.3"                 # k-NN on the CPU (the reference of the k-NN stage)
  "threadpoolctl==3.6.0"            # thread counts of the k-NN search
  "gymnasium==1.2.2"                # the env API every myriad env implements
  "farama-notifications==0.0.4"     # gymnasium's dependency
  "cloudpickle==3.1.1"              # gymnasium's dependency
  "rich==14.2.0"                    # progress bars and tables
  "markdown-it-py==4.0.0"           # rich's dependency
  "mdurl==0.1.2"                    # markdown-it-py's dependency
  "pygments==2.19.2"                # rich's dependency
  "tensorboard==2.20.0"             # the runs' scalar logs
  "tensorboard-data-server==0.7.2"  # tensorboard's dependency
  "protobuf==6.33.1"                # tensorboard's event files
  "absl-py==2.3.1"                  # tensorboard's dependency
  "markdown==3.10"                  # tensorboard's dependency
  "werkzeug==3.1.3"                 # tensorboard's dependency
  "zarr==3.1.6"                     # the zarr dataset format (imported with myriad.datasets)
  "numcodecs==0.16.6"               # zarr's codecs
  "donfig==0.8.1.post1"             # zarr's configuration
  "google-crc32c==1.9.0"            # zarr's crc32c checksum codec
  "pytest==8.4.2"                   # the CUDA tests stage
  "iniconfig==2.3.0"                # pytest's dependency
  "pluggy==1.6.0"                   # pytest's dependency
)

rm -rf "$OUT.partial"
mkdir -p "$OUT.partial"
binary=()
for spec in "${BUNDLE[@]}"; do
  [ "${spec%%==*}" = "antlr4-python3-runtime" ] || binary+=("$spec")
done
"$PYTHON" -m pip download -q --no-deps --only-binary=:all: --dest "$OUT.partial" \
  --python-version "$GPU_PYTHON" --implementation cp --abi "cp${GPU_PYTHON/./}" --abi abi3 \
  --abi none --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform manylinux1_x86_64 --platform any "${binary[@]}"
# antlr4-python3-runtime 4.9.3 (the version omegaconf 2.3 pins) ships as source only; the wheel
# is pure Python, so building it here serves any Python 3.
"$PYTHON" -m pip wheel -q --no-deps --wheel-dir "$OUT.partial" "antlr4-python3-runtime==4.9.3"
(
  cd "$OUT.partial"
  for wheel in *.whl; do
    printf '%8d KB  %s\n' "$(($(stat -c %s "$wheel") / 1024))" "$wheel"
  done
  printf '%8d KB  total\n' "$(du -ck ./*.whl | tail -1 | cut -f1)"
) >"$OUT.partial/MANIFEST.txt"
rm -rf "$OUT"
mv "$OUT.partial" "$OUT"
cat "$OUT/MANIFEST.txt"
