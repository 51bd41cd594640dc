"""Views of a dataset: D4RL's transition view, task relabelling, d3rlpy conversion, coverage."""

import numpy as np
import pytest
import torch
from test_datasets_formats import make_rows, spec_of

from myriad.datasets import (
    D4RLWriter,
    TransitionData,
    dataset_info,
    load,
    qlearning_dataset,
    random_policy_rows,
    relabel,
)
from myriad.datasets.data import goal_conditioned, reward_note
from myriad.datasets.relabel import relabel_stream
from myriad.datasets.schema import concat_rows
from myriad.envs import make
from myriad.utils.optional import available

NAV_OPTIONS = {"max_episode_steps": 30, "max_speed": 0.85}


def d4rl_qlearning_reference(dataset: dict, terminate_on_end: bool = False) -> dict:
    """``d4rl.qlearning_dataset`` with timeouts, line for line (it reads next observations
    from the next row and never uses the last row)."""
    n = dataset["rewards"].shape[0]
    obs_, next_obs_, action_, reward_, done_ = [], [], [], [], []
    for i in range(n - 1):
        obs = dataset["observations"][i].astype(np.float32)
        new_obs = dataset["observations"][i + 1].astype(np.float32)
        action = dataset["actions"][i].astype(np.float32)
        reward = dataset["rewards"][i].astype(np.float32)
        done_bool = bool(dataset["terminals"][i])
        final_timestep = dataset["timeouts"][i]
        if (not terminate_on_end) and final_timestep:
            continue
        obs_.append(obs)
        next_obs_.append(new_obs)
        action_.append(action)
        reward_.append(reward)
        done_.append(done_bool)
    return {
        "observations": np.array(obs_),
        "actions": np.array(action_),
        "next_observations": np.array(next_obs_),
        "rewards": np.array(reward_),
        "terminals": np.array(done_),
    }


def test_qlearning_view_by_hand():
    # Two episodes: [0, 1, 2] ends by timeout, [3, 4] ends in a terminal, then [5] by timeout.
    obs = np.arange(6, dtype=np.float32)[:, None]
    nxt = np.array([1, 2, 9, 4, 8, 7], np.float32)[:, None]
    data = TransitionData(
        observations=obs,
        actions=obs * 10,
        rewards=obs / 10,
        next_observations=nxt,
        terminals=np.array([0, 0, 0, 0, 1, 0], bool),
        timeouts=np.array([0, 0, 1, 0, 0, 1], bool),
        member=np.zeros(6, np.int32),
        features=np.zeros((6, 0), np.float32),
    )
    view = qlearning_dataset(data)
    np.testing.assert_array_equal(view["observations"][:, 0], [0, 1, 3, 4])
    np.testing.assert_array_equal(view["next_observations"][:, 0], [1, 2, 4, 8])
    np.testing.assert_array_equal(view["terminals"], [False, False, False, True])
    np.testing.assert_array_equal(view["actions"][:, 0], [0, 10, 30, 40])
    full = qlearning_dataset(data, terminate_on_end=True)
    np.testing.assert_array_equal(full["observations"][:, 0], np.arange(6))
    np.testing.assert_array_equal(full["next_observations"][:, 0], nxt[:, 0])
    np.testing.assert_array_equal(full["terminals"], data.terminals)


@pytest.mark.parametrize("seed", range(5))
def test_qlearning_view_matches_d4rl(seed):
    rng = np.random.default_rng(seed)
    rows = make_rows(list(rng.integers(1, 12, size=10)), raw_bits=False, seed=seed)
    rows["timeouts"][-1], rows["terminals"][-1] = True, False  # as pretraining datasets end
    data = TransitionData.from_rows(rows, spec_of(rows))
    ours, ref = qlearning_dataset(data), d4rl_qlearning_reference(rows)
    for key in ("observations", "actions", "rewards", "terminals"):
        np.testing.assert_array_equal(ours[key], ref[key])
        assert ours[key].dtype == ref[key].dtype
    # s' agrees wherever D4RL's is meaningful; at terminals ours is the true next state.
    done = ref["terminals"]
    np.testing.assert_array_equal(ours["next_observations"][~done], ref["next_observations"][~done])
    kept = ~rows["timeouts"]
    np.testing.assert_array_equal(ours["next_observations"], rows["next_observations"][kept])


def nav_rollout(task: str, goal: tuple[float, float], steps: int = 90, num_envs: int = 16):
    """Rows of random actions in ``nav-maze`` with ``task``, and the env's own rewards."""
    env = make("nav-maze", num_envs, "cpu", task=task, goal=goal, **NAV_OPTIONS)
    member = torch.arange(num_envs, dtype=torch.int32) % 2
    parts = list(random_policy_rows(env, steps, seed=0, member=member))
    env.close()
    rows = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    meta = {"env": "nav-maze", "env_options": NAV_OPTIONS, "population_size": 2}
    from myriad.datasets import DatasetSpec

    spec = DatasetSpec(4, 2, ("x", "y"), meta)
    return TransitionData.from_rows(rows, spec)


