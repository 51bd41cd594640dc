"""Pretraining sharded over two torchrun ranks (gloo on CPU, 127.0.0.1 only).

Two launches: ``torchrun -m myriad pretrain`` (the user's command) runs the tiny pretraining of
the suite over two ranks; this file, run by torchrun as a script, checks on two ranks that the
sharded measurement and PPO update equal one process's on the same data, then resumes a copy of
the first run from its middle checkpoint through the command line.
"""

from __future__ import annotations

import copy
import json
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import (
    TINY_PRETRAIN,
    assert_same_training,
    finish_launch,
    kill_launch,
    rank_env,
    run_launch,
)

from myriad.cli import main
from myriad.datasets import load
from myriad.datasets.hdf5 import read_d4rl
from myriad.distributed.torchdist import (
    GradientAverager,
    RankEntropyMeasurement,
    RankGroup,
    check_launch,
    launched_world_size,
    replica_difference,
)
from myriad.distributed.torchdist.sync import share_normalizers
from myriad.nn.population import PopulationActorCritic, block_members
from myriad.pretrain import pretrain
from myriad.pretrain.api import resolve_config
from myriad.pretrain.objectives import EntropyMeasurement
from myriad.rl.ppo import PPO, PPOConfig
from myriad.rl.storage import RolloutStorage
from myriad.utils.config import ConfigError

#: The suite's tiny pretraining (tests/conftest.py), without plots.
TINY = (*TINY_PRETRAIN, "plots=false")

