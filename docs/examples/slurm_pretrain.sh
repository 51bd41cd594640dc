#!/bin/bash
# K-Myriad pretraining sharded over the GPUs of several nodes with torchrun (docs/distributed.md,
# "Sharded populations over torchrun ranks"). Run through SLURM on one CPU node with two ranks
# (tests/test_slurm.py, on the single-node SLURM of scripts/slurm-local.sh); never run on a
# multi-node GPU cluster.
#
#   sbatch docs/examples/slurm_pretrain.sh                     # a new run
#   RESUME=runs/pretrain/slurm-1234 sbatch docs/examples/slurm_pretrain.sh   # continue it
#
# Options on the sbatch command line override the #SBATCH lines below; arguments after the
# script's name are pretraining overrides, applied after the script's own. Environment:
# MYRIAD_VENV (the virtual environment, default $HOME/myriad/.venv), GPUS_PER_NODE (ranks per
# node, default 4), RDZV_PORT (the rendezvous port on the first node, default 29500). One CPU
# node, two ranks, tiny sizes (what the test runs):
#
#   GPUS_PER_NODE=2 sbatch --nodes=1 --gpus-per-node=0 --cpus-per-task=2 \
#     docs/examples/slurm_pretrain.sh device=cpu num_envs=64 population.size=4 iterations=4
#
# The run folder must be on a filesystem every node sees: all ranks read the checkpoint on
# resume, rank 0 writes everything.
#SBATCH --job-name=myriad-pretrain
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1          # one torchrun per node; it starts that node's ranks
#SBATCH --gpus-per-node=4
#SBATCH --cpus-per-task=32
#SBATCH --time=04:00:00
set -euo pipefail

source "${MYRIAD_VENV:-$HOME/myriad/.venv}/bin/activate"
GPUS_PER_NODE=${GPUS_PER_NODE:-4}
head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
export OMP_NUM_THREADS=1             # small MLPs: one thread per rank

if [ -n "${RESUME:-}" ]; then
  run_args=(--resume "$RESUME")
else
  # population.size must be a multiple of nodes x GPUs (8 here): each rank owns size / 8 members.
  run_args=(--run-dir "runs/pretrain/slurm-$SLURM_JOB_ID"
            device=cuda num_envs=65536 population.size=16 iterations=2000)
fi

# c10d rendezvous on the first node: every node's torchrun meets there and gets its ranks (the
# order of the nodes is the rendezvous's); rank 0, wherever it lands, writes the run folder.
srun torchrun \
  --nnodes="$SLURM_NNODES" \
  --nproc_per_node="$GPUS_PER_NODE" \
  --rdzv_id="$SLURM_JOB_ID" \
  --rdzv_backend=c10d \
  --rdzv_endpoint="$head_node:${RDZV_PORT:-29500}" \
  -m myriad pretrain "${run_args[@]}" "$@"
