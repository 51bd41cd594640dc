"""Every benchmark JSON that README.md and docs/ cite exists under benchmarks/results/ (a figure
in the docs traces to a file a script wrote)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
#: JSON files that runs, exports and commands write (named in the docs as what a user gets), not
#: benchmark results.
RUN_FILES = {
    "summary.json",
    "metadata.json",
    "behaviour.json",
    "policy.json",
    "sweep.json",
    "eval.json",
    "myriad-digest.json",
    "sweep_summary.json",
}
CITED = re.compile(r"`([A-Za-z0-9_./{}<>*-]+\.json)`")


def cited_results() -> list[tuple[str, str]]:
    """``(page, name)`` of every backticked ``*.json`` in the docs that is not a run's file."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    out = []
    for page in pages:
        for name in CITED.findall(page.read_text()):
            base = name.rsplit("/", 1)[-1]
            if base in RUN_FILES or base.startswith(".") or "<" in name or "{" in name:
                continue
            out.append((str(page.relative_to(ROOT)), name))
    return out


def test_every_cited_benchmark_json_exists() -> None:
    cited = cited_results()
    assert len(cited) > 50  # the docs cite their sources
    missing = []
    for page, name in cited:
        base = name.removeprefix("benchmarks/results/")
        if not list(RESULTS.glob(base)) and not list(ROOT.glob(name)):
            missing.append(f"{page}: {name}")
    assert not missing, "cited but not in benchmarks/results/:\n" + "\n".join(missing)
