"""benchmarks/cpo_regime.py: a run's record says what the run did (its budget, its curve against
env steps, the figures read from the curve), a finished run is skipped, and the aggregates the docs
quote (IQM and mean over seeds) match an independent computation, for hand-made records and for
every committed summary."""

from __future__ import annotations

import argparse
import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
import yaml
from scipy import stats

from myriad.utils.checkpoint import flatten_config, latest_checkpoint, load_checkpoint

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("cpo_regime", ROOT / "benchmarks" / "cpo_regime.py")
assert spec is not None and spec.loader is not None
cpo_regime = importlib.util.module_from_spec(spec)
spec.loader.exec_module(cpo_regime)

RESULTS = ROOT / "benchmarks" / "results" / "cpo_regime"
#: The regime's runs on a GPU, summarised as the CPU's are.
GPU_RESULTS = ROOT / "benchmarks" / "results" / "cpo_regime_h200"
METRICS = ("final_success", "auc_success", "steps_to_half", "final_return", "auc_return")


def _iqm(values: list[float]) -> float:
    """The interquartile mean as rliable defines it: the mean of the middle 50% of the runs."""
    return float(stats.trim_mean(np.asarray(values, dtype=float), 0.25))


def _regime_args(task: str) -> argparse.Namespace:
    return argparse.Namespace(
        task=task,
        blocks=6,
        envs_per_block=4096,
        horizon=16,
        env_steps=5e7,
        eval_every=16,
        eval_episodes=64,
        checkpoint_every=8,
        overrides=[],
        init_from=None,
        variant=None,
    )


def test_budget_counts_pretraining_and_seeds_parse() -> None:
    args = _regime_args("maze-far")
    # 5x10^7 env steps at 6 x 4,096 envs x 16 steps per iteration: 127 iterations.
    assert cpo_regime.iterations(args) == 127
    # Pretraining's 10^7 env steps come out of the same budget.
    assert cpo_regime.iterations(args, pretrained_steps=10_000_000) == 102
    assert cpo_regime.tag(args) == "maze-far-b6x4096"
    args.init_from = "runs/pre-seed{seed}"
    assert cpo_regime.tag(args) == "maze-far-b6x4096-kmyriad"
    assert cpo_regime.seeds("0-4") == [0, 1, 2, 3, 4]
    assert cpo_regime.seeds("1,3") == [1, 3]
    assert cpo_regime.score_of("halfcheetah") == "return"
    assert cpo_regime.score_of("three-routes") == "success"


@pytest.mark.parametrize("task", sorted(cpo_regime.TASKS))
def test_only_the_population_machinery_differs(task: str) -> None:
    """PPO, SAPG, CPO and PBT run with the same settings (the authors' PPO settings, their
    initial policy std among them) but for the population machinery itself."""
    from myriad.finetune.api import resolve_config

    args = _regime_args(task)
    configs = {
        algo: flatten_config(resolve_config(*cpo_regime.run_overrides(algo, 0, args)))
        for algo in cpo_regime.ALGOS
    }
    reference = configs["ppo"]
    assert reference["population.init_log_std"] == 0.0
    for algo, cfg in configs.items():
        keys = set(cfg) | set(reference)
        differing = {
            k: (reference.get(k), cfg.get(k))
            for k in keys
            if cfg.get(k) != reference.get(k) and not k.startswith(cpo_regime.MACHINERY)
        }
        assert not differing, f"{algo} differs from PPO outside the population machinery"


