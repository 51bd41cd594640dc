"""benchmarks/cpu_matmul.py: the figures the docs quote (median wall times, speed-ups, the
pretraining quality per seed) are computed from the runs as stated, checked by hand."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("cpu_matmul", ROOT / "benchmarks" / "cpu_matmul.py")
assert spec is not None and spec.loader is not None
cpu_matmul = importlib.util.module_from_spec(spec)
spec.loader.exec_module(cpu_matmul)


def _run(job: str, variant: str, rnd: int, wall: float, **extra: float) -> dict:
    return {"job": job, "variant": variant, "round": rnd, "wall_time_s": wall, **extra}


def test_medians_speed_up_and_quality_per_seed() -> None:
    runs = [
        _run("pretrain", "onednn", 0, 20.0, eval_entropy_collective=3.2, eval_coverage_union=0.9),
        _run("pretrain", "blas", 0, 26.0, eval_entropy_collective=3.3, eval_coverage_union=1.0),
        _run("pretrain", "blas", 1, 24.0, eval_entropy_collective=3.3, eval_coverage_union=1.0),
        _run("pretrain", "onednn", 1, 22.0, eval_entropy_collective=3.2, eval_coverage_union=0.9),
        _run("finetune-ppo", "onednn", 0, 10.0),
        _run("finetune-ppo", "blas", 0, 13.0),
        _run("finetune-ppo", "onednn", 1, 11.0),
        _run("finetune-ppo", "blas", 1, 12.0),
        _run("finetune-ppo", "onednn", 2, 30.0),  # an outlier the median ignores
        _run("finetune-ppo", "blas", 2, 12.5),
    ]
    quality = [
        {
            "variant": "onednn",
            "seed": 1,
            "eval_entropy_collective": 3.1,
            "eval_coverage_union": 0.95,
        },
        {"variant": "blas", "seed": 1, "eval_entropy_collective": 2.9, "eval_coverage_union": 0.92},
    ]
    summary = cpu_matmul.summarize(["pretrain", "finetune-ppo"], runs, quality)
    assert summary["pretrain"]["wall_time_s"] == {"onednn": 21.0, "blas": 25.0}
    assert summary["pretrain"]["speed_up"] == pytest.approx(25.0 / 21.0)
    assert summary["finetune-ppo"]["wall_time_s"] == {"onednn": 11.0, "blas": 12.5}
    assert summary["finetune-ppo"]["speed_up"] == pytest.approx(12.5 / 11.0)
    assert summary["pretrain"]["per_seed"] == {
        "onednn": {
            "seed": [0, 1],
            "eval_entropy_collective": [3.2, 3.1],
            "eval_coverage_union": [0.9, 0.95],
        },
        "blas": {
            "seed": [0, 1],
            "eval_entropy_collective": [3.3, 2.9],
            "eval_coverage_union": [1.0, 0.92],
        },
    }
    assert "per_seed" not in summary["finetune-ppo"]


def test_the_committed_json_is_its_runs_summarized() -> None:
    data = json.loads((ROOT / "benchmarks" / "results" / "cpu_matmul.json").read_text())
    jobs = list(data["jobs"])
    assert cpu_matmul.summarize(jobs, data["runs"], data["quality_runs"]) == data["summary"]
