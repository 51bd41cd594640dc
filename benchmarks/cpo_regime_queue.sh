#!/usr/bin/env bash
# The regime benchmark's runs in the order they are taken (each command skips what has finished
# and resumes what was interrupted), from a checkout at a fixed commit:
#
#   git worktree add --detach /work/bench-regime HEAD
#   cd /work/bench-regime && PYTHON=/path/to/.venv/bin/python benchmarks/cpo_regime_queue.sh
#
# Finished runs write benchmarks/results/cpo_regime/<task>-b6x4096[-kmyriad]/<algo>-seed<k>.json
# in that checkout; copy them into the main checkout and commit them.
set -u
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
PY="${PYTHON:-python3}"
B=benchmarks/cpo_regime.py
INIT='runs/bench/cpo_regime/pretrain/maze-far-b6x4096-seed{seed}'
"$PY" $B run --algos ppo,cpo,sapg,pbt --seeds 0
"$PY" $B pretrain --seeds 0 --env-steps 1e7
"$PY" $B run --algos cpo,ppo --seeds 0 --init-from "$INIT"
# One seed of the scale sweep before more seeds: where, if anywhere, the leader gains.
"$PY" $B run --algos ppo,cpo,sapg --seeds 0 --envs-per-block 512
"$PY" $B run --algos ppo,cpo,sapg --seeds 0 --envs-per-block 64
# HalfCheetah in the regime's form at the scale this CPU steps (1,536 envs, 10^7 env steps).
"$PY" $B run --task halfcheetah --envs-per-block 256 --env-steps 1e7 --algos ppo,sapg,cpo,pbt --seeds 0-4
"$PY" $B run --algos ppo,cpo,sapg,pbt --seeds 1-4
"$PY" $B pretrain --seeds 1-4 --env-steps 1e7
"$PY" $B run --algos cpo,ppo --seeds 1-4 --init-from "$INIT"
# The scale sweep at equal env steps, then the harder maze.
"$PY" $B run --algos ppo,cpo,sapg --seeds 0-4 --envs-per-block 512
"$PY" $B run --algos ppo,cpo,sapg --seeds 0-4 --envs-per-block 64
"$PY" $B run --task big-maze --algos ppo,cpo,sapg,pbt --seeds 0-4
# nav-three-routes: SAPG's and CPO's leaders reached the goal in seed 0. PPO and PBT at the
# authors' initial std first (their first runs, at log std -0.5, are superseded), then the
# two-stage recipe and the other seeds; HalfCheetah's PPO and PBT reruns in a second process.
"$PY" $B run --task three-routes --algos ppo,pbt --seeds 0
"$PY" $B pretrain --task three-routes --seeds 0 --env-steps 1e7
"$PY" $B run --task three-routes --algos cpo,ppo --seeds 0 \
  --init-from 'runs/bench/cpo_regime/pretrain/three-routes-b6x4096-seed{seed}'
"$PY" $B run --task three-routes --algos ppo,sapg,cpo,pbt --seeds 1-4
"$PY" $B run --task halfcheetah --envs-per-block 256 --env-steps 1e7 --algos ppo,pbt --seeds 0-3
"$PY" $B run --task halfcheetah --envs-per-block 256 --env-steps 1e7 --algos ppo,sapg,cpo,pbt --seeds 4
# The two-stage recipe's other seeds on nav-three-routes, then the ablations of the population
# machinery behind three hypotheses: CPO's leader losing its route to unbounded off-policy losses
# (seed 2, where it did), CPO's policies widening under its AWAC pull (seeds 1, 2 and 4), and
# PBT's early successes coming from its members' separate networks.
for seed in 1 2 3 4; do
  "$PY" $B pretrain --task three-routes --seeds $seed --env-steps 1e7
done
"$PY" $B run --task three-routes --algos cpo,ppo --seeds 1-4 \
  --init-from 'runs/bench/cpo_regime/pretrain/three-routes-b6x4096-seed{seed}'
"$PY" $B run --task three-routes --algos cpo --seeds 2 --variant dual-clip
"$PY" $B run --task three-routes --algos cpo --seeds 1,2,4 --variant no-awac
"$PY" $B run --task three-routes --algos cpo --seeds 0,3 --variant no-awac
# The leader's off-policy clip around its own policy on the runs whose leaders widened.
"$PY" $B run --task three-routes --algos sapg --seeds 4 --variant leader-trust
"$PY" $B run --task three-routes --algos cpo --seeds 1,2,4 --variant leader-trust
"$PY" $B run --task three-routes --algos sapg,cpo --seeds 0-4 --variant independent
"$PY" $B run --task three-routes --algos cpo --seeds 0,1,3,4 --variant dual-clip
# The maze's far goal and the scale sweep at the authors' initial std for PPO and PBT.
"$PY" $B run --algos ppo,pbt --seeds 0-4
"$PY" $B run --algos ppo --seeds 0-4 --envs-per-block 512
"$PY" $B run --algos ppo --seeds 0-4 --envs-per-block 64
# The scale sweep on nav-three-routes too, where the far maze leaves every algorithm at 0 at every
# scale and PPO with all 24,576 envs reached this goal in one seed of five: whether more updates
# (fewer envs per block) let PPO find it, and where the ensemble's lead goes.
"$PY" $B run --task three-routes --algos ppo,cpo,sapg --seeds 0-4 --envs-per-block 512
"$PY" $B run --task three-routes --algos cpo --seeds 4 --variant dual-clip
"$PY" $B run --task three-routes --algos ppo,cpo,sapg --seeds 0-4 --envs-per-block 64
# What carries SAPG's lead over PPO at 512 envs per block: the same shared network with no
# off-policy rows for the leader.
"$PY" $B run --task three-routes --algos sapg,cpo --seeds 0-4 --envs-per-block 512 --variant no-off-policy
