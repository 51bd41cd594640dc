"""Why the population's data lost on ``nav-three-routes`` (seed 0): the dataset measures of
every source's 100,000-transition dataset side by side, with the TD3 result each trained.

In seed 0 of ``benchmarks/exorl.py``, TD3 on the K-Myriad final population's data reaches the
goals from fewer starts (0.613 over the 6 goals) than on the independent explorers' data
(0.927). This script measures, for each source (the protocol's four and the remedies of
``exorl.py --sources``, ``exorl.REMEDIES``: ``kmyriad_m16``, ``kmyriad_beta0.5``,
``kmyriad_beta0.75``, ``kmyriad_all``), from its dataset under ``--work``:

- the measures of ``myriad dataset info`` (:func:`myriad.datasets.dataset_info`): coverage,
  state-action coverage (SACo) and k-NN entropy of the union and of every member;
- how much the members overlap (:func:`overlap`): the mean Jaccard index of two members'
  covered cells over all pairs, the share of covered cells only one member covers, and the mean
  number of members covering a covered cell;
- the transitions reaching each of the protocol's goals within its goal radius
  (:func:`exorl.goals_of`, ``exorl.GOAL_RADIUS``, counted by the relabelling TD3 trains on,
  :func:`myriad.datasets.relabel`), for the union and per member, and the share the member
  with the most of them holds;
- what the failing starts need (:func:`start_exits`): every goal but the farthest lies in the
  top corridor, entered through the cell north of the start cell; the failing episodes start in
  the start square's right part and go east into the middle corridor. Counted: the transitions
  from the start cell, and those that leave it, by direction (north, east, south), for the
  whole cell and for states in its right half (``x`` at or right of the cell's centre);
- the share of transitions whose position moves less than ``STILL`` cells (:func:`still_share`:
  an agent pressed against a wall, data that buys no coverage).

Beside each source: its TD3 run's success and progress per goal
(``benchmarks/results/exorl/runs/three_routes-<source>-td3-n100000-s0.json``) where it exists.

    python benchmarks/exorl_why.py [--work runs/exorl]

Writes ``benchmarks/results/exorl_why.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import exorl

ENV = "three_routes"
SEED = 0
STILL = 0.05  # cells per step: less is "not moving"
DIRECTIONS = {"north": (0, 1), "east": (1, 0), "south": (0, -1), "west": (-1, 0)}


def member_cells(features: np.ndarray, member: np.ndarray, grid: Any) -> dict[int, np.ndarray]:
    """Each member's covered reachable cells: ``{member: [C] bool}`` over the grid's flat cells
    (the grid of the coverage measure, :func:`myriad.datasets.inspection.env_grid`).

    Args:
        features: ``[N, p]`` entropy features of the states.
        member: ``[N]`` the member that acted.
        grid: the env's feature grid.
    """
    from myriad.entropy import cell_index

    cell, inside = cell_index(torch.as_tensor(features), grid.low, grid.high, grid.cells)
    cell, inside = cell.numpy(), inside.numpy()
    reach = np.asarray(grid.reachable).reshape(-1)
    out = {}
    for m in np.unique(member):
        covered = np.zeros(reach.size, bool)
        covered[cell[inside & (member == m)]] = True
        out[int(m)] = covered & reach
    return out


def overlap(cells: dict[int, np.ndarray]) -> dict[str, float | None]:
    """How much members' covered cells overlap.

    Args:
        cells: ``{member: [C] bool}`` covered cells (:func:`member_cells`).

    Returns:
        ``mean_pairwise_jaccard`` (mean over member pairs of ``|A & B| / |A | B|``; None with
        fewer than two members), ``single_member_share`` (covered cells that exactly one member
        covers, over the covered cells), ``members_per_cell`` (mean number of members covering a
        covered cell: 1 for disjoint members, M for identical ones).
    """
    stack = np.stack(list(cells.values()))  # [M, C]
    count = stack.sum(0)
    covered = count > 0
    inter = stack.astype(np.int64) @ stack.T.astype(np.int64)  # [M, M] |A & B|
    sizes = np.diag(inter)
    union = sizes[:, None] + sizes[None, :] - inter
    i, j = np.triu_indices(len(stack), 1)
    jac = inter[i, j] / np.maximum(union[i, j], 1)
    return {
        "mean_pairwise_jaccard": float(jac.mean()) if len(jac) else None,
        "single_member_share": float((count == 1).sum() / max(covered.sum(), 1)),
        "members_per_cell": float(count[covered].mean()) if covered.any() else 0.0,
    }


def start_exits(
    pos: np.ndarray,
    next_pos: np.ndarray,
    member: np.ndarray,
    start: tuple[int, int],
) -> dict[str, Any]:
    """The transitions from the start cell and where they leave it.

    Args:
        pos, next_pos: ``[N, 2]`` world positions of ``s`` and ``s'``.
        member: ``[N]``.
        start: the start cell ``(ix, iy)`` in world orientation (cells of size 1 from 0).

    Returns:
        ``in_start_cell`` (transitions with ``s`` in it), ``exits`` (``{direction: count}`` of
        those whose ``s'`` is in the neighbouring cell in that direction), ``right_half`` (the
        same two counts for ``s`` at or right of the cell's centre, the part of the start square
        the failing episodes start from), ``north_share`` (north exits over all exits, for the
        cell and its right half), ``north_exits_per_member``.
    """
    here = np.floor(pos).astype(np.int64)
    there = np.floor(next_pos).astype(np.int64)
    inside = (here[:, 0] == start[0]) & (here[:, 1] == start[1])
    right = inside & (pos[:, 0] >= start[0] + 0.5)
    step = there - here
    exits, exits_right = {}, {}
    north = None
    for name, (dx, dy) in DIRECTIONS.items():
        went = inside & (step[:, 0] == dx) & (step[:, 1] == dy)
        exits[name] = int(went.sum())
        exits_right[name] = int((went & right).sum())
        if name == "north":
            north = went
    assert north is not None
    members = np.unique(member)

    def north_share(counts: dict[str, int]) -> float:
        return counts["north"] / max(sum(counts.values()), 1)

    return {
        "in_start_cell": int(inside.sum()),
        "exits": exits,
        "north_share": north_share(exits),
        "right_half": {
            "in_start_cell": int(right.sum()),
            "exits": exits_right,
            "north_share": north_share(exits_right),
        },
        "north_exits_per_member": {int(m): int((north & (member == m)).sum()) for m in members},
    }


def still_share(pos: np.ndarray, next_pos: np.ndarray, tol: float = STILL) -> float:
    """Share of transitions whose position moves less than ``tol`` (``[N, 2]`` each)."""
    return float((np.linalg.norm(next_pos - pos, axis=1) < tol).mean())


def measure(path: Path, radius: float) -> dict[str, Any]:
    """Every measure of the module docstring for one dataset file."""
    from myriad.datasets import NavGoalReward, dataset_info, load, relabel
    from myriad.datasets.inspection import env_grid
    from myriad.envs.layout import Layout

    info = dataset_info(path)
    data = load(path)
    goals, dists = exorl.goals_of(ENV, 6)
    reward = NavGoalReward.for_spec(data.spec, "sparse")
    pos = reward.positions(data.observations)
    next_pos = reward.positions(data.next_observations)
    reward.env.close()
    member = np.asarray(data.member)
    cells = member_cells(np.asarray(data.features), member, env_grid(data.spec))
    members = sorted(int(m) for m in np.unique(member))
    reaching, reaching_members = [], []
    for goal in goals:
        hit = np.asarray(relabel(data, "sparse", goal, radius).terminals)
        reaching.append(int(hit.sum()))
        reaching_members.append([int((hit & (member == m)).sum()) for m in members])
    layout = Layout.load(ENV)
    row, col = layout.starts[0]
    keys = ("coverage", "sa_coverage", "entropy")
    return {
        "dataset": str(path),
        "transitions": len(data),
        "selection": data.metadata.get("selection"),
        "population_size": data.metadata.get("population_size"),
        "union": {k: info["union"][k] for k in keys},
        "members": {
            str(m): {k: v[k] for k in ("steps", *keys)} for m, v in info["members"].items()
        },
        "member_mean": {k: float(np.mean([v[k] for v in info["members"].values()])) for k in keys},
        "member_min": {k: float(min(v[k] for v in info["members"].values())) for k in keys},
        "overlap": overlap(cells),
        "goal_distances_from_start": dists,
        "goal_reaching_transitions": reaching,
        "goal_reaching_transitions_per_member": reaching_members,
        "members_reaching_goal": [int(sum(c > 0 for c in r)) for r in reaching_members],
        # How much of a goal's data one member holds (1: the goal is one member's alone).
        "top_member_share_of_goal_transitions": [max(r) / max(sum(r), 1) for r in reaching_members],
        "start_cell": start_exits(pos, next_pos, member, (col, layout.height - 1 - row)),
        "still_share": still_share(pos, next_pos),
    }


def run_result(out: Path, source: str) -> dict[str, Any] | None:
    path = out / "runs" / f"{exorl.run_id(ENV, source, 'td3', 100_000, SEED)}.json"
    if not path.is_file():
        return None
    r = json.loads(path.read_text())
    return {
        "run": path.name,
        **{
            k: r[k]
            for k in ("success", "success_per_goal", "progress", "progress_per_goal", "steps")
        },
        "goal_reaching_transitions": r["goal_reaching_transitions"],
        # The learning curve, success averaged over the goals: the last point is one snapshot.
        "curve_steps": [c["step"] for c in r["curve"]],
        "curve_success": [float(np.mean(c["success_per_goal"])) for c in r["curve"]],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--work", default="runs/exorl", help="exorl.py's --work (its datasets)")
    p.add_argument("--results", default=str(exorl.RESULTS / "exorl"), help="exorl.py's --out")
    p.add_argument("--out", default=str(exorl.RESULTS / "exorl_why.json"))
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    sources: dict[str, Any] = {}
    for source in exorl.SOURCES + exorl.REMEDIES:
        path = exorl.dataset_path(Path(args.work), ENV, source, 100_000, SEED)
        if not path.is_file():
            print(f"{source}: no dataset at {path} (skipped)", file=sys.stderr)
            continue
        sources[source] = {
            "overrides": exorl.OVERRIDES.get(source),
            "whole_run_of": exorl.WHOLE_RUN.get(source),
            **measure(path, exorl.GOAL_RADIUS),
            "td3": run_result(Path(args.results), source),
        }
        s = sources[source]
        print(
            f"{source:16s} cov {s['union']['coverage']:.3f}"
            f" member {s['member_mean']['coverage']:.3f}"
            f" H {s['union']['entropy']:.2f} jacc {s['overlap']['mean_pairwise_jaccard']}"
            f" north {s['start_cell']['exits']['north']} right-north "
            f"{s['start_cell']['right_half']['exits']['north']}"
            f" reach {s['goal_reaching_transitions']}"
            f" td3 {s['td3']['success'] if s['td3'] else None}",
            flush=True,
        )
    goals, dists = exorl.goals_of(ENV, 6)
    result = {
        "env": exorl.ENVS[ENV],
        "seed": SEED,
        "goals": [list(g) for g in goals],
        "goal_distances_from_start": dists,
        "goal_radius": exorl.GOAL_RADIUS,
        "still_threshold_cells": STILL,
        "sources": sources,
    }
    Path(args.out).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
