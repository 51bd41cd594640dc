"""benchmarks/torchdist_finetune_throughput.py: the variants that bound the two-rank speed-up
run as described (half the envs; two processes at once) and the ceiling the docs quote is the
formula stated, computed from the runs' own figures."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location(
    "torchdist_finetune_throughput", ROOT / "benchmarks" / "torchdist_finetune_throughput.py"
)
assert spec is not None and spec.loader is not None
throughput = importlib.util.module_from_spec(spec)
spec.loader.exec_module(throughput)


def test_perfect_split_and_env_counts() -> None:
    # A half-size iteration of 0.4 s, slowed by 10% as a pair's iterations are: 0.44 s.
    assert throughput.perfect_split(one=1.0, half=0.4, pair=1.1) == pytest.approx(0.44)
    assert throughput.env_count("one_process_half", 4096) == 2048
    assert throughput.env_count("one_process_pair", 4096) == 4096
    assert throughput.env_count("two_ranks_split", 4096) == 4096


def test_the_bounding_variants_run_and_give_the_ceiling(tmp_path: Path) -> None:
    out = tmp_path / "throughput.json"
    argv = ["--algos", "ppo", "--repeats", "1", "--iterations", "4", "--num-envs", "64"]
    variants = ["one_process", "one_process_half", "one_process_pair"]
    assert throughput.main([*argv, "--variants", *variants, "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["num_envs"] == {"one_process": 64, "one_process_half": 32, "one_process_pair": 64}
    assert sorted(r["variant"] for r in result["runs"]) == sorted(variants)
    cells = result["summary"]["ppo"]
    one = cells["one_process"]["iteration_s"]
    half = cells["one_process_half"]["iteration_s"]
    pair = cells["one_process_pair"]["iteration_s"]
    assert cells["one_process"]["perfect_split_iteration_s"] == pytest.approx(half * pair / one)
    assert cells["one_process"]["ceiling_vs_one_process"] == pytest.approx(one**2 / (half * pair))
    # Half the envs: half the env steps per iteration, so fewer env steps per second than the
    # iteration time alone would say.
    half_rate = cells["one_process_half"]["steps_per_second"]
    assert half_rate == pytest.approx(32 * 32 / half, rel=0.25)


def test_paired_speedups_pair_the_runs_of_a_repeat() -> None:
    # A machine twice as fast in repeat 1: each repeat's ratio is 1.5, the medians' ratio not.
    rows = [
        {"algo": "sapg", "variant": "one_process", "repeat": 0, "steps_per_second": 100.0},
        {"algo": "sapg", "variant": "two_ranks_split", "repeat": 0, "steps_per_second": 150.0},
        {"algo": "sapg", "variant": "one_process", "repeat": 1, "steps_per_second": 200.0},
        {"algo": "sapg", "variant": "two_ranks_split", "repeat": 1, "steps_per_second": 300.0},
        {"algo": "sapg", "variant": "one_process", "repeat": 2, "steps_per_second": 210.0},
        {"algo": "sapg", "variant": "two_ranks_split", "repeat": 2, "steps_per_second": 315.0},
        {"algo": "cpo", "variant": "two_ranks_split", "repeat": 0, "steps_per_second": 1.0},
    ]
    assert throughput.paired_speedups(rows, "sapg", "two_ranks_split") == pytest.approx(
        [1.5, 1.5, 1.5]
    )
    assert throughput.paired_speedups(rows, "sapg", "one_process") == pytest.approx([1.0] * 3)
    # A repeat without its one-process run gives no pair.
    assert throughput.paired_speedups(rows, "cpo", "two_ranks_split") == []
