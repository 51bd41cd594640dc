"""Distinct solutions: the three-routes layout, the metric on hand-made trajectories, the
walled-off route, and the finetuning runner's evaluation, summary and closing report."""

from __future__ import annotations

import json
import random
from collections import Counter, deque

import numpy as np
import pytest
import torch

from myriad.assess.evaluation import PopulationEvaluator
from myriad.assess.solutions import (
    RegionMap,
    blocked_layout,
    distinct_solutions,
    exclusive_regions,
    layout_regions,
)
from myriad.envs import make
from myriad.envs.layout import Layout, LayoutError
from myriad.finetune.api import report, resolve_config
from myriad.finetune.runner import FinetuneRunner
from myriad.nn.population import build_population
from myriad.utils.config import ConfigError

THREE = Layout.load("three_routes")


def bfs_path(free: np.ndarray, start: tuple[int, int], goal: tuple[int, int]) -> list:
    """Shortest 4-connected path of cells from ``start`` to ``goal`` over ``free`` (a plain
    breadth-first search, independent of the library's), or [] when there is none."""
    parent = {start: None}
    queue = deque([start])
    while queue:
        cell = queue.popleft()
        if cell == goal:
            path = []
            while cell is not None:
                path.append(cell)
                cell = parent[cell]
            return path[::-1]
        r, c = cell
        for nxt in ((r + 1, c), (r - 1, c), (r, c + 1), (r, c - 1)):
            if free[nxt] and nxt not in parent:
                parent[nxt] = cell
                queue.append(nxt)
    return []


def corridors(layout: Layout) -> list[int]:
    region, junction = layout_regions(layout)
    return [i for i in range(len(junction)) if not junction[i]]


def route_cells(layout: Layout, corridor: int) -> list[tuple[int, int]]:
    """The shortest start-goal path through ``corridor`` alone (other corridors walled)."""
    region, _ = layout_regions(layout)
    others = [i for i in corridors(layout) if i != corridor]
    free = ~layout.walls & ~np.isin(region, others)
    return bfs_path(free, layout.starts[0], layout.goals[0])


def world(layout: Layout, cells: list[tuple[int, int]]) -> torch.Tensor:
    return torch.tensor([layout.cell_center(r, c) for r, c in cells], dtype=torch.float32)