@pytest.mark.parametrize("variant", sorted(cpo_regime.VARIANTS))
def test_a_variant_changes_only_the_machinery_and_writes_its_own_folder(variant: str) -> None:
    from myriad.finetune.api import resolve_config

    args = _regime_args("three-routes")
    algos, settings = cpo_regime.VARIANTS[variant]
    keys = [o.split("=")[0] for o in settings]
    assert all(k.startswith(cpo_regime.MACHINERY) for k in keys)
    for algo in algos:
        base = flatten_config(resolve_config(*cpo_regime.run_overrides(algo, 0, args)))
        args.variant = variant
        changed = flatten_config(resolve_config(*cpo_regime.run_overrides(algo, 0, args)))
        assert cpo_regime.tag(args) == f"three-routes-b6x4096-{variant}"
        args.variant = None
        differing = {k for k in set(base) | set(changed) if base.get(k) != changed.get(k)}
        # The variant's own settings, each taking effect, and nothing else.
        assert differing and differing <= set(keys)
        for o in settings:
            key, value = o.split("=", 1)
            assert changed[key] == yaml.safe_load(value)
    args.variant = variant
    with pytest.raises(ValueError, match="applies to"):
        cpo_regime.run_overrides("ppo", 0, args)


@pytest.mark.parametrize("variant", sorted(cpo_regime.VARIANTS))
def test_a_small_variant_run_writes_its_own_record(tmp_path: Path, variant: str) -> None:
    algos, settings = cpo_regime.VARIANTS[variant]
    argv = ["run", "--task", "three-routes", "--algos", ",".join(algos), "--seeds", "0"]
    argv += ["--blocks", "2", "--envs-per-block", "16", "--horizon", "8", "--env-steps", "512"]
    argv += ["--eval-every", "2", "--eval-episodes", "2", "--checkpoint-every", "2"]
    argv += ["--workdir", str(tmp_path / "runs"), "--results", str(tmp_path / "results")]
    assert cpo_regime.main([*argv, "--variant", variant]) == 0
    for algo in algos:
        record = tmp_path / "results" / f"three-routes-b2x16-{variant}" / f"{algo}-seed0.json"
        assert json.loads(record.read_text())["overrides"][-len(settings) :] == settings
        run = tmp_path / "runs" / f"three-routes-b2x16-{variant}" / f"{algo}-seed0"
        saved = flatten_config(yaml.safe_load((run / "config.yaml").read_text()))
        for setting in settings:
            key, value = setting.split("=")
            assert saved[key] == yaml.safe_load(value)
    assert not (tmp_path / "results" / "three-routes-b2x16").exists()
    # The run's per-iteration statistics, as its checkpoint holds them.
    out = tmp_path / "trace.json"
    assert cpo_regime.main(["trace", str(run), "--out", str(out)]) == 0
    traced = json.loads(out.read_text())
    state = load_checkpoint(latest_checkpoint(run / "checkpoints"))
    history = state["logger"]["history"]
    log_std = state["state"]["model"]["log_std"]  # [M, A]
    assert traced["final_log_std_per_member"] == pytest.approx(log_std.mean(dim=1).tolist())
    assert traced["run"] == f"three-routes-b2x16-{variant}/cpo-seed0"
    assert set(traced["series"]) == {k for k in history if k.startswith(cpo_regime.TRACE_KEYS)}
    for key in ("episode/success/member_0", "train/leader_ess", "eval/leader_success"):
        assert traced["series"][key] == [list(p) for p in history[key]]
    # Every member's final success with mean and with sampled actions (myriad eval's rollout).
    final = traced["final_success_per_member"]
    assert final["episodes"] == cpo_regime.TRACE_EPISODES
    for mode in ("mean_actions", "sampled_actions"):
        assert len(final[mode]) == log_std.shape[0]
        assert all(0.0 <= v <= 1.0 for v in final[mode])


def test_a_variant_is_refused_where_it_cannot_apply(capsys: pytest.CaptureFixture[str]) -> None:
    refused = {
        ("independent", "--algos", "ppo,sapg"): "applies to sapg, cpo only",
        ("independent", "--algos", "sapg", "--init-from", "x{seed}"): "run it from scratch",
        ("dual-clip", "--algos", "cpo", "algo.off_policy_dual_clip=2.0"): "drop that override",
        (
            "independent",
            "--algos",
            "sapg",
            "population.parameterization=embedding",
        ): "drop that override",
    }
    for (variant, *extra), message in refused.items():
        with pytest.raises(SystemExit):
            cpo_regime.main(["run", "--task", "three-routes", "--variant", variant, *extra])
        assert message in capsys.readouterr().err
    # A variant that leaves the architecture alone may start from a pretrained population.
    assert cpo_regime.variant_problem("dual-clip", ["cpo"], "x{seed}", []) is None


