#!/bin/bash
# A Ray cluster over a SLURM allocation, then K-Myriad pretraining with its envs on Ray workers
# anywhere in it (`distributed=cluster`, docs/distributed.md "Running on a cluster"). Run through
# SLURM on one CPU node (tests/test_slurm.py, on the single-node SLURM of
# scripts/slurm-local.sh); never run across several nodes.
#
#   sbatch docs/examples/slurm_ray.sh [pretraining overrides...]
#
# Options on the sbatch command line override the #SBATCH lines below. Environment:
# MYRIAD_VENV (the virtual environment, default $HOME/myriad/.venv), RAY_PORT (the head's port,
# default 6379). Ray's token authentication is on: the token is ~/.ray/auth_token (created when
# absent), so $HOME must be shared by the nodes, as it usually is. One CPU node, two workers, tiny sizes (what the test runs):
#
#   sbatch --nodes=1 --cpus-per-task=2 docs/examples/slurm_ray.sh \
#     distributed.workers.num_workers=2 distributed.workers.cpus_per_worker=1 num_envs=64
#SBATCH --job-name=myriad-ray
#SBATCH --nodes=4
#SBATCH --ntasks-per-node=1
#SBATCH --cpus-per-task=32
#SBATCH --exclusive
#SBATCH --time=04:00:00
set -euo pipefail
source "${MYRIAD_VENV:-$HOME/myriad/.venv}/bin/activate"

nodes=($(scontrol show hostnames "$SLURM_JOB_NODELIST"))
head=${nodes[0]}
head_ip=$(srun --nodes=1 --ntasks=1 -w "$head" hostname --ip-address | awk '{print $1}')
export RAY_ADDRESS="$head_ip:${RAY_PORT:-6379}"
export RAY_AUTH_MODE=token
[ -s "$HOME/.ray/auth_token" ] || ray get-auth-token --generate >/dev/null
# A temporary folder of its own: Ray records the last cluster started on a machine in its default
# one, where any later ray.init() without an address (another user's, another job's) would join
# this cluster.
ray_tmp=/tmp/ray-myriad-$SLURM_JOB_ID

# One Ray node per SLURM node, each a job step that lasts as long as the job: when the script
# ends, SLURM ends the steps and Ray with them. --overlap lets the steps share the nodes' CPUs
# with the learner, which runs in this script on the first node.
srun --nodes=1 --ntasks=1 --overlap -w "$head" \
  ray start --head --node-ip-address="$head_ip" --port="${RAY_PORT:-6379}" \
  --num-cpus="$SLURM_CPUS_PER_TASK" --include-dashboard=false --temp-dir="$ray_tmp" --block &
for node in "${nodes[@]:1}"; do
  srun --nodes=1 --ntasks=1 --overlap -w "$node" \
    ray start --address="$RAY_ADDRESS" --num-cpus="$SLURM_CPUS_PER_TASK" --temp-dir="$ray_tmp" \
    --block &
done

# Wait (at most 2 minutes) until every node has joined.
python - "${#nodes[@]}" <<'EOF'
import sys, time

import ray

want, deadline = int(sys.argv[1]), time.monotonic() + 120
while True:
    try:
        ray.init(address="auto", logging_level="ERROR")
        break
    except ConnectionError:
        if time.monotonic() > deadline:
            sys.exit("the Ray head did not start")
        time.sleep(1)
while sum(node["Alive"] for node in ray.nodes()) < want:
    if time.monotonic() > deadline:
        sys.exit(f"{sum(n['Alive'] for n in ray.nodes())} of {want} Ray nodes joined")
    time.sleep(1)
EOF

# RAY_ADDRESS is set: the cluster preset's address "auto" finds this cluster.
python -m myriad pretrain distributed=cluster "$@"
