"""benchmarks/ppo_sparse_components.py: its records, and the committed summaries recounted from
their runs with the tests written out here (exact binomial and hypergeometric sums)."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULTS = [
    ROOT / "benchmarks/results/ppo_sparse_components.json",
    ROOT / "benchmarks/results/ppo_sparse_components_96.json",
    ROOT / "benchmarks/results/ppo_sparse_components_96_single.json",
]


def _module():
    path = ROOT / "benchmarks/ppo_sparse_components.py"
    spec = importlib.util.spec_from_file_location("ppo_sparse_components", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _mcnemar_exact(b: int, c: int) -> float:
    """Two-sided exact McNemar: twice the smaller binomial tail of b + c fair coin flips."""
    n = b + c
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, k) for k in range(min(b, c) + 1)) / 2**n
    return min(1.0, 2 * tail)


def _fisher_two_sided(a: int, n1: int, b: int, n2: int) -> float:
    """Fisher's exact test: the probability of every table no likelier than the observed one."""
    total, k = n1 + n2, a + b

    def p(x: int) -> float:
        return math.comb(n1, x) * math.comb(n2, k - x) / math.comb(total, k)

    observed = p(a)
    support = range(max(0, k - n2), min(k, n1) + 1)
    return sum(p(x) for x in support if p(x) <= observed * (1 + 1e-7))


@pytest.mark.parametrize("path", RESULTS, ids=lambda p: p.name)
def test_committed_summary_recounts_from_its_runs(path):
    result = json.loads(path.read_text())
    runs, summary, threshold = result["runs"], result["summary"], result["reached_threshold"]
    reached = {}
    for case, stats in summary["cases"].items():
        mine = [r for r in runs if r["case"] == case]
        for r in mine:
            last = r["train_success"][-result["last_iterations"] :]
            assert r["final_train_success"] == pytest.approx(sum(last) / len(last))
        reached[case] = {r["seed"] for r in mine if r["final_train_success"] >= threshold}
        assert set(stats["reached"]) == reached[case]
        assert stats["seeds"] == len(mine)
    for pair, p in summary["fisher_p"].items():
        a, b = pair.split(" vs ")
        n1, n2 = summary["cases"][a]["seeds"], summary["cases"][b]["seeds"]
        assert p == pytest.approx(_fisher_two_sided(len(reached[a]), n1, len(reached[b]), n2))
    for pair, test in summary["mcnemar_exact"].items():
        a, b = pair.split(" vs ")
        only_a, only_b = len(reached[a] - reached[b]), len(reached[b] - reached[a])
        assert (test["only_first"], test["only_second"]) == (only_a, only_b)
        assert test["p"] == pytest.approx(_mcnemar_exact(only_a, only_b))


def test_a_run_records_its_curve_and_scores(tmp_path):
    module = _module()
    record = module.run_myriad("default", 0, 2, tmp_path)
    assert len(record["train_success"]) == 2
    assert record["final_train_success"] == pytest.approx(sum(record["train_success"]) / 2)
    assert 0.0 <= record["final_leader_success"] <= 1.0
    assert record["final_log_std"] < 0.0  # myriad's default initial log std is -0.5


def test_paired_test_counts_only_discordant_seeds():
    module = _module()
    runs = [
        {
            "case": case,
            "seed": seed,
            "final_train_success": value,
            "first_success_iteration": 0,
            "final_log_std": -0.5,
            "final_leader_success": value,
        }
        for case, values in {"default": [1, 1, 0, 0, 0], "std_1": [1, 1, 1, 1, 1]}.items()
        for seed, value in enumerate(values)
    ]
    test = module.summarise(runs)["mcnemar_exact"]["default vs std_1"]
    assert (test["only_first"], test["only_second"]) == (0, 3)
    assert test["p"] == pytest.approx(0.25)  # 2 x (1/2)^3
