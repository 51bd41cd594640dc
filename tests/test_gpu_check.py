"""`myriad bench gpu`: one line without a GPU; on the CPU at small sizes, the stages' plumbing,
the JSON they write and how a failing stage is recorded."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from myriad.bench import gpu

CHEAP_STAGES = "nav_envs,pretrain,knn,cpo_finetune"


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU this would run the whole check")
def test_without_a_gpu_the_command_prints_one_line_and_exits_0(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "myriad.cli", "bench", "gpu"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines() == [
        "myriad bench gpu: no CUDA device on this machine, nothing to check"
    ]
    assert not (tmp_path / "benchmarks").exists()


def test_stages_on_cpu_write_every_stage_record(tmp_path: Path) -> None:
    out = tmp_path / "gpu.json"
    status = gpu.main(["--device", "cpu", "--small", "--stages", CHEAP_STAGES, "--out", str(out)])
    payload = json.loads(out.read_text())
    assert status == 0 and payload["ok"] and payload["failed"] == []
    assert list(payload["stages"]) == CHEAP_STAGES.split(",")
    assert len(payload["load_average_start"]) == 3
    for record in payload["stages"].values():
        assert record["status"] == "ok" and record["error"] is None and record["seconds"] > 0
    stages = payload["stages"]
    assert stages["nav_envs"]["figures"]["nav-maze"]["steps_per_s"] > 0
    pre = stages["pretrain"]["figures"]
    assert pre["members"] == gpu.SMALL.pretrain_members and pre["steps_per_s"] > 0
    assert 0 < pre["knn_share"] < 1
    assert pre["rollout_host_sync"] == "not applicable on cpu"
    runs = stages["knn"]["figures"]["runs"]
    assert len(runs) == len(gpu.SMALL.knn_states) * len(gpu.SMALL.knn_dims)
    # faiss on the same device and data as the reference: the same exact neighbours.
    assert all(r["recall"] == 1.0 and r["max_distance_error"] < 1e-5 for r in runs)
    assert stages["cpo_finetune"]["figures"]["steps_per_s"] > 0


def test_a_failing_stage_is_recorded_on_one_line_and_the_check_goes_on(tmp_path: Path) -> None:
    out = tmp_path / "gpu.json"
    status = gpu.main(
        ["--device", "cpu", "--small", "--stages", "cpo_finetune,nav_envs", "--out", str(out)]
    )
    payload = json.loads(out.read_text())
    assert status == 1 and not payload["ok"] and payload["failed"] == ["cpo_finetune"]
    failed = payload["stages"]["cpo_finetune"]
    assert failed["status"] == "failed" and "\n" not in failed["error"]
    assert failed["error"].startswith("StageFailed: CPO finetunes the pretrain stage's run")
    assert payload["stages"]["nav_envs"]["status"] == "ok"


def test_the_knn_reference_runs_on_every_core_and_the_count_comes_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import myriad.entropy.knn as knn_module

    threads = torch.get_num_threads()
    seen: list[int] = []
    search = knn_module.knn

    def counting_knn(*args: object, **kwargs: object) -> object:
        seen.append(torch.get_num_threads())
        return search(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(knn_module, "knn", counting_knn)
    monkeypatch.setattr(gpu, "search_threads", lambda: threads + 2)
    out = tmp_path / "gpu.json"
    assert gpu.main(["--device", "cpu", "--small", "--stages", "knn", "--out", str(out)]) == 0
    figures = json.loads(out.read_text())["stages"]["knn"]["figures"]
    # Per case one search on the device's thread count, then the reference on every core.
    assert seen == [threads, threads + 2] * len(figures["runs"])
    assert figures["cpu_threads"] == threads + 2 and torch.get_num_threads() == threads


def test_no_stage_named_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        gpu.main(["--device", "cpu", "--stages", " , "])
    assert exc.value.code == 2
    assert "no stage named" in capsys.readouterr().err


def test_unknown_stage_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        gpu.main(["--device", "cpu", "--stages", "nav_envs,warp"])
    assert exc.value.code == 2
    assert "unknown stage(s) ['warp']" in capsys.readouterr().err


def test_exact_recall_counts_shared_neighbours_per_row() -> None:
    found = torch.tensor([[1, 2, 3], [4, 5, 6]])
    exact = torch.tensor([[3, 2, 1], [4, 9, 8]])
    assert gpu.exact_recall(found, exact) == pytest.approx((3 / 3 + 1 / 3) / 2)


def test_junit_counts_and_one_line_errors(tmp_path: Path) -> None:
    report = tmp_path / "report.xml"
    report.write_text(
        '<testsuites><testsuite name="pytest">'
        '<testcase classname="tests.test_a" name="test_ok"/>'
        '<testcase classname="tests.test_a" name="test_bad"><failure message="x"/></testcase>'
        '<testcase classname="tests.test_b" name="test_cuda">'
        '<skipped message="needs CUDA"/></testcase>'
        "</testsuite></testsuites>"
    )
    counts = gpu.junit_counts(report)
    assert (counts["passed"], counts["failed"], counts["skipped"]) == (1, 1, 1)
    assert counts["failures"] == ["tests.test_a::test_bad"]
    assert counts["skip_reasons"] == ["tests.test_b::test_cuda: needs CUDA"]
    assert gpu.one_line(ValueError("first\nsecond")) == "ValueError: first"
    assert len(gpu.one_line(RuntimeError("x" * 1000))) == 300


def test_the_json_holds_each_finished_stage_before_the_next_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A check killed by a node's time limit keeps what it finished: while the second stage
    runs, the file already holds the first, marked incomplete."""
    out = tmp_path / "gpu.json"
    seen: dict[str, object] = {}

    def second_stage(check: gpu.Check) -> dict[str, object]:
        seen.update(json.loads(out.read_text()))
        return {}

    monkeypatch.setitem(gpu.STAGE_FUNCTIONS, "knn", second_stage)
    status = gpu.main(["--device", "cpu", "--small", "--stages", "nav_envs,knn", "--out", str(out)])
    assert seen["complete"] is False and seen["ok"] is False  # cut short is not a pass
    assert list(seen["stages"]) == ["nav_envs"]  # type: ignore[arg-type]
    final = json.loads(out.read_text())
    assert (
        status == 0 and final["complete"] is True and list(final["stages"]) == ["nav_envs", "knn"]
    )


def test_cpo_starts_fresh_when_the_pretrain_stage_failed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One device run finds the finetuning path's faults even when pretraining has one; the
    failed stage keeps its whole traceback for a node whose JSON is all that comes back."""

    def broken_pretrain(check: gpu.Check) -> dict[str, object]:
        raise ValueError("broken on purpose")

    monkeypatch.setitem(gpu.STAGE_FUNCTIONS, "pretrain", broken_pretrain)
    out = tmp_path / "gpu.json"
    status = gpu.main(
        ["--device", "cpu", "--small", "--stages", "pretrain,cpo_finetune", "--out", str(out)]
    )
    stages = json.loads(out.read_text())["stages"]
    assert status == 1 and stages["pretrain"]["error"] == "ValueError: broken on purpose"
    assert "in broken_pretrain" in stages["pretrain"]["traceback"]
    finetune = stages["cpo_finetune"]
    assert finetune["status"] == "ok", finetune["error"]
    assert finetune["figures"]["init"] == "fresh (the pretrain stage failed)"
