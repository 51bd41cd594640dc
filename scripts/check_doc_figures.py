"""Check the figures that README.md and docs/**/*.md write next to a cited benchmark JSON.

Three checks, all run by ``tests/test_docs_sources.py`` and from the command line
(``python scripts/check_doc_figures.py``, exit 1 with one line per problem):

1. Every backticked ``*.json`` that a page cites (other than the files a run writes, such as
   ``summary.json``) exists under ``benchmarks/results/`` (a glob pattern matches at least one).
2. In every *unit* that cites such a JSON (a table row, or a sentence of a paragraph or list
   item), every decimal figure (``0.46``, ``60.6M``, ``46.5k``, ``92.9%``, ``1.62x``) appears in
   one of the JSONs the unit cites, to the precision written: some number ``v`` of the JSON
   satisfies ``|v * scale - figure| <= half a unit of the last written digit`` (scale 1e-3 for
   ``k``, 1e-6 for ``M``, 100 or 1 for ``%``). Figures a reader cannot find in a JSON are allowed
   only where the same clause (the text between semicolons) marks them as a one-off observation,
   or where ``EXEMPT`` lists them with the reason (a ratio or difference of two JSON values).

3. Every relative link of a page reaches an existing file, and a ``#anchor`` into a Markdown page
   one of its headings.

Integers are not checked (counts such as "5 of 5" and settings such as "512 envs" are read from
the command, not from the JSON), nor text in backticks (settings, file names), link targets or
version numbers.
"""

from __future__ import annotations

import json
import math
import re
import sys
from collections.abc import Iterator
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"

#: JSON files that runs, exports and commands write (named in the docs as what a user gets), not
#: benchmark results.
RUN_FILES = frozenset(
    {
        "summary.json",
        "metadata.json",
        "behaviour.json",
        "policy.json",
        "sweep.json",
        "eval.json",
        "myriad-digest.json",
        "sweep_summary.json",
    }
)
CITED = re.compile(r"`([A-Za-z0-9_./{}<>*-]+\.json)`")
#: A decimal figure with an optional unit; not part of a dotted version (``1.2.5``) or a word.
FIGURE = re.compile(r"(?<![\w.])(-?\d+\.\d+(?:e-?\d+)?)(?![\d.]\d)\s?(k|M|x|%|ms|min)?(?![\w.]\w)")
CODE = re.compile(r"`[^`]*`")
LINK_TARGET = re.compile(r"\]\([^)]*\)")
#: Sentence ends: a full stop, question or exclamation mark followed by a space and a capital,
#: backtick, bold or bracket (a decimal point is never followed by a space).
SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z*`(\[])")
ONE_OFF = re.compile(r"one-off", re.IGNORECASE)

#: Figures a unit writes next to a JSON that the JSON does not hold as written, per page:
#: ``(page, figure)`` -> why (computed from two of its values, or read from an earlier version
#: of the file at a named commit). An entry that no unit of its page writes any more is reported,
#: so the list cannot go stale.
EXEMPT: dict[tuple[str, str], str] = {
    ("docs/evidence/benchmarks.md", "1.11x"): (
        "234.5k / 211.9k: two_ranks_split over one_process_2threads steps_per_second"
    ),
    ("docs/evidence/finetune.md", "2.33"): (
        "multiroute_targets.json as written at commit 9f27531 (summary of the 3-nat set point)"
    ),
}


def pages() -> list[Path]:
    """README.md and every Markdown page under docs/, in a stable order."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def is_result(name: str) -> bool:
    """Whether a backticked ``*.json`` names a benchmark result (not a run's file or a template)."""
    base = name.rsplit("/", 1)[-1]
    return not (base in RUN_FILES or base.startswith(".") or "<" in name or "{" in name)


def resolve(name: str) -> list[Path]:
    """The files a cited name stands for: relative to benchmarks/results/ or the repository."""
    base = name.removeprefix("benchmarks/results/")
    return sorted(set(RESULTS.glob(base)) | set(ROOT.glob(name)))


def units(text: str) -> Iterator[tuple[int, str, str, str]]:
    """``(line, unit, context, header)``: each table row, and each sentence of each paragraph or
    list item.

    ``context`` is, for a table row, the paragraph just above its table (the caption that names
    the table's JSON), else empty; ``header`` is the first row of the row's table. Fenced code
    blocks are skipped; a list item or a table row starts a new block."""
    block: list[str] = []
    start = 0
    fenced = False
    caption = ""
    in_table = False
    table_caption = ""
    header = ""

    def flush() -> Iterator[tuple[int, str, str, str]]:
        if block:
            for sentence in SENTENCE_END.split(" ".join(block)):
                yield start, sentence, "", ""

    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if stripped.startswith("|"):
            if not in_table:
                table_caption = " ".join(block) if block else caption
                header = stripped
            in_table = True
        elif stripped:
            in_table = False
        if stripped.startswith("```"):
            yield from flush()
            block, fenced, caption = [], not fenced, ""
            continue
        if fenced:
            continue
        if stripped.startswith("|"):
            yield from flush()
            block = []
            yield number, stripped, table_caption, header
            continue
        if not stripped or stripped.startswith("#") or re.match(r"^([-*]|\d+\.)\s", stripped):
            yield from flush()
            if block:
                caption = " ".join(block)
            if stripped.startswith("#"):
                caption = ""
            block = [stripped] if stripped and not stripped.startswith("#") else []
            start = number
            continue
        if not block:
            start = number
        block.append(stripped)
    yield from flush()