def batch(paths: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Pad ``[T_i, 2]`` paths into ``features [N, T, 2]`` and ``valid [N, T]``; the padding
    repeats a far-away point that ``valid`` must mask."""
    longest = max(len(p) for p in paths)
    features = torch.full((len(paths), longest, 2), 0.5)  # a wall cell's position
    valid = torch.zeros(len(paths), longest, dtype=torch.bool)
    for i, p in enumerate(paths):
        features[i, : len(p)] = p
        valid[i, : len(p)] = True
    return features, valid


# ------------------------------------------------------------------------------ the layout


def test_three_routes_layout_has_three_equal_routes():
    corridor_ids = corridors(THREE)
    assert len(corridor_ids) == 3
    lengths = [len(route_cells(THREE, k)) - 1 for k in corridor_ids]
    assert lengths == [24, 24, 24]
    # Every route is needed: walling off all three corridors cuts the start off the goal.
    region, _ = layout_regions(THREE)
    free = ~THREE.walls & ~np.isin(region, corridor_ids)
    assert bfs_path(free, THREE.starts[0], THREE.goals[0]) == []
    # The library's BFS agrees on the shortest start-goal distance.
    goal = THREE.goals[0]
    assert THREE.distances_from(THREE.starts[0])[goal] == 24
    env = make("nav-three-routes", 4)
    assert env.max_episode_steps == 200 and env.layout.name == "three_routes"


# ------------------------------------------------------------------------------ the metric


@pytest.fixture(scope="module")
def routes() -> list[torch.Tensor]:
    return [world(THREE, route_cells(THREE, k)) for k in corridors(THREE)]


def count(paths, success=None, share=0.05):
    features, valid = batch(paths)
    region_ids, valid = RegionMap.for_layout(THREE).route_states(features, valid)
    return distinct_solutions(region_ids, valid, success, share)


def test_no_success_means_no_solution(routes):
    result = count(routes, success=torch.zeros(3, dtype=torch.bool))
    assert result.count == 0 and result.num_successes == 0
    assert result.member_routes(torch.arange(3), 3).tolist() == [-1, -1, -1]


def test_one_route_with_duplicates_and_jitter_is_one_solution(routes):
    gen = torch.Generator().manual_seed(0)
    # The same route, with positions moved inside their cells and a stop at the goal of a
    # different length: the signature (regions crossed) is unchanged.
    paths = [routes[0] + (torch.rand(routes[0].shape, generator=gen) - 0.5) * 0.8 for _ in range(9)]
    paths.append(torch.cat([routes[0], routes[0][-1:].repeat(5, 1)]))
    result = count(paths)
    assert result.count == 1 and result.sizes.tolist() == [10]


def test_three_routes_are_three_solutions(routes):
    paths = [routes[k] for k in (0, 1, 2) for _ in range(5)]
    result = count(paths)
    assert result.count == 3 and result.sizes.tolist() == [5, 5, 5]
    member = torch.arange(15) // 5  # member k took route k
    labels = result.member_routes(member, 3).tolist()
    assert sorted(labels) == [0, 1, 2]
    # Failed episodes do not count: only route 0 succeeded.
    success = torch.arange(15) < 5
    assert count(paths, success).count == 1


def test_excursions_are_erased_and_rare_routes_do_not_count(routes):
    top, middle, bottom = routes
    # A look into the middle corridor and back, then the top route: still the top route.
    peek = torch.cat([top[:1], world(THREE, [(4, 2), (4, 3), (4, 2)]), top])
    # Two cells down the bottom corridor and back, then the middle route.
    dead_end = torch.cat([middle[:1], world(THREE, [(5, 1), (6, 1), (5, 1)]), middle])
    # Up the top corridor one cell, then diagonally past the start cell into the middle
    # corridor (no state in the start cell on the way back) and along the middle route.
    corner = torch.cat([middle[:1], torch.tensor([[1.5, 5.2], [2.3, 4.6]]), middle[2:]])
    regions = RegionMap.for_layout(THREE)
    assert regions(corner[1:3]).tolist() == [corridors(THREE)[0], corridors(THREE)[1]]
    both = count([top] * 5 + [peek] + [middle] * 5 + [dead_end, corner])
    assert both.count == 2 and both.sizes.tolist() == [7, 6]
    paths = [top] * 20 + [middle] * 20 + [bottom]
    strict = count(paths)  # the bottom route: 1 of 41 successes (2.4%) < 5%
    assert strict.count == 2 and strict.counted.tolist() == [True, True, False]
    assert count(paths, share=0.0).count == 3
    assert count(paths, share=0.5).count == 0
    # A share reached exactly counts: 20 of 41 episodes against 20/41.
    assert count(paths, share=20 / 41).count == 2


def loop_erased(sequence: list[int]) -> frozenset:
    """Chronological loop erasure, one region at a time (the reference)."""
    path: list[int] = []
    for region in sequence:
        if region in path:
            del path[path.index(region) + 1 :]
        else:
            path.append(region)
    return frozenset(path)


def test_batched_clusters_match_python_loop_erasure():
    rng = random.Random(0)
    n, t = 150, 12
    ids = torch.tensor([[rng.randrange(-1, 5) for _ in range(t)] for _ in range(n)])
    valid = torch.tensor([[j < rng.randrange(1, t + 1) for j in range(t)] for _ in range(n)])
    success = torch.tensor([rng.random() < 0.7 for _ in range(n)])
    result = distinct_solutions(ids, valid, success, min_share=0.03)
    sets = Counter(
        loop_erased([int(ids[i, j]) for j in range(t) if valid[i, j] and ids[i, j] >= 0])
        for i in range(n)
        if success[i]
    )
    assert sorted(result.sizes.tolist(), reverse=True) == sorted(sets.values(), reverse=True)
    threshold = 0.03 * sum(sets.values())
    assert result.count == sum(v >= threshold for v in sets.values())
    for k in range(len(result.sizes)):  # each cluster's regions are its episodes' route
        members = torch.nonzero(result.episode_cluster == k).flatten().tolist()
        regions = frozenset(result.regions[result.signatures[k]].tolist())
        assert sets[regions] == len(members)
        for i in members:
            route = [int(ids[i, j]) for j in range(t) if valid[i, j] and ids[i, j] >= 0]
            assert loop_erased(route) == regions


def test_grid_regions_for_envs_without_a_layout():
    regions = RegionMap.grid((0.0, 0.0), (1.0, 1.0), bins=4)
    line = torch.linspace(0.05, 0.95, 12)
    low, high = torch.full_like(line, 0.1), torch.full_like(line, 0.9)
    paths = [torch.stack([line, y], dim=1) for y in (low, high, line)] * 3
    features, valid = batch(paths)
    ids = regions(features)
    assert int(ids.max()) < 16 and regions.num_regions == 16
    assert distinct_solutions(ids, valid).count == 3  # success=None: every episode counts
    with pytest.raises(ValueError, match="fewer bins"):
        RegionMap.grid((0.0,) * 40, (1.0,) * 40, bins=4)


# ------------------------------------------------------------------------------ walled routes


def test_walling_off_one_route_leaves_the_others(routes):
    paths = [routes[k] for k in (0, 1, 2) for _ in range(4)]
    regions = RegionMap.for_layout(THREE)
    result = count(paths)
    grid, _ = layout_regions(THREE)
    for k in range(3):
        blocked = exclusive_regions(result, k, regions)
        assert len(blocked) == 1  # the route's own corridor, never the start or goal hub
        perturbed = blocked_layout(THREE, grid, blocked)
        assert perturbed.walls[grid == blocked[0]].all()
        assert perturbed.distances_from(THREE.starts[0])[THREE.goals[0]] == 24
    # A single-route layout: walling off its corridor cuts the start off the goal.
    u_maze = Layout.load("u_maze")
    u_grid, _ = layout_regions(u_maze)
    with pytest.raises(LayoutError, match="cannot be reached"):
        blocked_layout(u_maze, u_grid, corridors(u_maze))


# ------------------------------------------------------------------------------ evaluation

# Two routes around a pillar; constant actions follow one or the other.
PILLAR = "#####\n#S..#\n#.#.#\n#..G#\n#####\n"
PILLAR_OPTIONS = {"task": "sparse", "goal_radius": 0.8, "max_episode_steps": 80}
# Member 0 mostly right (top route), member 1 mostly down (left route), in world x-y: each slides
# along the wall it meets until the slow component takes it round the pillar.
CONSTANT_ACTIONS = [[1.0, -0.08], [0.08, -1.0]]


def constant_policy(model, actions: list[list[float]]) -> None:
    """Set each member's deterministic action to a constant (zero head weights, bias =
    action): a real policy whose route is known in advance."""
    head = model.actor.head if hasattr(model.actor, "head") else model.actor.layers[-1]
    with torch.no_grad():
        head.weight.zero_()
        head.bias.copy_(torch.tensor(actions))


def pillar_population(tmp_path):
    """The pillar layout's env factory, one env of it, and two members with the constant
    policies of :data:`CONSTANT_ACTIONS` (member 0 by the top route, member 1 by the left)."""
    path = tmp_path / "pillar.txt"
    path.write_text(PILLAR)
    options = {"layout": str(path), **PILLAR_OPTIONS}

    def make_env(n, **overrides):
        return make("nav", n, **{**options, **overrides})

    probe = make_env(1)
    population = {
        "size": 2,
        "parameterization": "shared_trunk",
        "actor_hidden": [8],
        "critic_hidden": [8],
        "normalize_obs": False,
    }
    model = build_population(population, probe.obs_dim, probe.action_dim)
    constant_policy(model, CONSTANT_ACTIONS)
    return make_env, probe, model


def test_evaluator_counts_routes_and_walls_off_the_leaders(tmp_path):
    make_env, probe, model = pillar_population(tmp_path)
    evaluator = PopulationEvaluator(
        make_env, 2, seed=3, regions=RegionMap.for_env(probe), perturb="block_leader_route"
    )
    before = evaluator.evaluate(model, leader=0, episodes=8)
    assert before.scalars["eval/leader_success"] == 1.0
    assert before.scalars["eval/distinct_solutions"] == 2.0
    assert before.member_route.tolist() in ([0, 1], [1, 0])
    report_, after, perturbed = evaluator.robustness(model, 0, 8, before)
    assert report_["route_of"] == "leader" and report_["goal_reachable"]
    assert sorted(map(tuple, report_["blocked_cells"])) == [(1, 2), (1, 3), (2, 3)]
    assert perturbed.walls[1, 2] and perturbed.walls[2, 3]
    # Member 1's route is untouched; the leader meets the new wall at once and slides along it
    # into member 1's route: both succeed, now by one route.
    assert report_["after"]["member_success"] == [1.0, 1.0]
    assert after.scalars["eval/distinct_solutions"] == 1.0
    assert after.member_route.tolist() == [0, 0]
    features = after.episodes.features[after.episodes.valid]
    cells = set(map(tuple, features.floor().long().tolist()))
    assert not cells & {(2, 3), (3, 3), (3, 2)}  # (x, y) of the walled cells (1,2) (1,3) (2,3)


def test_perturbation_needs_a_layout_and_a_known_name():
    env = make("nav-empty", 1)
    with pytest.raises(ConfigError, match=r"eval\.perturb='sideways' is not known"):
        PopulationEvaluator(lambda n: env, 1, 0, RegionMap.for_env(env), perturb="sideways")
    grid = RegionMap.grid((0.0, 0.0), (1.0, 1.0), 4)
    with pytest.raises(ConfigError, match="has no layout"):
        PopulationEvaluator(lambda n: env, 1, 0, grid, perturb="block_leader_route")


TINY = [
    "num_envs=16",
    "num_steps=8",
    "population.actor_hidden=[16]",
    "population.critic_hidden=[16]",
    "ppo.epochs=1",
    "ppo.minibatches=1",
    "eval.every=1",
    "eval.episodes=4",
    "eval.final_episodes=4",
    "eval.perturb=block_leader_route",
    "diagnostics.states_per_member=8",
    "checkpoint_every=0",
    "progress=false",
    "tensorboard=false",
]
SIZES = {"cpo": 2, "sapg": 2, "pbt": 2, "ppo": 1}


@pytest.mark.parametrize("algo", ["cpo", "sapg", "pbt", "ppo"])
def test_runner_logs_solutions_and_robustness(tmp_path, algo, capsys):
    path = tmp_path / "pillar.txt"
    path.write_text(PILLAR)
    overrides = [
        *TINY,
        "env=empty",
        f"+env.options.layout={path}",
        "env.options.max_episode_steps=80",
        "+env.options.goal_radius=0.8",
        f"population.size={SIZES[algo]}",
        f"plots={algo == 'cpo'}",
    ]
    if algo == "pbt":
        overrides.append("algo.interval=1")
    runner = FinetuneRunner(resolve_config(algo, overrides), tmp_path / "run")
    try:
        runner.learn(2)
        history = runner.logger.history
        assert [s for s, _ in history["eval/distinct_solutions"]] == [1, 2]
        constant_policy(runner.model, CONSTANT_ACTIONS[: SIZES[algo]])
        summary = runner.finish()
    finally:
        runner.close()
    written = json.loads((tmp_path / "run" / "summary.json").read_text())
    leader = written["leader"]
    assert written["final_eval"]["eval/leader_success"] == 1.0
    assert written["solutions"]["count"] == SIZES[algo]
    robustness = written["robustness"]
    assert robustness["before"]["leader_success"] == 1.0
    # The leader's route is walled off: every member slides into the other route.
    assert robustness["after"]["member_success"] == [1.0] * SIZES[algo]
    assert robustness["after"]["distinct_solutions"] == 1.0
    assert robustness["route"] == written["solutions"]["member_route"][leader]
    assert [e["iteration"] for e in written["evaluations"]] == [1, 2]
    if algo == "cpo":
        assert (tmp_path / "run" / "plots" / "routes.png").stat().st_size > 0
    report(summary, tmp_path / "run")
    text = capsys.readouterr().out
    assert f"distinct solutions (population)  {SIZES[algo]}" in text.replace("   ", "  ")
    assert "best member 100% -> 100%, leader 100% -> 100%" in text


def test_sampled_evaluation_scores_the_sampled_actions(tmp_path):
    # eval.sampled: the same envs with sampled actions. A policy with a negligible std acts as
    # its mean does; a leader at the widest std (log std 2, the bound) random-walks, and some
    # of its episodes miss the goal that its mean reaches in every one.
    make_env, probe, model = pillar_population(tmp_path)
    evaluator = PopulationEvaluator(make_env, 2, seed=3, regions=RegionMap.for_env(probe))
    with torch.no_grad():
        model.log_std.fill_(-20.0)
    mean = evaluator.evaluate(model, leader=0, episodes=8).scalars
    narrow = evaluator.sampled(model, leader=0, episodes=8)
    assert narrow["eval/leader_success_sampled"] == mean["eval/leader_success"] == 1.0
    assert narrow["eval/population_success_sampled"] == 1.0
    assert narrow["eval/leader_return_sampled"] == pytest.approx(mean["eval/leader_return"])
    with torch.no_grad():
        model.log_std[0].fill_(3.0)
    wide = evaluator.sampled(model, leader=0, episodes=8)
    assert evaluator.evaluate(model, leader=0, episodes=8).scalars["eval/leader_success"] == 1.0
    assert wide["eval/leader_success_sampled"] < 1.0
    assert wide["eval/population_success_sampled"] == 1.0  # member 1, still narrow
