"""``python -m myriad``: the ``myriad`` command, so ``torchrun -m myriad pretrain ...`` works."""

from myriad.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
