"""K-Myriad pretraining: a population maximising the entropy of its state-distribution mixture."""

from myriad.pretrain.api import pretrain

__all__ = ["pretrain"]
