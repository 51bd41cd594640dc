"""K-Myriad pretraining: config checks, the run folder, the dataset, exact resume, objectives."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from conftest import TINY_PRETRAIN

from myriad.datasets import read_d4rl
from myriad.distributed import make_distributed
from myriad.pretrain import pretrain
from myriad.pretrain.api import resolve_config
from myriad.pretrain.runner import PretrainRunner
from myriad.utils.checkpoint import ConfigMismatchError
from myriad.utils.config import ConfigError


def _run(tmp_path: Path, extra: list[str] = (), name: str = "run") -> dict:
    return pretrain([*TINY_PRETRAIN, *extra], run_dir=tmp_path / name, quiet=True)


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        (["num_envs=8", "population.size=16"], "larger than num_envs=8"),
        (["num_envs=100", "population.size=8"], "use num_envs=96 or 104"),
        (["num_envs=16", "num_steps=2", "population.size=8", "objective.k=4"], "lower objective.k"),
    ],
)
def test_bad_population_layouts_name_the_fix(tmp_path, overrides, match):
    with pytest.raises(ConfigError, match=match):
        pretrain([*TINY_PRETRAIN, *overrides], run_dir=tmp_path / "bad", quiet=True)


def test_unknown_override_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match=r"env: .*maze"):
        pretrain(["env=no_such_env"], run_dir=tmp_path / "x", quiet=True)


def test_run_folder_contents(tiny_pretrain):
    summary, run = tiny_pretrain.summary, tiny_pretrain.path
    assert (run / "config.yaml").is_file()
    assert sorted(p.name for p in (run / "checkpoints").iterdir())[-1] == "iter_000004.pt"
    assert list(run.glob("events.out.tfevents.*"))
    assert (run / "plots" / "coverage_map.png").is_file()
    assert (run / "plots" / "entropy_coverage.png").is_file()
    saved = json.loads((run / "summary.json").read_text())
    for key in (
        "entropy/collective",
        "entropy/diversity",
        "coverage/union",
        "perf/knn_share",
        "diversity/pairwise_kl_mean",
        "eval_coverage_union",
    ):
        assert key in saved, key
    assert 0 < saved["perf/knn_share"] < 1
    assert summary["dataset"].endswith("transitions.hdf5")


def test_dataset_is_episode_contiguous_and_consistent(tiny_pretrain):
    data = read_d4rl(tiny_pretrain.path / "dataset" / "transitions.hdf5")
    n = len(data["observations"])
    # Every transition collected is written once: 4 iterations x 16 steps x 64 envs.
    assert n == 4 * 16 * 64
    ends = data["terminals"] | data["timeouts"]
    within = ~ends[:-1]
    np.testing.assert_array_equal(
        data["next_observations"][:-1][within], data["observations"][1:][within]
    )
    members = data["infos"]["member"]
    assert set(np.unique(members)) == {0, 1, 2, 3}
    # An episode never changes member.
    assert (members[1:][within] == members[:-1][within]).all()
    # infos/x, y are the features of the observation's state: here the position that the
    # observation encodes as 2 * x / W - 1.
    width = 13.0
    np.testing.assert_allclose(
        data["infos"]["x"], (data["observations"][:, 0] + 1) * width / 2, atol=1e-4
    )
    assert data["metadata"]["population_size"] == 4


def test_resume_is_exact(tmp_path, tiny_pretrain):
    straight = tiny_pretrain.path
    cfg = resolve_config([*TINY_PRETRAIN, "iterations=2"])
    runner = PretrainRunner(cfg, tmp_path / "split")
    runner.learn(2)
    runner.close()
    pretrain(["iterations=4"], resume=tmp_path / "split", quiet=True)
    a = torch.load(straight / "checkpoints" / "iter_000004.pt", weights_only=True)
    b = torch.load(tmp_path / "split" / "checkpoints" / "iter_000004.pt", weights_only=True)
    for key, value in a["state"]["model"].items():
        assert torch.equal(value, b["state"]["model"][key]), key
    da = read_d4rl(straight / "dataset" / "transitions.hdf5")
    db = read_d4rl(tmp_path / "split" / "dataset" / "transitions.hdf5")
    columns = {k: v for k, v in da.items() if k != "metadata"}
    columns.update({f"infos/{k}": v for k, v in columns.pop("infos").items()})
    assert {"next_observations", "infos/member"} <= set(columns) and len(da["observations"]) > 0
    for key, value in columns.items():  # every column, infos and next observations included
        other = db["infos"][key[6:]] if key.startswith("infos/") else db[key]
        np.testing.assert_array_equal(value, other, err_msg=key)


def test_resume_with_another_config_lists_differences(tmp_path, tiny_pretrain):
    run = tiny_pretrain.copy(tmp_path / "run")
    with pytest.raises(ConfigMismatchError, match=r"objective\.beta"):
        pretrain(["objective.beta=0.5", "iterations=6"], resume=run, quiet=True)


@pytest.mark.parametrize("beta", [1.0, 0.5])  # 0.5: the per-member (individual) terms too
def test_importance_weighted_objective_respects_trust_region(tmp_path, beta):
    overrides = ["objective=mepol", "objective.kl_threshold=0.05", f"objective.beta={beta}"]
    summary = _run(tmp_path, overrides, name="mepol")
    assert summary["train/kl"] <= 0.05 + 1e-6
    assert summary["train/inner_steps"] >= 1


def test_single_policy_baseline_runs(tmp_path):
    summary = _run(tmp_path, ["population.size=1"], name="single")
    assert "diversity/pairwise_kl_mean" not in summary
    assert summary["entropy/diversity"] == pytest.approx(0.0, abs=1e-6)


def test_pretraining_raises_entropy_and_coverage(tmp_path):
    """A short K-Myriad run on four rooms: the population's collective entropy and cumulative
    union coverage grow clearly from the first rollout."""
    cfg = resolve_config(
        [
            "env=four_rooms",
            "num_envs=256",
            "num_steps=32",
            "population.size=4",
            "progress=false",
            "dataset.enabled=false",
        ]
    )
    runner = PretrainRunner(cfg, tmp_path / "learn")
    runner.learn(25)
    history = runner.logger.history
    runner.close()
    entropy = [v for _, v in history["entropy/collective"]]
    diversity = [v for _, v in history["entropy/diversity"]]
    assert np.mean(entropy[-5:]) > entropy[0] + 0.3
    assert abs(diversity[0]) < 0.1 and np.mean(diversity[-5:]) > 0.3
    assert history["coverage/cumulative_union"][-1][1] > 0.9


def test_pretraining_runs_on_ray_workers_through_config(tmp_path):
    """`distributed=local` puts the envs in Ray workers behind the same VecEnv; the run and its
    dataset are complete."""
    ray = pytest.importorskip("ray")
    try:
        summary = pretrain(
            [*TINY_PRETRAIN, "iterations=2", "checkpoint_every=0", "distributed=local"],
            run_dir=tmp_path / "ray",
            quiet=True,
            remote_envs=make_distributed,
        )
    finally:
        ray.shutdown()
    assert summary["env_steps"] == 2 * 16 * 64
    assert len(read_d4rl(summary["dataset"])["observations"]) == 2 * 16 * 64


def test_run_on_ray_workers_with_the_aps_settings_of_earlier_versions_resumes(tmp_path):
    """Run folders of earlier versions hold `distributed.aps`, which no command reads: such a
    run resumes. (Without its dataset: resuming on Ray workers from a checkpoint written before
    the run finished stops in the dataset's episode tracking, with or without the key.)"""
    ray = pytest.importorskip("ray")
    cfg = resolve_config(
        [*TINY_PRETRAIN, "iterations=1", "distributed=local", "dataset.enabled=false"]
    )
    cfg["distributed"]["aps"] = {"delta": 0.01, "horizon": 64, "max_lag": None}
    try:
        runner = PretrainRunner(cfg, tmp_path / "old", remote_envs=make_distributed)
        runner.learn(1)
        runner.close()
        runner.env.close()  # its workers hold the CPUs that the resumed run's workers need
        summary = pretrain(
            ["iterations=2"], resume=tmp_path / "old", quiet=True, remote_envs=make_distributed
        )
    finally:
        ray.shutdown()
    assert summary["env_steps"] == 2 * 16 * 64
    saved = yaml.safe_load((tmp_path / "old" / "config.yaml").read_text())
    assert saved["distributed"]["aps"]["horizon"] == 64


def test_distributed_presets_hold_only_what_the_commands_read():
    """The commands run central inference: a run config's `distributed` section is where Ray
    runs and the workers, and an `aps` override is refused (it would change nothing)."""
    for preset in ("local", "cluster"):
        cfg = resolve_config([*TINY_PRETRAIN, f"distributed={preset}"])
        assert set(cfg["distributed"]) == {"ray", "workers"}
    with pytest.raises(ConfigError, match="aps"):
        resolve_config([*TINY_PRETRAIN, "distributed=local", "distributed.aps.delta=0.1"])


def test_entropy_measurement_against_brute_force_per_member():
    """Collective / individual entropies and the reward of a rollout ``[T, E, p]`` whose two
    members (env blocks 0-3 and 4-7) explore differently, against brute-force neighbours found
    by member directly from the env index."""
    from myriad.entropy.estimators import kl_entropy_from_distances
    from myriad.pretrain.objectives import EntropyMeasurement

    t, e, p, k, members = 16, 8, 2, 3, 2
    gen = torch.Generator().manual_seed(0)
    features = torch.randn(t, e, p, generator=gen, dtype=torch.float64)
    features[:, 4:] = 3.0 * features[:, 4:] + torch.tensor([20.0, -5.0], dtype=torch.float64)
    m = EntropyMeasurement(k, members, p)(features.float())

    std = features.reshape(-1, p).std(dim=0, unbiased=False)
    scaled = features / std
    torch.testing.assert_close(m.log_scale, float(torch.log(std).sum()), rtol=1e-4, atol=1e-4)

    def kth(points: torch.Tensor, queries: torch.Tensor) -> torch.Tensor:
        d = (queries[:, None, :] - points[None, :, :]).norm(dim=-1)  # exact: self is 0
        d[d == 0] = float("inf")  # the query itself (no duplicates in continuous data)
        return d.sort(dim=1).values[:, k - 1]

    pooled = scaled.reshape(-1, p)
    blocks = [scaled[:, :4].reshape(-1, p), scaled[:, 4:].reshape(-1, p)]
    log_scale = float(torch.log(std).sum())
    h_coll = float(kl_entropy_from_distances(kth(pooled, pooled), p, k)) + log_scale
    h_ind = [float(kl_entropy_from_distances(kth(b, b), p, k)) + log_scale for b in blocks]
    assert float(m.collective) == pytest.approx(h_coll, abs=1e-3)
    assert m.individual.tolist() == pytest.approx(h_ind, abs=1e-3)
    assert h_ind[1] > h_ind[0] + 2.0  # member 1's cloud is 3x wider: the layout matters

    beta, c = 0.5, 1.0
    reward = m.reward(beta, c)  # [T, E]
    assert reward.shape == (t, e)
    for env in (0, 5):
        block = blocks[env // 4]
        q = scaled[:, env]  # [T, p]
        expected = beta * torch.log(c + kth(pooled, q)) + (1 - beta) * torch.log(c + kth(block, q))
        torch.testing.assert_close(reward[:, env].double(), expected, rtol=1e-4, atol=1e-4)