#: |2 ranks - 1 process| allowed for the mean over the run's iterations of the collective entropy
#: (nats) and of the rollout's union coverage. The two runs draw different random numbers (each
#: rank resets and samples with its own stream; see docs/distributed.md), so they agree as two
#: seeds do: over seeds 0-7 of this config the largest same-seed difference was 0.18 nats and
#: 0.024, the one-process means' standard deviations 0.046 and 0.011
#: (benchmarks/results/torchdist_agreement.json). Measuring half the population instead of all
#: of it would move the entropy by about log 2 and halve the union coverage.
ENTROPY_TOLERANCE = 0.2
COVERAGE_TOLERANCE = 0.03


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _torchrun(*args: str) -> subprocess.CompletedProcess[str]:
    """Two ranks on this machine, rendezvous on a free port of 127.0.0.1."""
    env = rank_env()
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node=2",
        "--master_addr=127.0.0.1",
        f"--master_port={_free_port()}",
        *args,
    ]
    done = run_launch(command, env)
    # The ranks' own tracebacks (torchrun's report of the failure follows them).
    ranks = [line for line in done.stderr.splitlines() if line.startswith("[rank")]
    assert done.returncode == 0, "\n".join(ranks[-60:]) or done.stderr[-3000:]
    return done


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny pretraining over two ranks, launched as a user would."""
    run = tmp_path_factory.mktemp("torchdist") / "two_ranks"
    _torchrun("-m", "myriad", "pretrain", "--run-dir", str(run), *TINY)
    return run


def _checkpoint(run: Path, iteration: int) -> dict:
    return torch.load(run / "checkpoints" / f"iter_{iteration:06d}.pt", weights_only=True)


def _history(run: Path, key: str) -> list[float]:
    return [v for _, v in _checkpoint(run, 4)["logger"]["history"][key]]


def test_two_ranks_agree_with_one_process(two_ranks, tmp_path):
    one = tmp_path / "one"
    summary = pretrain(list(TINY), run_dir=one, quiet=True)
    two = json.loads((two_ranks / "summary.json").read_text())
    assert two["env_steps"] == summary["env_steps"] == 4 * 16 * 64
    for key, tolerance in (
        ("entropy/collective", ENTROPY_TOLERANCE),
        ("coverage/union", COVERAGE_TOLERANCE),
    ):
        a, b = _history(one, key), _history(two_ranks, key)
        assert len(a) == len(b) == 4
        assert abs(np.mean(a) - np.mean(b)) < tolerance, (key, a, b)
    # Every member's entropy is reported (the ranks' members are gathered), on the same scale.
    assert {f"entropy/member_{i}" for i in range(4)} <= set(two["scalars"])


def test_checkpoint_and_dataset_load_in_one_process(two_ranks, tmp_path, capsys):
    for iteration in (2, 4):
        payload = _checkpoint(two_ranks, iteration)
        assert payload["world_size"] == 2
        assert payload["replica_max_abs_diff"] == 0.0  # the ranks' models are identical
        assert len(payload["state"]["collector"]["ranks"]) == 2
    data = load(two_ranks)
    assert len(data.observations) == 4 * 16 * 64  # every step of both ranks, written once
    assert np.bincount(np.asarray(data.member)).tolist() == [1024] * 4
    # One process can start finetuning from the population...
    run = tmp_path / "finetune"
    args = ["finetune", "--algo", "cpo", "--init", str(two_ranks), "--run-dir", str(run)]
    tiny = ["env=four_rooms", "env.options.max_episode_steps=20", "num_envs=16", "num_steps=8"]
    quick = ["iterations=1", "ppo.minibatches=1", "init.episodes=2", "init.critic_warmup=0"]
    quick += ["eval.every=0", "eval.final_episodes=1", "diagnostics.states_per_member=16"]
    assert main([*args, *tiny, *quick, "plots=false", "progress=false"]) == 0
    assert (run / "checkpoints" / "iter_000001.pt").is_file()
    # ...but continuing the run needs its two ranks back: one line saying so.
    copy_ = shutil.copytree(two_ranks, tmp_path / "copy")
    capsys.readouterr()
    assert main(["pretrain", "--resume", str(copy_), "iterations=6"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "written by 2 process(es)" in err and "--nproc_per_node=2" in err


def test_sharded_maths_equal_one_process_and_resume_is_exact(two_ranks, tmp_path):
    split = shutil.copytree(two_ranks, tmp_path / "split")
    (split / "checkpoints" / "iter_000004.pt").unlink()
    (split / "summary.json").unlink()
    report = tmp_path / "agreement.json"
    _torchrun(str(Path(__file__).resolve()), str(split), str(report))
    # On the same data the ranks compute what one process computes (float rounding apart).
    result = json.loads(report.read_text())
    assert result["entropy_difference"] < 1e-9
    assert result["reward_difference"] < 1e-6
    assert result["parameter_difference"] < 1e-5
    assert result["replica_difference"] == 0.0
    assert result["lr_equal"]
    assert result["sums_equal"]
    # The resumed run equals the uninterrupted one: weights, scalars and dataset.
    a, b = _checkpoint(two_ranks, 4), _checkpoint(split, 4)
    assert_same_training(a, b)
    da = read_d4rl(two_ranks / "dataset" / "transitions.hdf5")
    db = read_d4rl(split / "dataset" / "transitions.hdf5")
    for key in ("observations", "actions", "next_observations", "rewards", "terminals"):
        np.testing.assert_array_equal(da[key], db[key], err_msg=key)
    np.testing.assert_array_equal(da["infos"]["member"], db["infos"]["member"])


def test_two_node_agents_with_a_rendezvous_endpoint_equal_one_node(two_ranks, tmp_path):
    """The multi-node launch (docs/distributed.md): two torchrun agents, one rank each, meeting at
    a c10d rendezvous endpoint, here both on 127.0.0.1. Every rank's streams follow its global
    rank, so the run equals the two ranks of one agent bit for bit."""
    env = rank_env()
    run, port = tmp_path / "two_nodes", _free_port()
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes=2",
        "--nproc_per_node=1",
        "--rdzv_id=two-nodes",
        "--rdzv_backend=c10d",
        f"--rdzv_endpoint=127.0.0.1:{port}",
        "-m",
        "myriad",
        "pretrain",
        "--run-dir",
        str(run),
        *TINY,
    ]
    agents = [
        subprocess.Popen(
            command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    try:
        outputs = [finish_launch(agent) for agent in agents]
    finally:
        for agent in agents:  # the other node's agent and ranks, where one launch failed
            if agent.poll() is None:
                kill_launch(agent)
    for agent, (_, err) in zip(agents, outputs):
        assert agent.returncode == 0, err[-3000:]
    a, b = _checkpoint(two_ranks, 4), _checkpoint(run, 4)
    assert b["world_size"] == 2
    assert_same_training(a, b)


def test_layouts_that_do_not_shard_are_refused_in_one_line():
    cfg = resolve_config(list(TINY))
    check_launch(cfg, 2)
    check_launch(cfg, 4)
    with pytest.raises(ConfigError, match=r"population.size=4 does not split over 3") as info:
        check_launch(cfg, 3)
    assert "\n" not in str(info.value)
    with pytest.raises(ConfigError, match="objective=mepol runs in one process only"):
        check_launch(resolve_config([*TINY, "objective=mepol"]), 2)
    assert launched_world_size({}) == 1
    assert launched_world_size({"WORLD_SIZE": "2"}) == 2
    with pytest.raises(ConfigError, match="WORLD_SIZE"):
        launched_world_size({"WORLD_SIZE": "two"})
    with pytest.raises(ConfigError, match="torchrun"):
        RankGroup.launch("cpu", {"WORLD_SIZE": "2"})


def test_a_rank_without_torchrun_is_refused_in_one_line(monkeypatch, capsys):
    # WORLD_SIZE alone (no torchrun): finetuning, sharded like pretraining, says how to launch.
    monkeypatch.setenv("WORLD_SIZE", "2")
    for var in ("RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(var, raising=False)
    assert main(["finetune", "--algo", "ppo"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "start the ranks with torchrun" in err


# ------------------------------------------------------------------ run by torchrun as a script


def _measurement_difference(ranks: RankGroup) -> tuple[float, float]:
    """Largest differences of the entropies and of this rank's rewards between the sharded and
    the one-process measurement of the same features."""
    steps, envs, members, dim, k = 8, 32, 4, 2, 3
    g = torch.Generator().manual_seed(0)
    features = torch.randn(steps, envs, dim, generator=g) * torch.tensor([1.0, 3.0])
    features[:, :8] += 4.0  # member 0 apart from the others
    one = EntropyMeasurement(k, members, dim)(features)
    mine = ranks.env_shard(envs, members)
    sharded = RankEntropyMeasurement(ranks, mine, k, members, dim)(features)
    entropy = max(
        abs(float(one.collective - sharded.collective)),
        float((one.individual - sharded.individual).abs().max()),
    )
    reward = max(
        float((one.reward(beta, 1.0)[:, mine] - sharded.reward(beta, 1.0)).abs().max())
        for beta in (0.0, 0.5, 1.0)
    )
    return entropy, reward


def _columns(storage: RolloutStorage, envs: slice) -> RolloutStorage:
    """The rollout of the envs ``envs`` of ``storage``."""
    out = RolloutStorage(
        storage.num_steps,
        storage.member[envs],
        storage.obs_dim,
        storage.action_dim,
        num_members=storage.num_members,
    )
    for name in ("obs", "actions", "log_probs", "values", "rewards", "truncation_values"):
        getattr(out, name).copy_(getattr(storage, name)[:, envs])
    for name in ("terminated", "truncated", "dones", "means", "log_stds"):
        getattr(out, name).copy_(getattr(storage, name)[:, envs])
    out.last_values.copy_(storage.last_values[envs])
    out.step = storage.num_steps
    return out


def _update_difference(ranks: RankGroup) -> tuple[float, float, bool]:
    """PPO on the whole rollout in one process against PPO on each rank's envs with averaged
    gradients: largest parameter / normaliser difference, replica difference, and whether every
    rank's adaptive learning rate equals the one process's."""
    torch.manual_seed(0)
    steps, envs, members, obs_dim = 16, 32, 4, 3
    model = PopulationActorCritic(obs_dim, 2, members, actor_hidden=(16,), critic_hidden=(16,))
    member = block_members(envs, members)
    storage = RolloutStorage(steps, member, obs_dim, 2, num_members=members)
    g = torch.Generator().manual_seed(1)
    for _ in range(steps):
        obs = torch.randn(envs, obs_dim, generator=g)
        out = model.act(obs, member, g, blocked=True)
        done = torch.rand(envs, generator=g) < 0.1
        storage.add(
            obs=obs,
            actions=out.actions,
            log_prob=out.log_prob,
            value=out.value,
            reward=torch.randn(envs, generator=g),
            terminated=done,
            truncated=torch.zeros_like(done),
            mean=out.mean,
            log_std=out.log_std,
        )
    with torch.no_grad():
        storage.last_values.copy_(model.value(torch.randn(envs, obs_dim, generator=g), member))
    config = PPOConfig(epochs=3, minibatches=1, lr=1e-3, desired_kl=0.002)
    reference = copy.deepcopy(model)
    reference_ppo = PPO(reference, config)
    reference_ppo.update(copy.deepcopy(storage))
    sharded = copy.deepcopy(model)
    share_normalizers(sharded, ranks)
    ppo = PPO(sharded, config)
    ppo.grad_sync = GradientAverager(ranks, ppo.parameters)
    ppo.update(_columns(storage, ranks.env_shard(envs, members)))
    ref_state, state = reference.state_dict(), sharded.state_dict()
    difference = max(float((ref_state[k] - state[k]).abs().max()) for k in ref_state)
    lr = torch.tensor([ppo.lr], dtype=torch.float64)
    lr_equal = bool((ranks.all_gather_cat(lr) == reference_ppo.lr).all())
    return difference, replica_difference(sharded, ranks), lr_equal


def _sums_equal(ranks: RankGroup) -> bool:
    """Whether :meth:`RankGroup.all_reduce_`'s sums (from an all-gather up to
    ``GATHERED_SUM_LIMIT`` elements on two ranks, an all-reduce above) equal the sum of every
    rank's tensor computed here from the seeds, for float32, float64 and int64 tensors on both
    paths."""
    from myriad.distributed.torchdist.group import GATHERED_SUM_LIMIT

    equal = True
    # Exact: two ranks' sums are one addition on either path.
    for numel in (7, GATHERED_SUM_LIMIT + 1):
        for dtype in (torch.float32, torch.float64, torch.int64):
            tensors = [
                (torch.randn(numel, generator=torch.Generator().manual_seed(r)) * 100).to(dtype)
                for r in range(ranks.world_size)
            ]
            expected = tensors[0].clone()
            for other in tensors[1:]:
                expected += other
            mine = tensors[ranks.rank].clone()
            equal &= bool(torch.equal(ranks.all_reduce_(mine), expected))
    return equal


def _absent_gradients(ranks: RankGroup) -> bool:
    """Whether :class:`GradientAverager` leaves a parameter without a gradient on every rank
    without one (as one process's optimiser sees it) and averages one that only rank 0 has."""
    nowhere, rank0_only, everywhere = (torch.nn.Parameter(torch.ones(3)) for _ in range(3))
    loss = (everywhere * (ranks.rank + 1.0)).sum()
    if ranks.rank == 0:
        loss = loss + (rank0_only * 2.0).sum()
    loss.backward()
    stats = {"kl": torch.tensor(float(ranks.rank))}
    GradientAverager(ranks, [nowhere, rank0_only, everywhere])(stats)()
    mean_rank = (ranks.world_size + 1) / 2
    return (
        nowhere.grad is None
        and rank0_only.grad is not None
        and bool(torch.equal(rank0_only.grad, torch.full((3,), 2.0 / ranks.world_size)))
        and everywhere.grad is not None
        and bool(torch.equal(everywhere.grad, torch.full((3,), mean_rank)))
        and float(stats["kl"]) == (ranks.world_size - 1) / 2
    )


def _rank_main(run: str, report: str) -> int:
    ranks = RankGroup.launch("cpu")
    sums_equal = _sums_equal(ranks) and _absent_gradients(ranks)
    entropy, reward = _measurement_difference(ranks)
    parameters, replicas, lr_equal = _update_difference(ranks)
    worst = ranks.all_reduce_(torch.tensor([entropy, reward, parameters]), op="max").tolist()
    if ranks.is_writer:
        Path(report).write_text(
            json.dumps(
                {
                    "entropy_difference": worst[0],
                    "reward_difference": worst[1],
                    "parameter_difference": worst[2],
                    "replica_difference": replicas,
                    "lr_equal": lr_equal,
                    "sums_equal": sums_equal,
                }
            )
        )
    # The launch's process group carries on into the resumed run (which closes it).
    return main(["pretrain", "--resume", run, "iterations=4"])


if __name__ == "__main__":
    raise SystemExit(_rank_main(sys.argv[1], sys.argv[2]))


def test_a_failed_wait_counts_as_a_collective_lost_to_another_rank(monkeypatch):
    from myriad.utils.launch import CollectiveFailed, lost_in_collective

    monkeypatch.setenv("WORLD_SIZE", "2")
    assert lost_in_collective(CollectiveFailed("[pair.cc:553] Connection closed by peer"))
    assert not lost_in_collective(RuntimeError("an error of the run itself"))
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert not lost_in_collective(CollectiveFailed("not a rank of a launch"))


def test_ray_env_workers_and_ranks_are_refused_for_both_stages():
    from myriad.distributed.torchdist.finetune import check_finetune_launch
    from myriad.distributed.torchdist.pretrain import check_launch
    from myriad.utils.config import compose

    pre = compose("pretrain", ["distributed=local"])
    fine = compose("finetune", ["algo=cpo", "distributed=local"])
    for check, cfg in ((check_launch, pre), (check_finetune_launch, fine)):
        with pytest.raises(ConfigError, match="torchrun ranks do not combine"):
            check(cfg, 2)