@pytest.mark.parametrize("task", ["sparse", "dense"])
def test_relabelled_rewards_match_the_env(task):
    # A goal close to the start, so that random actions reach it often.
    goal = (1.5, 13.5)
    data = nav_rollout(task, goal)
    assert data.terminals.sum() >= 3, "the rollout never reached the goal"
    stripped = TransitionData(
        **{
            **data.__dict__,
            "rewards": np.zeros_like(data.rewards),
            "terminals": np.zeros_like(data.terminals),
        }
    )
    # Episodes must still be delimited: the env's terminal rows become timeouts.
    stripped.timeouts = data.timeouts | data.terminals
    got = relabel(stripped, task, goal)
    # The same note as load(task=...) and export(task=...) write.
    assert got.metadata["reward"] == reward_note(task, goal)
    assert got.metadata["reward"].endswith("relabelled from next states")
    np.testing.assert_array_equal(got.terminals, data.terminals)
    np.testing.assert_allclose(got.rewards, data.rewards, rtol=0, atol=1e-6)
    # Streaming in small chunks (episodes cut across chunks) gives the same labels.
    chunks = [
        {k: v[i : i + 7] for k, v in stripped.rows().items()} for i in range(0, len(stripped), 7)
    ]
    streamed = concat_rows(
        list(relabel_stream(iter(chunks), stripped.spec, task, goal)), stripped.spec
    )
    np.testing.assert_array_equal(streamed["rewards"], got.rewards)
    np.testing.assert_array_equal(streamed["terminals"], got.terminals)


def test_relabel_goal_radius_counts_next_positions_within_it():
    """A larger radius marks exactly the transitions whose next position lies within it: the
    count of an independent distance computation on the next states, more than at the env's."""
    goal = (1.5, 13.5)
    data = nav_rollout("sparse", goal)
    nxt = (data.next_observations[:, :2] + 1) / 2 * 17.0  # the maze is 17 x 17 cells
    distance = np.linalg.norm(nxt - np.asarray(goal), axis=1)
    default = relabel(data, "sparse", goal)
    wide = relabel(data, "sparse", goal, goal_radius=0.75)
    np.testing.assert_array_equal(default.terminals, distance <= 0.5 + 1e-6)
    np.testing.assert_array_equal(wide.terminals, distance <= 0.75 + 1e-6)
    assert wide.terminals.sum() > default.terminals.sum() >= 3
    np.testing.assert_array_equal(wide.rewards, wide.terminals.astype(np.float32))
    tagged = goal_conditioned(data, [goal], (17.0, 17.0), goal_radius=0.75)
    np.testing.assert_array_equal(tagged.terminals, wide.terminals)


def test_ant_maze_data_relabelled_for_another_goal(tmp_path):
    """An Ant maze dataset relabelled for a goal other than the env's: terminals where the next
    torso position is within the radius, and the observations' goal offset rewritten for the
    new goal, both computed here from the raw observations; goal-conditioned copies carry the
    goal scaled over the maze's extent."""
    from myriad.datasets import load
    from myriad.pretrain import pretrain

    run = tmp_path / "run"
    overrides = ["env=antmaze_u", "num_envs=16", "num_steps=16", "iterations=2"]
    overrides += ["population.size=2", "progress=false", "plots=false", "tensorboard=false"]
    pretrain(overrides, run_dir=run, quiet=True)
    data = load(run / "dataset" / "transitions.hdf5")
    goal, radius = (-4.0, 4.0), 0.75  # the start cell: random motion reaches it often
    got = relabel(data, "sparse", goal, goal_radius=radius)
    reached = np.linalg.norm(data.next_observations[:, :2] - np.asarray(goal), axis=1) <= radius
    assert reached.sum() >= 10 and (~reached).sum() >= 10
    np.testing.assert_array_equal(got.terminals, reached)
    np.testing.assert_array_equal(got.rewards, reached.astype(np.float32))
    for key in ("observations", "next_observations"):
        before, after = getattr(data, key), getattr(got, key)
        np.testing.assert_array_equal(after[:, :-2], before[:, :-2])
        np.testing.assert_allclose(after[:, -2:], np.asarray(goal) - before[:, :2], atol=1e-6)
        # The recorded offset was to the env's own goal, the far end of the U.
        np.testing.assert_allclose(before[:, -2:], (-4.0, -4.0) - before[:, :2], atol=1e-5)
    tagged = goal_conditioned(data, [goal], (20.0, 20.0), goal_radius=radius, origin=(-10, -10))
    np.testing.assert_allclose(
        tagged.observations[:, -2:], np.broadcast_to([-0.4, 0.4], (len(data), 2))
    )
    np.testing.assert_array_equal(tagged.terminals, reached)


