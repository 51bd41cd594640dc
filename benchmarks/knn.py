"""Benchmark of the kNN backends; same as `myriad bench knn` (see myriad/bench/knn.py).

python benchmarks/knn.py [--quick] [--out benchmarks/results/knn.json]
"""

import os
import sys

# faiss and torch each load their own OpenMP runtime; with the default (spinning) wait policy the
# idle threads of one compete with the working threads of the other on a small machine. The
# policy is read when the runtimes load, so it is set before importing either.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from myriad.bench.knn import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
