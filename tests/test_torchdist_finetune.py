"""Finetuning sharded over two torchrun ranks (gloo on CPU, 127.0.0.1 only).

Three launches: ``torchrun -m myriad finetune --init`` (the user's command) runs a tiny CPO over
two ranks from a pretrained population; this file, run by torchrun as a script, checks on two
ranks that the gathered rollout is the one-process rollout bit for bit and that CPO's update on it
equals one process's, then resumes a copy of the first run from its middle checkpoint through the
command line; and PPO (one policy, its envs split over the ranks) on an easy task is compared with
a one-process run. In this process, one rank drawing the run's random streams reproduces a
one-process run of every algorithm bit for bit.
"""

from __future__ import annotations

import copy
import json
import shutil
import socket
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import TINY_FINETUNE, assert_same_training, rank_env, run_launch

from myriad.cli import main
from myriad.distributed.torchdist import (
    RankGroup,
    check_finetune_launch,
    finetune_runner,
    gather_rollout,
    replica_difference,
    rollout_like,
)
from myriad.distributed.torchdist.rollout import COLLECTED
from myriad.distributed.torchdist.sync import GradientAverager
from myriad.finetune.algorithms import build_algorithm
from myriad.finetune.api import resolve_config
from myriad.finetune.runner import FinetuneRunner
from myriad.rl.collector import RolloutCollector
from myriad.rl.on_policy import PopulationSetup, population_setup
from myriad.rl.row_share import RowShare
from myriad.rl.storage import RolloutStorage
from myriad.utils.config import ConfigError
from myriad.utils.seeding import make_generator

#: CPO on the suite's tiny finetuning: 4 members over 16 envs, the dense task (non-zero returns).
TINY = (
    *TINY_FINETUNE,
    "num_envs=16",
    "population.size=4",
    "task=dense",
    "iterations=4",
    "plots=false",
    "tensorboard=false",
)

#: The agreement runs (benchmarks/torchdist_finetune_agreement.py measures them over seeds): the
#: open room with the dense task, where every seed learns within 10 iterations.
AGREEMENT: tuple[str, ...] = (
    "env=empty",
    "task=dense",
    "num_envs=64",
    "population.actor_hidden=[32]",
    "population.critic_hidden=[32]",
    "iterations=10",
    "eval.every=0",
    "eval.final_episodes=16",
    "checkpoint_every=0",
    "progress=false",
    "plots=false",
    "tensorboard=false",
)
AGREEMENT_ALGOS: dict[str, tuple[str, ...]] = {
    "ppo": ("population.size=1",),
    "cpo": ("population.size=4",),
    "sapg": ("population.size=4",),
    "pbt": ("population.size=4", "algo.interval=3"),
}

#: The algorithms whose update splits by rows (every coupling on: the set point, the
#: discriminator, the AWAC pull, the sampled off-policy loss; PBT's per-member clip and rates),
#: by label: the algorithm and its settings. CPO also with the off-policy clip around the
#: leader's own policy (its log-probabilities of each rank's planned rows).
SPLIT_ALGOS: dict[str, tuple[str, tuple[str, ...]]] = {
    "sapg": ("sapg", ()),
    "cpo": ("cpo", ("algo.kl_target=0.1",)),
    "cpo_leader_trust": ("cpo", ("algo.kl_target=0.1", "algo.off_policy_trust_region=leader")),
    "pbt": ("pbt", ("algo.interval=1",)),
}


#: |2 ranks - 1 process| allowed for PPO's mean training return over the last three of the 10
#: iterations of AGREEMENT, seed 0. The two runs draw different random numbers (each rank resets
#: and samples with its own stream, docs/distributed.md), so they agree as two seeds do; the
#: figures behind the value are in benchmarks/results/torchdist_finetune_agreement.json. An
#: update that learnt from half of the envs, or not at all, would be further off (the return
#: climbs from about -25 to about -14 over these iterations).
RETURN_TOLERANCE = 4.0