def test_runs_from_a_pretrained_population_take_its_initial_std() -> None:
    # ``--init`` refuses architecture settings: the population's own std is the start.
    args = _regime_args("three-routes")
    args.init_from = "runs/pretrain-seed{seed}"
    for algo in cpo_regime.ALGOS:
        _, overrides = cpo_regime.run_overrides(algo, 0, args, pretrained_steps=9_830_400)
        assert not [o for o in overrides if o.startswith("population.init_log_std")]
    args.init_from = None
    _, overrides = cpo_regime.run_overrides("ppo", 0, args)
    assert "population.init_log_std=0.0" in overrides


def test_a_run_started_with_other_settings_is_not_resumed(tmp_path: Path) -> None:
    """A resumed run continues with its saved config: resuming one started with settings the
    code no longer uses would write a record that claims the new ones."""
    import yaml

    from myriad.finetune.api import resolve_config

    config, overrides = cpo_regime.run_overrides("ppo", 0, _regime_args("three-routes"))
    same, old = tmp_path / "same", tmp_path / "old"
    for folder, extra in ((same, []), (old, ["population.init_log_std=-0.5"])):
        folder.mkdir()
        saved = resolve_config(config, [*overrides, *extra])
        (folder / "config.yaml").write_text("# a comment line\n" + yaml.safe_dump(saved))
    cpo_regime.refuse_changed_settings(same, config, overrides, None)
    with pytest.raises(SystemExit, match=r"population.init_log_std: -0.5 -> 0.0"):
        cpo_regime.refuse_changed_settings(old, config, overrides, None)


@pytest.mark.slow
def test_a_small_run_records_its_curve_and_is_skipped_when_finished(tmp_path: Path) -> None:
    argv = [
        "run",
        "--task",
        "maze-far",
        "--algos",
        "ppo,sapg",
        "--seeds",
        "0",
        "--blocks",
        "2",
        "--envs-per-block",
        "16",
        "--horizon",
        "8",
        "--env-steps",
        "1024",
        "--eval-every",
        "2",
        "--eval-episodes",
        "4",
        "--checkpoint-every",
        "2",
        "--workdir",
        str(tmp_path / "runs"),
        "--results",
        str(tmp_path / "results"),
    ]
    assert cpo_regime.main(argv) == 0
    folder = tmp_path / "results" / "maze-far-b2x16"
    for algo in ("ppo", "sapg"):
        record = json.loads((folder / f"{algo}-seed0.json").read_text())
        # 1,024 env steps at 2 x 16 envs x 8 steps: 4 iterations of 256 env steps.
        assert record["env_steps"] == 1024
        assert record["num_envs"] == 32
        steps = [s for s, _ in record["curve"]["success"]]
        assert steps, "the run was evaluated"
        assert all(s % 256 == 0 and 0 < s <= 1024 for s in steps)
        assert steps == sorted(steps)
        success = [v for _, v in record["curve"]["success"]]
        assert record["auc_success"] == pytest.approx(np.mean(success))
        reached = [s for s, v in record["curve"]["success"] if v >= 0.5]
        assert record["steps_to_half"] == (reached[0] if reached else 1024)
        assert 0.0 <= record["final_success"] <= 1.0
        # A training-success point per iteration in which episodes finished, the best of them
        # recorded on its own.
        training = record["curve"]["training_success"]
        points = [s for s, _ in training]
        assert points and points == sorted(set(points))
        assert set(points) <= {256, 512, 768, 1024}
        assert all(0.0 <= v <= 1.0 for _, v in training)
        assert record["max_training_success"] == max(v for _, v in training)
        assert record["seed"] == 0 and record["algo"] == algo
        assert "seed=0" in record["overrides"]
    # PPO gets every env in one block; SAPG splits them into its members' blocks.
    ppo = json.loads((folder / "ppo-seed0.json").read_text())["overrides"]
    sapg = json.loads((folder / "sapg-seed0.json").read_text())["overrides"]
    assert "population.size=1" in ppo and "population.size=2" in sapg
    written = {p: p.stat().st_mtime_ns for p in folder.glob("*.json")}
    assert cpo_regime.main(argv) == 0  # both runs are finished: nothing is retrained
    assert {p: p.stat().st_mtime_ns for p in folder.glob("*.json")} == written
    summary = cpo_regime.summarize(folder, reps=50)
    assert summary["runs"] == {"ppo": [0], "sapg": [0]}
    assert (tmp_path / "results" / "maze-far-b2x16.png").stat().st_size > 0


