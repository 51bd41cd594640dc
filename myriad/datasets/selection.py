"""Choosing the data: which transitions of a pretraining run make the dataset.

Three rules, each a stream of row batches (episode-contiguous, see :mod:`myriad.datasets.schema`)
so that ``myriad export`` writes them in bounded memory:

- :func:`final_population_rows`: fresh episodes of the run's *final* population (its last
  checkpoint), ``transitions`` rows, the members taking turns env by env so that every member
  contributes the same number of episodes. This is the data of the policies pretraining ends with,
  without the early iterations in which a population and a single policy explore alike.
- :func:`iteration_rows`: the episodes that *ended* in pretraining iterations ``[start, stop)``
  (the recorder stores the cumulative row count after every iteration as
  ``metadata["iteration_rows"]``).
- :func:`coverage_budget`: at most ``budget`` transitions chosen, episode by episode, to cover the
  env's grid. The rule (greedy maximum coverage, in rounds): repeatedly take the episode that
  visits the most grid cells not yet covered (ties: the earlier episode); when no episode adds a
  cell, a new round starts with the covered set emptied, so that the cells are covered a second
  time, then a third, and so on; the episode that would overflow the budget is cut to fit (its
  last kept row becomes a timeout). Episodes are written in their original order.
"""

from __future__ import annotations

import heapq
import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from myriad.datasets.episodes import EpisodeAssembler
from myriad.datasets.schema import DatasetSpec, Rows, row_fields

if TYPE_CHECKING:
    from myriad.envs.base import FeatureSpec


class SelectionError(ValueError):
    """The requested selection does not fit the dataset (message says how to fix it)."""


# -- the final population ------------------------------------------------------------------------
def final_population_rows(
    run: str | os.PathLike[str],
    transitions: int,
    *,
    seed: int = 0,
    num_envs: int | None = None,
    deterministic: bool = False,
) -> tuple[DatasetSpec, Iterator[Rows]]:
    """Roll out the final population of a pretraining run and return its rows.

    Args:
        run: a run folder (its newest checkpoint) or a checkpoint file.
        transitions: rows to produce (exactly; the last episode is cut to fit).
        seed: env reset and action-noise seed.
        num_envs: parallel envs (default: the fewest multiples of the population size that fill
            ``transitions`` with one episode each, at most 4096). Env ``e`` is member ``e % M``.
        deterministic: act with each member's mean action instead of sampling (pretraining's
            data is sampled, so the default matches it).

    Returns:
        ``(spec, rows)``: the dataset's spec (metadata of the run plus ``"selection"``) and a
        generator of episode-contiguous row batches totalling ``transitions`` rows.
    """
    from myriad.envs import make_from_config
    from myriad.rl.saved_population import load_population
    from myriad.utils.seeding import make_generator

    if int(transitions) < 1:
        raise SelectionError(f"transitions must be a positive number, got {transitions}")
    if Path(run).is_file() and Path(run).suffix != ".pt":
        # A dataset file, say: the rollouts need the population, which only the run holds.
        raise SelectionError(
            f"--final-population rolls out the run's last checkpoint, and {run} is not one: "
            "give the run folder (or a checkpoints/iter_NNNNNN.pt file)"
        )
    saved = load_population(run)
    model, members = saved.model, saved.model.num_members
    probe = make_from_config(saved.env, 1, "cpu")
    horizon, names = probe.max_episode_steps, tuple(probe.features.names)
    obs_dim, action_dim = probe.obs_dim, probe.action_dim
    probe.close()
    if num_envs is None:
        per_member = math.ceil(int(transitions) / (members * horizon))
        num_envs = min(members * max(1, per_member), max(members, 4096 - 4096 % members))
    if num_envs < 1:
        raise SelectionError(f"num_envs must be positive, got {num_envs}")
    from myriad.datasets.recorder import dataset_metadata

    metadata = {
        **dataset_metadata(saved.config, members, names),
        "reward": "intrinsic (not recorded: rollouts of the final population, reward 0)",
        "selection": {
            "rule": "final_population",
            "checkpoint": str(saved.path),
            "transitions": int(transitions),
            "seed": int(seed),
            "deterministic": bool(deterministic),
        },
    }
    spec = DatasetSpec(obs_dim, action_dim, names, metadata)

    def rows() -> Iterator[Rows]:
        env = make_from_config(saved.env, int(num_envs), "cpu")
        member = torch.arange(int(num_envs)) % members
        gen = make_generator(seed, env.device)
        assembler = EpisodeAssembler(
            int(num_envs), horizon, row_fields(obs_dim, action_dim, len(names))
        )
        obs = env.reset(seed=seed)
        left = int(transitions)
        try:
            with torch.no_grad():
                while left > 0:
                    features = env.current_features()
                    out = model.act(obs, member, gen, deterministic=deterministic)
                    actions = out.actions.clamp(-1.0, 1.0)  # what the env executes
                    nxt, _, terminated, truncated, info = env.step(actions)
                    step = {
                        "observations": obs,
                        "next_observations": info["final_obs"],
                        "actions": actions,
                        "rewards": torch.zeros(int(num_envs)),
                        "terminals": terminated,
                        "timeouts": truncated,
                        "member": member.to(torch.int32),
                        "features": features,
                    }
                    host = {k: v.detach().cpu().numpy()[None] for k, v in step.items()}
                    done = rows_of(assembler.add(host, host["terminals"] | host["timeouts"]))
                    if done is not None:
                        out_rows, left = _cut(done, left)
                        yield out_rows
                    obs = nxt
        finally:
            env.close()

    return spec, rows()