def collected_rollout(cfg: dict) -> tuple[PopulationSetup, RolloutStorage]:
    """The run's population and one collected rollout: every rank builds the same (the model
    is seeded by the config, the envs and actions by fixed generators)."""
    setup = population_setup(cfg)
    collector = RolloutCollector(
        setup.env,
        setup.model,
        setup.member,
        make_generator(2, setup.env.device),
        store_transitions=True,
    )
    storage = collector.make_storage(int(cfg["num_steps"]))
    collector.reset(3)
    collector.collect(storage)
    return setup, storage


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _launch(*args: str, ranks: int = 2, kill_at: str | None = None) -> None:
    """``ranks`` ranks (or, with 1, a plain process) on this machine; with ``kill_at`` the
    ranks run with ``MYRIAD_KILL_AT=kill_at`` and the launch must end killed."""
    env = rank_env()
    if kill_at is not None:
        env["MYRIAD_KILL_AT"] = kill_at
    launcher = [
        "torch.distributed.run",
        f"--nproc_per_node={ranks}",
        "--master_addr=127.0.0.1",
        f"--master_port={_free_port()}",
    ]
    command = [sys.executable, "-m", *launcher, *args] if ranks > 1 else [sys.executable, *args]
    done = run_launch(command, env)
    # The ranks' own tracebacks (torchrun's report of the failure follows them).
    lines = [line for line in done.stderr.splitlines() if line.startswith("[rank")]
    if kill_at is not None:
        assert done.returncode != 0, "the fault point was never reached"
        return
    assert done.returncode == 0, "\n".join(lines[-60:]) or done.stderr[-3000:]


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory: pytest.TempPathFactory, tiny_pretrain) -> Path:
    """The tiny CPO over two ranks, started from the suite's tiny pretraining (``--init``: the
    architecture is the pretrained one), launched as a user would."""
    run = tmp_path_factory.mktemp("torchdist_finetune") / "two_ranks"
    overrides = [o for o in TINY if not o.startswith(("population.actor", "population.critic"))]
    overrides += ["init.episodes=2", "init.critic_warmup=1"]
    args = ["finetune", "--algo", "cpo", "--init", str(tiny_pretrain.path), "--run-dir", str(run)]
    _launch("-m", "myriad", *args, *overrides)
    return run


def _checkpoint(run: Path, iteration: int) -> dict:
    return torch.load(run / "checkpoints" / f"iter_{iteration:06d}.pt", weights_only=True)