def _record(algo: str, seed: int, final: float, curve: list[float]) -> dict:
    steps = [(i + 1) * 100 for i in range(len(curve))]
    reached = [s for s, v in zip(steps, curve) if v >= 0.5]
    return {
        "algo": algo,
        "seed": seed,
        "task": "three-routes",
        "env_steps": 400,
        "num_envs": 24,
        "commit": "abc",
        "curve": {"success": list(zip(steps, curve)), "return": list(zip(steps, curve))},
        "final_success": final,
        "final_return": final,
        "auc_success": float(np.mean(curve)),
        "steps_to_half": reached[0] if reached else 400,
    }


def test_summary_of_hand_made_runs(tmp_path: Path) -> None:
    folder = tmp_path / "three-routes-b6x4"
    folder.mkdir()
    finals = [0.0, 1.0, 0.25, 0.75, 0.5]
    for seed, final in enumerate(finals):
        curve = [0.0, 0.0, final, final]
        (folder / f"sapg-seed{seed}.json").write_text(
            json.dumps(_record("sapg", seed, final, curve))
        )
    (folder / "ppo-seed0.json").write_text(json.dumps(_record("ppo", 0, 0.0, [0.0] * 4)))
    summary = cpo_regime.summarize(folder, reps=200)
    sapg = summary["final_success"]["sapg"]
    # Of 0, 0.25, 0.5, 0.75, 1 the middle half is 0.25, 0.5, 0.75 (by hand): IQM 0.5.
    assert sapg["iqm"] == pytest.approx(0.5)
    assert sapg["mean"] == pytest.approx(0.5)
    assert sorted(sapg["values"]) == sorted(finals)
    assert sapg["iqm_ci95"][0] <= 0.5 <= sapg["iqm_ci95"][1]
    # Area under each curve: half the final; steps to 50%: the third evaluation, or the budget.
    assert summary["auc_success"]["sapg"]["mean"] == pytest.approx(0.25)
    assert sorted(summary["steps_to_half"]["sapg"]["values"]) == [300, 300, 300, 400, 400]
    # Runs written before the record held the area under the return curve get it from the curve.
    assert summary["auc_return"]["sapg"]["mean"] == pytest.approx(0.25)
    assert summary["runs"] == {"ppo": [0], "sapg": [0, 1, 2, 3, 4]}
    assert summary["final_success"]["ppo"]["iqm"] == 0.0
    # The IQM curve: every run is 0 at the first two evaluations, then at its final value.
    curve = summary["curve_iqm"]["sapg"]
    assert curve["env_steps"] == [100, 200, 300, 400]
    assert curve["iqm"] == pytest.approx([0.0, 0.0, 0.5, 0.5])
    assert all(
        lo <= m <= hi for lo, m, hi in zip(curve["ci95_low"], curve["iqm"], curve["ci95_high"])
    )
    assert curve["ci95_low"][2] < 0.5 < curve["ci95_high"][2]
    assert (tmp_path / "three-routes-b6x4.png").stat().st_size > 0
    with pytest.raises(SystemExit, match="no finished runs"):
        cpo_regime.summarize(tmp_path / "empty", reps=10)


