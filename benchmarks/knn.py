"""Benchmark of the kNN backends; same as `myriad bench knn` (see myriad/bench/knn.py).

python benchmarks/knn.py [--quick] [--out benchmarks/results/knn.json]
"""

import sys

from myriad.bench.knn import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