def rows_of(rows: Rows) -> Rows | None:
    """``rows`` or None when empty."""
    return rows if len(rows["rewards"]) else None


def _cut(rows: Rows, left: int) -> tuple[Rows, int]:
    """At most ``left`` rows of ``rows``; a cut episode's last kept row becomes a timeout."""
    n = len(rows["rewards"])
    if n <= left:
        return rows, left - n
    kept = {k: v[:left].copy() for k, v in rows.items()}
    if left:
        kept["timeouts"][-1] = not kept["terminals"][-1]
    return kept, 0


# -- iteration ranges ------------------------------------------------------------------------------
def iteration_range(spec: DatasetSpec, start: int | None, stop: int | None) -> tuple[int, int]:
    """The rows ``[first, end)`` of the episodes that ended in iterations ``[start, stop)``.

    ``start`` and ``stop`` are 0-based iteration indices and may be negative (counted from the
    end, as Python slices); None is the run's first / last iteration.

    Raises:
        SelectionError: the dataset records no per-iteration row counts, or the range is empty.
    """
    counts = spec.metadata.get("iteration_rows")
    if not isinstance(counts, list | tuple) or not counts:
        raise SelectionError(
            "the dataset records no per-iteration row counts (metadata 'iteration_rows'; "
            "written by `myriad pretrain` since this version): choose rows with --members or "
            "--budget, or re-run the pretraining"
        )
    bounds = [0, *[int(c) for c in counts]]
    its = range(len(counts))[slice(start, stop)]
    if len(its) == 0:
        raise SelectionError(
            f"iterations {start}:{stop} select no iteration of the {len(counts)} the run has"
        )
    return bounds[its[0]], bounds[its[-1] + 1]


def row_range_stream(chunks: Iterator[Rows], first: int, end: int) -> Iterator[Rows]:
    """The rows ``[first, end)`` (global row indices) of a stream of batches."""
    offset = 0
    for rows in chunks:
        n = len(rows["rewards"])
        lo, hi = max(first - offset, 0), min(end - offset, n)
        if lo < hi:
            yield {k: v[lo:hi] for k, v in rows.items()}
        offset += n
        if offset >= end:
            return


# -- coverage budget ------------------------------------------------------------------------------
def episode_cells(chunks: Iterator[Rows], grid: FeatureSpec) -> tuple[np.ndarray, list[np.ndarray]]:
    """Length ``[K]`` and the distinct reachable grid cells of every episode, in one pass."""
    from myriad.entropy import cell_index

    n_cells = math.prod(grid.cells)
    reach = grid.reachable.reshape(-1) if grid.reachable is not None else np.ones(n_cells, bool)
    lengths: list[int] = []
    cells: list[np.ndarray] = []
    carry_cells: list[np.ndarray] = []
    carry_len = 0
    for rows in chunks:
        n = len(rows["rewards"])
        if n == 0:
            continue
        cell_t, inside_t = cell_index(
            torch.as_tensor(rows["features"]), grid.low, grid.high, grid.cells
        )
        cell = np.where(inside_t.numpy(), cell_t.numpy(), -1)
        ends = np.flatnonzero(rows["terminals"] | rows["timeouts"])
        start = 0
        for e in ends:
            part = cell[start : e + 1]
            carry_cells.append(part)
            allc = np.unique(np.concatenate(carry_cells))
            allc = allc[allc >= 0]
            cells.append(allc[reach[allc]])
            lengths.append(carry_len + int(e + 1 - start))
            carry_cells, carry_len, start = [], 0, int(e + 1)
        if start < n:
            carry_cells.append(cell[start:])
            carry_len += n - start
    if carry_len:
        raise SelectionError("the dataset ends inside an episode (run `myriad dataset validate`)")
    return np.asarray(lengths, np.int64), cells


