"""Datasets of the transitions a population collects, in layouts offline-RL users load."""

from myriad.datasets.episodes import EpisodeAssembler
from myriad.datasets.hdf5 import D4RLWriter, DatasetWriteError, read_d4rl

__all__ = ["D4RLWriter", "DatasetWriteError", "EpisodeAssembler", "read_d4rl"]