def _machine_record(seed: int, final: float, speed: float, device: str) -> dict:
    return {
        **_record("cpo", seed, final, [final] * 4),
        "steps_per_second": speed,
        "config": "cpo_paper",
        "overrides": [f"seed={seed}", *([f"device={device}"] if device != "cpu" else [])],
    }


def test_compare_pairs_runs_by_name_and_counts_like_outcomes(tmp_path: Path) -> None:
    fast, slow = tmp_path / "fast", tmp_path / "slow"
    fast.mkdir(), slow.mkdir()
    for folder, finals, speed, device in (
        (fast, (1.0, 0.0, 1.0), 600.0, "cuda"),
        (slow, (1.0, 1.0), 20.0, "cpu"),
    ):
        for seed, final in enumerate(finals):
            record = _machine_record(seed, final, speed, device)
            (folder / f"cpo-seed{seed}.json").write_text(json.dumps(record))
    result = cpo_regime.compare(fast, slow, tmp_path / "cmp.json")
    # Seed 2 has no counterpart; seed 1 ends otherwise (0 against 1); device= may differ.
    assert [r["run"] for r in result["runs"]] == ["cpo-seed0", "cpo-seed1"]
    assert result["unmatched"] == ["cpo-seed2"]
    assert [r["same_outcome"] for r in result["runs"]] == [True, False]
    assert result["same_outcome"] == 1 and result["compared"] == 2
    assert result["runs"][0]["speed_ratio"] == 30.0
    assert json.loads((tmp_path / "cmp.json").read_text()) == result
    with pytest.raises(SystemExit, match="no run of"):
        cpo_regime.compare(fast, tmp_path / "nowhere", tmp_path / "x.json")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"env_steps": 800}, "env_steps differs"),
        ({"overrides": ["seed=0", "ppo.lr=1e-3"]}, "overrides differ"),
        ({"task": "halfcheetah"}, "scored by return"),
    ],
)
def test_compare_refuses_runs_that_are_not_the_same_run(
    tmp_path: Path, change: dict, message: str
) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    (a / "cpo-seed0.json").write_text(
        json.dumps({**_machine_record(0, 1.0, 2.0, "cuda"), **change})
    )
    (b / "cpo-seed0.json").write_text(json.dumps(_machine_record(0, 1.0, 1.0, "cpu")))
    with pytest.raises(SystemExit, match=message):
        cpo_regime.compare(a, b, tmp_path / "cmp.json")


def test_committed_comparison_on_the_gpu_matches_its_runs(tmp_path: Path) -> None:
    """The H200 runs against the CPU's (docs/evidence/finetune.md) as the records say now."""
    committed = ROOT / "benchmarks" / "results" / "cpo_regime_h200" / "vs_cpu.json"
    saved = json.loads(committed.read_text())
    again = cpo_regime.compare(
        ROOT / saved["folder"], ROOT / saved["reference"], tmp_path / "again.json"
    )
    assert again["runs"] == saved["runs"], f"rerun the compare command in {committed.name}"


def _run_folders() -> list[Path]:
    """Every folder of run records under the results (superseded ones included)."""
    return sorted({p.parent for base in (RESULTS, GPU_RESULTS) for p in base.rglob("*-seed*.json")})


def _committed() -> list[Path]:
    return [folder.with_suffix(".json") for folder in _run_folders()]