def greedy_coverage(
    lengths: np.ndarray, cells: list[np.ndarray], budget: int
) -> tuple[np.ndarray, int]:
    """The episodes of the coverage rule (module docstring) within ``budget`` transitions.

    Args:
        lengths: ``[K]`` rows per episode.
        cells: per episode, its distinct cells (int arrays).
        budget: transitions at most.

    Returns:
        ``(chosen, rows_of_last)``: the chosen episode indices in the order they were picked,
        and how many rows of the last one fit (its full length unless it was cut).
    """
    chosen: list[int] = []
    left = int(budget)
    remaining = set(range(len(lengths)))
    size = 1 + max((int(c.max()) for c in cells if len(c)), default=0)
    last_rows = 0
    while left > 0 and remaining:
        covered = np.zeros(size, bool)
        # Lazy greedy: gains only shrink as the cover grows, so stored gains are upper bounds
        # and a popped entry whose true gain equals its bound is the maximum (ties: lower index).
        heap = [(-len(cells[i]), i) for i in sorted(remaining)]
        heapq.heapify(heap)
        picked_this_round = False
        while heap and left > 0:
            bound, i = heapq.heappop(heap)
            if bound == 0:
                break  # every remaining episode adds nothing this round
            gain = int((~covered[cells[i]]).sum())
            if gain != -bound:
                heapq.heappush(heap, (-gain, i))  # stale bound: re-queue with the true gain
                continue
            chosen.append(i)
            remaining.discard(i)
            covered[cells[i]] = True
            last_rows = min(int(lengths[i]), left)
            left -= last_rows
            picked_this_round = True
        if not picked_this_round:
            # No episode adds a cell even to an empty cover (all outside the grid): take the
            # rest in their original order.
            for i in sorted(remaining):
                if left <= 0:
                    break
                chosen.append(i)
                last_rows = min(int(lengths[i]), left)
                left -= last_rows
            break
    return np.asarray(chosen, np.int64), last_rows


def episode_stream(
    chunks: Iterator[Rows], chosen: np.ndarray, last: int | None, last_rows: int
) -> Iterator[Rows]:
    """The rows of the episodes ``chosen`` (indices, any order) in their original order; the
    episode ``last`` keeps only its first ``last_rows`` rows (its last kept row a timeout)."""
    wanted = np.zeros(int(chosen.max(initial=-1)) + 2, bool)
    wanted[chosen] = True
    episode = 0  # index of the episode the chunk's first row belongs to
    carry = 0  # rows of that episode seen in earlier chunks
    for rows in chunks:
        n = len(rows["rewards"])
        if n == 0:
            continue
        ends = rows["terminals"] | rows["timeouts"]
        starts = np.concatenate([[False], ends[:-1]])  # the row begins a new episode
        ep = episode + np.cumsum(starts)
        idx = np.arange(n)
        pos = idx - np.maximum.accumulate(np.where(starts, idx, 0))  # position in its episode
        pos[ep == episode] += carry
        keep = wanted[np.minimum(ep, len(wanted) - 1)] & (ep < len(wanted) - 1)
        timeouts = rows["timeouts"]
        if last is not None:
            in_last = ep == last
            keep &= ~(in_last & (pos >= last_rows))
            cut = in_last & (pos == last_rows - 1) & ~rows["terminals"]
            if cut.any():
                timeouts = timeouts | cut
        if keep.any():
            out = {k: v[keep] for k, v in rows.items()}
            out["timeouts"] = timeouts[keep]
            yield out
        episode = int(ep[-1]) + int(ends[-1])
        carry = 0 if ends[-1] else int(pos[-1]) + 1


def coverage_selection(
    chunks: Iterator[Rows], grid: FeatureSpec | None, budget: int
) -> dict[str, Any]:
    """Pass 1 of ``--budget``: which episodes (and rows of the last) the coverage rule keeps.

    Args:
        chunks: the candidate rows (episode-contiguous batches).
        grid: the env's feature grid (:func:`myriad.datasets.inspection.env_grid`).
        budget: transitions at most.

    Returns:
        ``chosen`` (episode indices), ``last`` (the episode that may be cut, or None),
        ``last_rows``, ``rows`` (total kept), ``episodes`` (of the dataset).
    """
    if int(budget) < 1:
        raise SelectionError(f"--budget must be a positive number of transitions, got {budget}")
    if grid is None:
        raise SelectionError(
            "--budget chooses episodes by grid coverage, and this dataset's env has no "
            "coverage grid (or its env cannot be built): use --iterations or --members"
        )
    lengths, cells = episode_cells(chunks, grid)
    chosen, last_rows = greedy_coverage(lengths, cells, int(budget))
    last = int(chosen[-1]) if len(chosen) else None
    total = int(lengths[chosen[:-1]].sum()) + last_rows if len(chosen) else 0
    return {
        "chosen": chosen,
        "last": last,
        "last_rows": last_rows,
        "rows": total,
        "episodes": len(lengths),
    }