def test_relabel_refuses_non_nav_env():
    rows = make_rows([3], raw_bits=False)
    data = TransitionData.from_rows(rows, spec_of(rows))
    with pytest.raises(Exception, match="unit-test"):
        relabel(data, "sparse")


def test_info_coverage_matches_reference(tmp_path):
    data = nav_rollout("sparse", (15.5, 1.5))
    w = D4RLWriter(tmp_path / "d.hdf5", 4, 2, ("x", "y"), metadata=data.metadata)
    w.append(data.rows())
    w.close()
    info = dataset_info(tmp_path / "d.hdf5", chunk_rows=100)
    env = make("nav-maze", 1, "cpu", **NAV_OPTIONS)
    ref = env.features.coverage(
        torch.as_tensor(data.features), torch.as_tensor(data.member).long(), num_groups=2
    )
    assert info["coverage_union"] == pytest.approx(ref.union)
    assert [info["members"][m]["coverage"] for m in (0, 1)] == pytest.approx(ref.per_group.tolist())
    assert info["steps"] == len(data) and info["episodes"] == len(data.episode_ends())
    assert info["feature_ranges"]["x"][0] == pytest.approx(float(data.features[:, 0].min()))


@pytest.mark.skipif(not available("d3rlpy"), reason="d3rlpy not installed (offline extra)")
def test_d3rlpy_conversion_keeps_every_transition(tmp_path):
    from myriad.datasets import to_d3rlpy

    data = nav_rollout("sparse", (1.5, 13.5), steps=60, num_envs=4)
    data.timeouts[-1] = ~data.terminals[-1]
    plain = to_d3rlpy(data, vectorised_sampling=False)
    assert plain.transition_count == len(data)
    ends = data.episode_ends()
    assert len(plain.episodes) == len(ends)
    picker = plain.transition_picker
    row = 0
    for episode in plain.episodes:
        for t in range(episode.transition_count):
            tr = picker(episode, t)
            np.testing.assert_array_equal(tr.observation, data.observations[row])
            np.testing.assert_array_equal(tr.action, data.actions[row])
            assert tr.reward[0] == data.rewards[row]
            assert bool(tr.terminal) == bool(data.terminals[row])
            if not data.terminals[row]:
                np.testing.assert_array_equal(tr.next_observation, data.next_observations[row])
            row += 1
    assert row == len(data)
    fast = to_d3rlpy(data)
    np.random.seed(0)
    batch = fast.sample_transition_batch(64)
    np.random.seed(0)
    rows = np.random.randint(len(data), size=64)  # the draw the sampler made
    np.testing.assert_array_equal(batch.observations, data.observations[rows])
    np.testing.assert_array_equal(batch.actions, data.actions[rows])
    np.testing.assert_array_equal(batch.rewards[:, 0], data.rewards[rows])
    np.testing.assert_array_equal(batch.terminals[:, 0], data.terminals[rows])
    live = ~data.terminals[rows]
    np.testing.assert_array_equal(batch.next_observations[live], data.next_observations[rows][live])
    assert (batch.next_observations[~live] == 0).all()


@pytest.mark.skipif(not available("d3rlpy"), reason="d3rlpy not installed (offline extra)")
def test_d3rlpy_import_drops_only_gyms_notice():
    import subprocess
    import sys

    from myriad.datasets.d3rlpy_adapter import without_gym_notice

    plain = subprocess.run(
        [sys.executable, "-c", "import d3rlpy"], capture_output=True, text=True, check=True
    ).stderr
    code = "from myriad.datasets import import_d3rlpy; print(import_d3rlpy().__name__)"
    ours = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
    )
    assert ours.stdout.strip() == "d3rlpy"
    if "gym" in plain.lower():  # the installed gym prints its notice on import
        assert "gym" not in ours.stderr.lower()
    assert ours.stderr == without_gym_notice(plain)
    other = "UserWarning: something else\n"
    assert without_gym_notice(other) == other


def test_load_relabels_on_the_fly(tmp_path):
    data = nav_rollout("sparse", (1.5, 13.5))
    plain = TransitionData(**{**data.__dict__, "terminals": np.zeros_like(data.terminals)})
    plain.timeouts = data.timeouts | data.terminals
    w = D4RLWriter(tmp_path / "d.hdf5", 4, 2, ("x", "y"), metadata=data.metadata)
    w.append(plain.rows())
    w.close()
    got = load(tmp_path / "d.hdf5", task="sparse", goal=(1.5, 13.5), chunk_rows=13)
    np.testing.assert_array_equal(got.terminals, data.terminals)
    assert "sparse" in got.metadata["reward"]
