"""Every benchmark JSON that README.md and docs/ cite exists under benchmarks/results/, every
figure written next to a cited JSON is in it (``scripts/check_doc_figures.py``), and every
relative link of the docs reaches its page and heading."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
_SPEC = importlib.util.spec_from_file_location(
    "check_doc_figures", ROOT / "scripts" / "check_doc_figures.py"
)
assert _SPEC is not None and _SPEC.loader is not None
figures = importlib.util.module_from_spec(_SPEC)
sys.modules["check_doc_figures"] = figures
_SPEC.loader.exec_module(figures)


def cited_results() -> list[tuple[str, str]]:
    """``(page, name)`` of every backticked ``*.json`` in the docs that is not a run's file."""
    out = []
    for page in figures.pages():
        for name in figures.CITED.findall(page.read_text()):
            if figures.is_result(name):
                out.append((str(page.relative_to(ROOT)), name))
    return out


def test_every_cited_benchmark_json_exists() -> None:
    cited = cited_results()
    assert len(cited) > 50  # the docs cite their sources
    missing = [f"{page}: {name}" for page, name in cited if not figures.resolve(name)]
    assert not missing, "cited but not in benchmarks/results/:\n" + "\n".join(missing)


def test_every_figure_next_to_a_cited_json_is_in_it() -> None:
    problems = figures.check()
    assert not problems, "\n".join(problems)


def test_every_relative_link_reaches_its_page_and_heading() -> None:
    problems = figures.check_links()
    assert not problems, "\n".join(problems)


def test_the_claims_table_cites_a_json_in_every_row() -> None:
    """docs/evidence/claims.md: one row per claim, each with a verdict and its JSON."""
    rows = [
        line
        for line in (ROOT / "docs" / "evidence" / "claims.md").read_text().splitlines()
        if line.startswith("| ") and not line.startswith(("| claim", "| ---"))
    ]
    assert len(rows) >= 10
    for row in rows:
        assert figures.CITED.search(row), f"a claim without its JSON: {row}"
        verdict = row.split("|")[2]
        assert any(v in verdict for v in ("holds", "does not hold", "undecided")), row


def test_the_check_catches_a_wrong_figure_a_missing_json_and_a_dead_link(tmp_path) -> None:
    """The checker on pages written here: the right figure passes, a figure off in its last
    digit, a JSON that does not exist and a link to a missing heading are each reported."""
    page = tmp_path / "page.md"
    page.write_text(
        "# Title\n\n"
        "The mean was 1.62x one process (`torchdist_finetune_throughput.json`).\n\n"
        "| case | env-steps/s |\n| --- | --- |\n| split | 234.5k |\n\n"
        "A one-off observation, 2026-11-27, 2-core CPU: 9.99 s\n"
        "(`torchdist_finetune_throughput.json`).\n\n"
        "[up](#title)\n"
    )
    assert figures.check([page]) == [] and figures.check_links([page]) == []
    page.write_text(
        "The mean was 1.63x one process (`torchdist_finetune_throughput.json`).\n\n"
        "Cited: 0.5 (`no_such_result.json`).\n\n"
        "Caption (`torchdist_finetune_throughput.json`):\n\n"
        "| case | env-steps/s |\n| --- | --- |\n| split | 234.6k |\n\n"
        "[gone](#no-such-heading)\n"
    )
    problems = figures.check([page])
    assert any("1.63x is not in torchdist_finetune_throughput.json" in p for p in problems)
    assert any("no_such_result.json" in p for p in problems)
    assert any("234.6k is not in" in p for p in problems)
    assert figures.check_links([page]) == [f"{page}: link to a missing heading: #no-such-heading"]
