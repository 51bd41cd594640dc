#!/usr/bin/env bash
# The HalfCheetah comparison at 8, 16 and 32 policies (docs/evidence/finetune.md) re-measured
# with the authors' loss form and couplings (variants sapg-paper-loss and cpo-paper-loss of
# benchmarks/halfcheetah_diversity.py) beside PPO, 5 seeds each, from one K-Myriad pretraining
# per population size. Resumable at the granularity of a population size: a finished
# pretraining or JSON is skipped. From a checkout at a fixed commit:
#
#   git worktree add --detach /work/bench-hc HEAD
#   cd /work/bench-hc && PYTHON=/path/to/.venv/bin/python benchmarks/halfcheetah_paper_form_queue.sh
#
# Writes benchmarks/results/halfcheetah_finetune_<M>_paper_form.json (+ .png, _finetune.png).
set -eu
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
PY="${PYTHON:-python3}"
WORK="${WORK:-runs/bench/halfcheetah_paper_form}"
for M in ${SIZES:-8 16 32}; do
  pre="$WORK/pretrain-$M"
  if [ ! -f "$pre/summary.json" ]; then
    rm -rf "$pre"
    "$PY" -m myriad pretrain env=ant env.name=mujoco-halfcheetah '~env.options.xy_bound' \
      '+env.options.x_bound=10.0' env.options.max_episode_steps=200 "population.size=$M" \
      num_envs=1024 iterations=200 seed=0 dataset.enabled=false progress=false \
      checkpoint_every=0 torch_threads=1 --run-dir "$pre"
  fi
  out="benchmarks/results/halfcheetah_finetune_${M}_paper_form.json"
  if [ ! -f "$out" ] || ! grep -q '"finetune"' "$out"; then
    "$PY" benchmarks/halfcheetah_diversity.py --run "$pre" --out "$out"
    "$PY" benchmarks/halfcheetah_diversity.py --finetune-init "$pre" --members "$M" \
      --finetune-seeds 5 --finetune-variants ppo sapg-paper-loss cpo-paper-loss --out "$out"
  fi
done