@pytest.mark.parametrize(
    "summary_path", _committed(), ids=lambda p: str(p.relative_to(RESULTS.parent).with_suffix(""))
)
def test_committed_summaries_match_their_runs(summary_path: Path) -> None:
    """Each committed summary aggregates exactly the run records beside it, and its IQMs and
    means are those of the records' figures."""
    summary = json.loads(summary_path.read_text())
    records = [json.loads(p.read_text()) for p in summary_path.with_suffix("").glob("*-seed*.json")]
    runs: dict[str, list[int]] = {}
    for r in records:
        runs.setdefault(r["algo"], []).append(r["seed"])
    assert {a: sorted(s) for a, s in runs.items()} == summary["runs"], (
        f"{summary_path.name} is older than its folder: run `python benchmarks/cpo_regime.py "
        f"summarize {summary_path.with_suffix('')}`"
    )
    for metric in METRICS:
        for algo in runs:
            values = [cpo_regime._metric(r, metric) for r in records if r["algo"] == algo]
            entry = summary[metric][algo]
            assert sorted(entry["values"]) == pytest.approx(sorted(values))
            assert entry["iqm"] == pytest.approx(_iqm(values), rel=1e-9, abs=1e-9)
            assert entry["mean"] == pytest.approx(np.mean(values), rel=1e-9, abs=1e-9)
            lo, hi = entry["iqm_ci95"]
            assert min(values) - 1e-9 <= lo <= entry["iqm"] + 1e-9
            assert entry["iqm"] - 1e-9 <= hi <= max(values) + 1e-9
    score = summary["score"]
    for algo, curve in summary["curve_iqm"].items():
        curves = [r["curve"][score] for r in records if r["algo"] == algo]
        n = len(curve["iqm"])
        assert n == min(len(c) for c in curves)
        for j in range(n):
            assert curve["iqm"][j] == pytest.approx(_iqm([c[j][1] for c in curves]), abs=1e-9)


def test_every_committed_run_folder_has_its_summary() -> None:
    folders = _run_folders()
    assert folders
    missing = [
        str(p.relative_to(RESULTS.parent)) for p in folders if not p.with_suffix(".json").exists()
    ]
    assert not missing, f"summarize these folders: {missing}"
    # A summary without its folder would aggregate runs nobody can check.
    orphans = [
        str(p.relative_to(RESULTS))
        for p in RESULTS.rglob("*.json")
        if "-seed" not in p.name and not p.with_suffix("").is_dir()
    ]
    assert not orphans, f"summaries without their run folder: {orphans}"


TRACES = ROOT / "benchmarks" / "results" / "cpo_regime_traces"


@pytest.mark.parametrize(
    "trace_path",
    sorted(TRACES.rglob("*.json")),
    ids=lambda p: str(p.relative_to(TRACES).with_suffix("")),
)
def test_committed_traces_belong_to_their_records(trace_path: Path) -> None:
    """A trace is of the run its record describes: the same evaluations and the same training
    success per iteration, at the record's env steps per iteration."""
    traced = json.loads(trace_path.read_text())
    record = json.loads((RESULTS / trace_path.relative_to(TRACES)).read_text())
    per_iteration = record["num_envs"] * record["horizon"]
    assert traced["run"] == str(trace_path.relative_to(TRACES).with_suffix(""))
    series = traced["series"]
    evaluations = [(i * per_iteration, v) for i, v in series["eval/leader_success"]]
    assert evaluations == [tuple(p) for p in record["curve"]["success"]]
    if "training_success" in record["curve"]:
        training = [
            (i * per_iteration + record["pretrained_env_steps"], v)
            for i, v in series["episode/success"]
        ]
        assert training == [tuple(p) for p in record["curve"]["training_success"]]


def _scaled(
    algo: str, seed: int, final: float, envs_per_block: int, task: str = "maze-far"
) -> dict:
    return {
        **_record(algo, seed, final, [final / 2, final]),
        "task": task,
        "blocks": 6,
        "envs_per_block": envs_per_block,
        "pretrained_env_steps": 0,
    }