@cache
def numbers(path: Path) -> tuple[float, ...]:
    """Every finite number in a JSON file (nested anywhere, booleans excluded)."""
    found: list[float] = []

    def walk(node: object) -> None:
        if isinstance(node, dict):
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)
        elif isinstance(node, (int, float)) and not isinstance(node, bool):
            if math.isfinite(node):
                found.append(float(node))
        elif isinstance(node, str):
            # numbers recorded as text (a load average, a formatted rate)
            for match in re.finditer(r"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?", node):
                found.append(float(match.group()))

    walk(json.loads(path.read_text()))
    return tuple(sorted(found))


#: How a figure's unit (written after it, or in its table column's header) scales a JSON value.
UNIT_SCALES = {
    "k": (1e-3,),
    "M": (1e-6,),
    "%": (100.0, 1.0),
    "ms": (1e3, 1.0),  # a JSON in seconds
    "us": (1e6, 1.0),
    "min": (1 / 60, 1.0),
}


def precision(figure: str) -> float:
    """Half a unit of the last written digit of ``figure`` (``4.8e-7``: 0.05e-7)."""
    mantissa, _, exponent = figure.partition("e")
    return 0.5 * 10 ** (int(exponent or 0) - len(mantissa.split(".")[1])) * (1 + 1e-9)


def appears(figure: str, unit: str | None, values: tuple[float, ...]) -> bool:
    """Whether a written figure is some JSON value rounded to the digits written."""
    target = float(figure)
    half = precision(figure)
    scales = UNIT_SCALES.get(unit or "", (1.0,))
    # a figure may be written as a magnitude ("fell by 0.12") of a negative value
    return any(
        abs(v * scale - target) <= half or abs(-v * scale - target) <= half
        for scale in scales
        for v in values
    )


def column_unit(header: str) -> str | None:
    """The unit a table column's header names (``ms per step`` -> ``ms``), if any."""
    for unit in ("ms", "us", "%"):
        if re.search(rf"(?<!\w){re.escape(unit)}(?!\w)", header):
            return unit
    return None


def difference_of(figure: str, row: list[float]) -> bool:
    """Whether ``figure`` is the absolute difference of two other figures of its table row (a
    column of differences, or a ``+0.095`` written beside the two values it separates)."""
    target, half = abs(float(figure)), precision(figure)
    return any(
        abs(abs(a - b) - target) <= half + precision_of(a) + precision_of(b)
        for i, a in enumerate(row)
        for b in row[i + 1 :]
    )