def test_checkpoint_loads_in_one_process(two_ranks, tmp_path, capsys):
    for iteration in (2, 4):
        payload = _checkpoint(two_ranks, iteration)
        assert payload["world_size"] == 2
        assert payload["replica_max_abs_diff"] == 0.0  # the ranks' models are identical
        assert len(payload["state"]["collector"]["ranks"]) == 2
    summary = json.loads((two_ranks / "summary.json").read_text())
    assert summary["env_steps"] == 4 * 8 * 16  # every env of both ranks, counted once
    history = payload["logger"]["history"]
    # Every member's episodes are summed over the ranks; CPO's couplings are logged per follower.
    assert {f"episode/return/member_{i}" for i in range(4)} <= set(history)
    assert {f"cpo/kl/follower_{i}" for i in (1, 2, 3)} <= set(history)
    assert len(history["eval/leader_success"]) == 2
    # --init ranked the pretrained members on both ranks alike; the first iteration fitted only
    # the fresh critics.
    assert sorted(payload["state"]["finetune"]["init"]["mapping"]) == [0, 1, 2, 3]
    assert [v for _, v in history["train/critic_only"]] == [1.0, 0.0, 0.0, 0.0]
    # One process renders the run...
    out = tmp_path / "videos"
    args = ["render", str(two_ranks), "--members", "1", "--max-steps", "3", "--out", str(out)]
    assert main([*args, "--format", "gif"]) == 0
    assert (out / "member_01.gif").is_file()
    # ...but continuing it needs its two ranks back: one line saying so.
    copy_ = shutil.copytree(two_ranks, tmp_path / "copy")
    capsys.readouterr()
    assert main(["finetune", "--resume", str(copy_), "iterations=6"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "written by 2 process(es)" in err and "--nproc_per_node=2" in err


def test_same_rollout_same_update_and_resume_is_exact(two_ranks, tmp_path):
    split = shutil.copytree(two_ranks, tmp_path / "split")
    (split / "checkpoints" / "iter_000004.pt").unlink()
    (split / "summary.json").unlink()
    report = tmp_path / "agreement.json"
    _launch(str(Path(__file__).resolve()), str(split), str(report))
    result = json.loads(report.read_text())
    # The gathered rollout is the one-process rollout; CPO's update on it is one process's.
    assert result["rollout_difference"] == 0.0
    assert result["parameter_difference"] == 0.0
    assert result["replica_difference"] == 0.0
    # The resumed run equals the uninterrupted one: weights, optimiser, scalars.
    a, b = _checkpoint(two_ranks, 4), _checkpoint(split, 4)
    assert_same_training(a, b)
    assert torch.equal(
        a["state"]["algorithm"]["discriminator"]["net"]["net.0.weight"],
        b["state"]["algorithm"]["discriminator"]["net"]["net.0.weight"],
    )


def test_killed_after_a_checkpoint_resumes_to_the_uninterrupted_run(
    two_ranks, tiny_pretrain, tmp_path
):
    """SIGKILL (the fault point, no timing) right after the first checkpoint of a two-rank run
    is written; resuming on two ranks ends where the uninterrupted launch ended."""
    run = tmp_path / "killed"
    overrides = [o for o in TINY if not o.startswith(("population.actor", "population.critic"))]
    overrides += ["init.episodes=2", "init.critic_warmup=1"]
    args = ["finetune", "--algo", "cpo", "--init", str(tiny_pretrain.path), "--run-dir", str(run)]
    _launch("-m", "myriad", *args, *overrides, kill_at="checkpoint.saved:1")
    assert sorted(p.name for p in (run / "checkpoints").glob("*.pt")) == ["iter_000002.pt"]
    assert not (run / "summary.json").exists()
    _launch("-m", "myriad", "finetune", "--resume", str(run))
    a, b = _checkpoint(two_ranks, 4), _checkpoint(run, 4)
    assert_same_training(a, b)


def test_two_ranks_agree_with_one_process(tmp_path):
    overrides = [*AGREEMENT, *AGREEMENT_ALGOS["ppo"], "seed=0"]
    returns = []
    for ranks in (1, 2):
        run = tmp_path / f"ranks{ranks}"
        _launch(
            "-m",
            "myriad",
            "finetune",
            "--algo",
            "ppo",
            "--run-dir",
            str(run),
            *overrides,
            ranks=ranks,
        )
        last = sorted((run / "checkpoints").glob("iter_*.pt"))[-1]
        history = torch.load(last, weights_only=True)["logger"]["history"]
        returns.append(float(np.mean([v for _, v in history["episode/return"][-3:]])))
        assert torch.load(last, weights_only=True)["world_size"] == ranks
    assert abs(returns[0] - returns[1]) < RETURN_TOLERANCE, returns


def test_ppo_update_splits_over_two_ranks(tmp_path):
    """PPO's update runs on each rank's own envs with averaged gradients and shared normalisers:
    the replicas stay identical, and the normalisers count every rank's rows once."""
    report = tmp_path / "split.json"
    _launch(str(Path(__file__).resolve()), "split-ppo", str(tmp_path / "run"), str(report))
    result = json.loads(report.read_text())
    assert result["split"] == [True, True]
    assert result["learns_from_own_rows"] == [True, True]
    assert result["replica_difference"] == 0.0
    assert result["parameter_change"] > 0.0  # it learnt
    # Two updates, each folding the 8 steps of all 16 envs (both ranks) into the statistics.
    assert result["obs_rows_folded"] == [2 * 8 * 16, 2 * 8 * 16]
    # Couplings across members: every rank learns from a share of the gathered rollout's rows.
    assert result["cpo_split"] == [True, True]


def test_split_update_is_the_one_process_update(tmp_path):
    """SAPG's, CPO's and PBT's updates split by rows over two ranks (each rank a half of every
    member's rows of each minibatch, the update-wide moments summed, the leader's log-probs,
    the AWAC advantages and the discriminator's bonuses gathered) compute one process's
    update of the same rollout: two updates agree to float rounding, and the replicas are
    identical."""
    report = tmp_path / "rows.json"
    _launch(str(Path(__file__).resolve()), "split-rows", str(report))
    result = json.loads(report.read_text())
    assert set(result) == set(SPLIT_ALGOS)
    for algo, figures in result.items():
        assert figures["replica_difference"] == 0.0, algo
        assert figures["parameter_change"] > 1e-4, algo  # the updates moved the weights
        # Sums of two halves against one sum, in float32: rounding, orders below the change.
        assert figures["parameter_difference"] < 1e-5, (algo, figures)
        assert figures["loss_difference"] < 1e-5, (algo, figures)
        assert figures["kl_difference"] < 1e-6, (algo, figures)


@pytest.mark.parametrize(
    ("algo", "extra"),
    [
        ("ppo", ("population.size=1",)),
        ("sapg", ()),
        ("cpo", ("algo.kl_target=0.1",)),
        ("pbt", ("algo.interval=1",)),
    ],
)
def test_one_rank_with_the_run_streams_is_one_process_exactly(monkeypatch, tmp_path, algo, extra):
    """The sharded runner differs from the one-process runner by its random streams only: one
    rank drawing the run's streams (every iteration gathered, evaluated on rank 0 and
    broadcast, episodes summed) reproduces a one-process run bit for bit."""
    cfg = resolve_config(algo, [*TINY, *extra, "iterations=3", "eval.every=1"])
    environ = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1"}
    for name, value in {**environ, "MASTER_PORT": str(_free_port())}.items():
        monkeypatch.setenv(name, value)
    ranks = RankGroup.launch("cpu")
    monkeypatch.setattr(RankGroup, "stream_seed", lambda self, seed: seed)
    runs = []
    try:
        for index, make in enumerate((FinetuneRunner, lambda c, d: finetune_runner(c, d, ranks))):
            runner = make(cfg, tmp_path / str(index))
            runner.learn(3)
            runs.append((runner.logger.history, runner.model.state_dict()))
            runner.close()
    finally:
        ranks.close()
    (history, weights), (sharded_history, sharded_weights) = runs
    for key, value in weights.items():
        assert torch.equal(value, sharded_weights[key]), key
    if algo == "pbt":
        assert sum(v for _, v in history["pbt/replaced"]) > 0  # members were replaced
    if algo == "cpo":
        assert "cpo/kl_in_band" in history  # the set point adapted the couplings
    for key, points in history.items():
        if not key.startswith("perf/"):
            assert points == sharded_history[key], key


def test_layouts_that_do_not_shard_are_refused_in_one_line():
    cfg = resolve_config("cpo", list(TINY))
    check_finetune_launch(cfg, 2)
    check_finetune_launch(cfg, 4)
    with pytest.raises(ConfigError, match=r"population.size=4 does not split over 3") as info:
        check_finetune_launch(cfg, 3)
    assert "\n" not in str(info.value)
    one = resolve_config("ppo", [*TINY, "population.size=1", "num_envs=18"])
    check_finetune_launch(one, 2)  # one policy: its envs split
    with pytest.raises(ConfigError, match=r"num_envs=18 does not split over 4"):
        check_finetune_launch(one, 4)


# ------------------------------------------------------------------ run by torchrun as a script


def _columns(storage: RolloutStorage, envs: slice) -> RolloutStorage:
    """The rollout of the envs ``envs`` of ``storage`` (every field a collector fills)."""
    out = rollout_like(storage, storage.member[envs])
    for name in COLLECTED:
        if getattr(storage, name) is not None:
            getattr(out, name).copy_(getattr(storage, name)[:, envs])
    for name, buffer in storage.extras.items():
        out.extras[name].copy_(buffer[:, envs])
    out.last_values.copy_(storage.last_values[envs])
    out.step = storage.step
    return out


def _same_rollout(ranks: RankGroup) -> tuple[float, float, float]:
    """A one-process CPO rollout split over the ranks and gathered again, and CPO's update on
    the gathered rollout against the update on the original: largest difference of any stored
    value, of any parameter, and between the ranks' replicas."""
    cfg = resolve_config("cpo", list(TINY))
    setup, storage = collected_rollout(cfg)
    torch.manual_seed(1)
    algorithm = build_algorithm(setup.config, setup.model, setup.seed)
    local = _columns(storage, ranks.env_block(storage.num_envs))
    gathered = rollout_like(local, setup.member)
    gather_rollout(ranks, local, gathered)
    fields = [n for n in COLLECTED if getattr(storage, n) is not None]
    pairs = [(getattr(storage, n), getattr(gathered, n)) for n in fields]
    pairs += [(storage.extras[n], gathered.extras[n]) for n in storage.extras]
    pairs.append((storage.last_values, gathered.last_values))
    rollout = max(float((a.double() - b.double()).abs().max()) for a, b in pairs)
    models = []
    for source in (storage, gathered):
        torch.manual_seed(4)
        model = copy.deepcopy(setup.model)
        build_algorithm(setup.config, model, setup.seed).update(source)
        models.append(model)
    a, b = models[0].state_dict(), models[1].state_dict()
    parameters = max(float((a[k].double() - b[k].double()).abs().max()) for k in a)
    del algorithm
    return rollout, parameters, replica_difference(models[1], ranks)


def _rank_main(run: str, report: str) -> int:
    ranks = RankGroup.launch("cpu")
    rollout, parameters, replicas = _same_rollout(ranks)
    worst = ranks.all_reduce_(torch.tensor([rollout, parameters]), op="max").tolist()
    if ranks.is_writer:
        Path(report).write_text(
            json.dumps(
                {
                    "rollout_difference": worst[0],
                    "parameter_difference": worst[1],
                    "replica_difference": replicas,
                }
            )
        )
    # The launch's process group carries on into the resumed run (which closes it).
    return main(["finetune", "--resume", run, "iterations=4"])


def _split_main(run: str, report: str) -> int:
    """PPO on two ranks with the split update (:func:`test_ppo_update_splits_over_two_ranks`)."""
    ranks = RankGroup.launch("cpu")
    cfg = resolve_config("ppo", [*TINY, "population.size=1", "iterations=2", "eval.every=0"])
    runner = finetune_runner(cfg, run, ranks)
    before = [p.detach().clone() for p in runner.model.parameters()]
    assert runner.model.obs_norm is not None
    count = float(runner.model.obs_norm.count)
    runner.learn(2)
    change = max(float((p - q).abs().max()) for p, q in zip(runner.model.parameters(), before))
    flags = torch.tensor(
        [
            float(runner.update_split == "envs"),
            float(runner.learning_rollout(runner.storage) is runner.local_storage),
            float(runner.model.obs_norm.count) - count,
        ]
    )
    per_rank = ranks.all_gather_cat(flags.unsqueeze(0), dim=0).tolist()
    replicas = replica_difference(runner.model, ranks)
    runner.close()
    cpo = finetune_runner(resolve_config("cpo", list(TINY)), f"{run}-cpo", ranks)
    rows = float(cpo.update_split == "rows" and cpo.algorithm.share is not None)
    cpo_split = ranks.all_gather_cat(torch.tensor([[rows]]), dim=0)
    cpo.close()
    if ranks.is_writer:
        Path(report).write_text(
            json.dumps(
                {
                    "split": [bool(r[0]) for r in per_rank],
                    "learns_from_own_rows": [bool(r[1]) for r in per_rank],
                    "obs_rows_folded": [round(r[2]) for r in per_rank],
                    "replica_difference": replicas,
                    "parameter_change": change,
                    "cpo_split": [bool(v) for v in cpo_split.flatten().tolist()],
                }
            )
        )
    ranks.close()
    return 0


def _rows_main(report: str) -> int:
    """SAPG, CPO and PBT updates split over the ranks by rows against one process's update of
    the same rollout (:func:`test_split_update_is_the_one_process_update`)."""
    ranks = RankGroup.launch("cpu")
    share = RowShare(ranks.rank, ranks.world_size, ranks.all_reduce_, ranks.all_gather_cat)
    out: dict[str, dict[str, float]] = {}
    for label, (algo, extra) in SPLIT_ALGOS.items():
        cfg = resolve_config(algo, [*TINY, *extra])
        setup, storage = collected_rollout(cfg)
        results = []
        for split in (False, True):
            torch.manual_seed(4)  # the discriminator's initial weights
            model = copy.deepcopy(setup.model)
            algorithm = build_algorithm(setup.config, model, setup.seed)
            if split:
                algorithm.set_share(share)
                algorithm.grad_sync = GradientAverager(ranks, algorithm.parameters)
            rollout = copy.deepcopy(storage)
            stats = [algorithm.update(rollout) for _ in range(2)][-1]
            if algo == "pbt":  # an exploit round from returns the ranks summed
                stats.update(algorithm.end_iteration(np.arange(4.0), np.ones(4)))
            weights = {k: v.detach().clone() for k, v in model.named_parameters()}
            results.append((weights, stats, algorithm))
        (a, stats_a, one), (b, stats_b, split_) = results
        start = dict(setup.model.named_parameters())
        out[label] = {
            "parameter_difference": max(float((a[k] - b[k]).abs().max()) for k in a),
            "parameter_change": max(float((a[k] - start[k]).abs().max()) for k in a),
            "loss_difference": abs(stats_a["loss"] - stats_b["loss"]),
            "kl_difference": abs(stats_a["kl"] - stats_b["kl"]),
            "replica_difference": replica_difference(split_.model, ranks),
        }
        del one
    if ranks.is_writer:
        Path(report).write_text(json.dumps(out))
    ranks.close()
    return 0


if __name__ == "__main__":
    if sys.argv[1] == "split-ppo":
        raise SystemExit(_split_main(sys.argv[2], sys.argv[3]))
    if sys.argv[1] == "split-rows":
        raise SystemExit(_rows_main(sys.argv[2]))
    raise SystemExit(_rank_main(sys.argv[1], sys.argv[2]))