def test_scale_sweep_of_hand_made_runs(tmp_path: Path) -> None:
    finals = {64: [0.0, 1.0, 1.0, 0.5], 512: [0.0, 0.0, 1.0], 4096: [0.0]}
    folders = []
    for scale, values in finals.items():
        folder = tmp_path / f"maze-far-b6x{scale}"
        folder.mkdir()
        folders.append(folder)
        for seed, final in enumerate(values):
            (folder / f"sapg-seed{seed}.json").write_text(
                json.dumps(_scaled("sapg", seed, final, scale))
            )
        # PPO has seed 0 only: the like-for-like set at every scale is seed 0.
        (folder / "ppo-seed0.json").write_text(json.dumps(_scaled("ppo", 0, 0.0, scale)))
    # PBT at one count only is not part of the sweep.
    (folders[-1] / "pbt-seed0.json").write_text(json.dumps(_scaled("pbt", 0, 1.0, 4096)))
    out = tmp_path / "sweep" / "maze-far.json"
    sweep = cpo_regime.scale_sweep(folders, out, reps=100)
    assert sweep["envs_per_block"] == [64, 512, 4096]
    assert sweep["runs"]["sapg"] == {"64": [0, 1, 2, 3], "512": [0, 1, 2], "4096": [0]}
    assert sweep["common_seeds"] == {"64": [0], "512": [0], "4096": [0]}
    assert set(sweep["runs"]) == {"ppo", "sapg"}
    for scale, values in finals.items():
        entry = sweep["final_success"]["sapg"][str(scale)]
        assert entry["iqm"] == pytest.approx(_iqm(values))
        assert entry["mean"] == pytest.approx(np.mean(values))
        # Each curve is (final / 2, final): its area is three quarters of the final.
        assert sweep["auc_success"]["sapg"][str(scale)]["mean"] == pytest.approx(
            0.75 * np.mean(values)
        )
    assert json.loads(out.read_text())["runs"] == sweep["runs"]
    assert out.with_suffix(".png").stat().st_size > 0
    other = tmp_path / "three-routes-b6x512"
    other.mkdir()
    (other / "ppo-seed0.json").write_text(json.dumps(_scaled("ppo", 0, 1.0, 512, "three-routes")))
    with pytest.raises(SystemExit, match="differ in task"):
        cpo_regime.scale_sweep([folders[0], other], tmp_path / "x.json", reps=10)
    # A variant's folder at another count is not the same algorithm.
    for scale, name in ((512, "maze-far-b6x512"), (4096, "maze-far-b6x4096-independent")):
        folder = tmp_path / "variant" / name
        folder.mkdir(parents=True)
        extra = ["population.parameterization=independent"] if "independent" in name else []
        record = {
            **_scaled("sapg", 0, 1.0, scale),
            "config": "sapg_paper",
            "horizon": 16,
            "overrides": [f"num_envs={6 * scale}", "seed=0", "iterations=9", *extra],
        }
        (folder / "sapg-seed0.json").write_text(json.dumps(record))
    with pytest.raises(SystemExit, match="differ in more than their env count"):
        cpo_regime.scale_sweep(
            sorted((tmp_path / "variant").iterdir()), tmp_path / "y.json", reps=10
        )


SWEEPS = ROOT / cpo_regime.SWEEPS


@pytest.mark.parametrize("sweep_path", sorted(SWEEPS.glob("*.json")), ids=lambda p: p.stem)
def test_committed_sweeps_match_their_folders(sweep_path: Path) -> None:
    """A committed sweep aggregates exactly the records of the folders it names."""
    sweep = json.loads(sweep_path.read_text())
    records = [
        json.loads(p.read_text())
        for folder in sweep["folders"]
        for p in (ROOT / folder).glob("*-seed*.json")
    ]
    metrics = (f"final_{sweep['score']}", f"auc_{sweep['score']}")
    for algo, per_scale in sweep["runs"].items():
        for scale, seeds in per_scale.items():
            mine = [r for r in records if r["algo"] == algo and r["envs_per_block"] == int(scale)]
            assert sorted(r["seed"] for r in mine) == seeds, (
                f"{sweep_path.name} is older than its folders: run `python "
                f"benchmarks/cpo_regime.py sweep {' '.join(sweep['folders'])}`"
            )
            for metric in metrics if mine else ():
                values = [cpo_regime._metric(r, metric) for r in mine]
                entry = sweep[metric][algo][scale]
                assert entry["iqm"] == pytest.approx(_iqm(values), abs=1e-9)
                assert entry["mean"] == pytest.approx(np.mean(values), abs=1e-9)