def precision_of(value: float) -> float:
    """The rounding of a figure as parsed (two decimals at most in the tables checked)."""
    return 0.005


def clauses(unit: str, header: str) -> Iterator[tuple[str, str]]:
    """``(clause, column header)``: a table row's cells with their headers, or a sentence's
    clauses (split at semicolons) with no header; backticked text and link targets removed."""
    text = LINK_TARGET.sub("]", CODE.sub(" ", unit))
    if unit.startswith("|"):
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", text.strip().strip("|"))]
        heads = [h.strip() for h in re.split(r"(?<!\\)\|", header.strip().strip("|"))]
        for index, cell in enumerate(cells):
            yield cell, heads[index] if index < len(heads) else ""
    else:
        for clause in text.split(";"):
            yield clause, ""


def relative(page: Path) -> str:
    """A page's path as the problems name it: relative to the repository when inside it."""
    return str(page.relative_to(ROOT)) if page.is_relative_to(ROOT) else str(page)


def check(checked: list[Path] | None = None) -> list[str]:
    """One line per problem: a cited JSON that does not exist, or a figure not in its JSON."""
    problems: list[str] = []
    used_exempt: set[tuple[str, str]] = set()
    checked = pages() if checked is None else checked
    for page in checked:
        rel = relative(page)
        for line, unit, context, header in units(page.read_text()):
            cited = [name for name in CITED.findall(unit) if is_result(name)]
            if not cited and unit.startswith("|"):
                cited = [name for name in CITED.findall(context) if is_result(name)]
            row_figures = [float(m.group(1)) for m in FIGURE.finditer(CODE.sub(" ", unit))]
            if not cited:
                continue
            files: list[Path] = []
            for name in cited:
                found = resolve(name)
                if not found:
                    problems.append(f"{rel}:{line}: cited but not in benchmarks/results/: {name}")
                files.extend(found)
            if not files:
                continue
            values = tuple(sorted({v for path in files for v in numbers(path)}))
            for clause, column in clauses(unit, header):
                if ONE_OFF.search(clause):
                    continue
                for match in FIGURE.finditer(clause):
                    figure, suffix = match.group(1), match.group(2)
                    if appears(figure, suffix or column_unit(column), values):
                        continue
                    signed = clause[max(0, match.start() - 1) : match.start()] == "+"
                    if (signed or "difference" in column) and difference_of(figure, row_figures):
                        continue
                    written = figure + (suffix or "")
                    if (rel, written) in EXEMPT:
                        used_exempt.add((rel, written))
                        continue
                    names = ", ".join(sorted({p.name for p in files}))
                    problems.append(f"{rel}:{line}: {written} is not in {names}")
    checked_names = {relative(page) for page in checked}
    for rel, written in sorted({key for key in EXEMPT if key[0] in checked_names} - used_exempt):
        problems.append(f"{rel}: EXEMPT lists {written}, which no unit of the page writes")
    return problems


LINK = re.compile(r"\]\(([^)\s]+)\)")


def slug(heading: str) -> str:
    """GitHub's anchor for a Markdown heading: lower case, punctuation dropped, spaces to -."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """The anchors of a page's headings (outside fenced code)."""
    found, fenced = set(), False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and re.match(r"^#{1,6} ", line):
            found.add(slug(line.lstrip("#")))
    return found


def check_links(checked: list[Path] | None = None) -> list[str]:
    """One line per relative link of a page whose file, or heading anchor, does not exist."""
    problems = []
    for page in pages() if checked is None else checked:
        text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.MULTILINE | re.DOTALL)
        for target in LINK.findall(text):
            if re.match(r"^[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            file = (page.parent / path).resolve() if path else page
            if not file.exists():
                problems.append(f"{relative(page)}: link to a missing file: {target}")
            elif anchor and file.suffix == ".md" and anchor not in anchors(file):
                problems.append(f"{relative(page)}: link to a missing heading: {target}")
    return problems


def main() -> int:
    problems = check() + check_links()
    for problem in problems:
        print(problem, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
