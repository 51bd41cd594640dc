"""``myriad dataset info`` and ``myriad dataset validate``: one streaming pass over a dataset.

:func:`dataset_info` counts episodes, steps and members, measures per-member and union coverage
on the env's grid (rebuilt from the dataset's metadata) and feature ranges. :func:`validate`
checks schema, shapes, dtypes, finiteness, episode boundaries and next-observation consistency,
and returns a report whose ``ok`` decides the command's exit code.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from myriad.datasets.formats import DatasetReader, open_reader
from myriad.datasets.hdf5 import CORE_KEYS, HDF5Reader
from myriad.datasets.schema import (
    CHUNK_ROWS,
    CorruptDatasetError,
    DatasetSpec,
    IncompleteDatasetError,
    Rows,
    disk_size,
)

if TYPE_CHECKING:
    from myriad.envs.base import FeatureSpec


def env_grid(spec: DatasetSpec) -> FeatureSpec | None:
    """The features (with their coverage grid) of the env named in the metadata, or None (no
    env, no grid, other feature names, env not buildable)."""
    env_cfg = spec.env_config()
    if env_cfg is None:
        return None
    from myriad.envs import make_from_config

    try:
        env = make_from_config(env_cfg, 1, "cpu")
    except Exception:  # an env from a missing optional backend: report without coverage
        return None
    with env:
        fs = env.features
        if not fs.cells or tuple(fs.names) != tuple(spec.feature_names):
            return None
        return fs


def dataset_info(
    path: str | os.PathLike[str],
    chunk_rows: int = CHUNK_ROWS,
    goal: tuple[float, float] | None = None,
    **measure_settings: Any,
) -> dict[str, Any]:
    """Summary of a dataset and its measures (:mod:`myriad.datasets.measures`), in one
    streaming pass.

    Args:
        path: any dataset (or run folder).
        chunk_rows: rows read at a time.
        goal: ``(x, y)``: also count each member's transitions that reach it.
        measure_settings: ``action_bins``, ``k``, ``knn_samples``, ``seed`` of
            :class:`~myriad.datasets.measures.DatasetMeasures`.

    Returns:
        ``path, format, size_bytes, steps, episodes, members`` (``{member: {steps, episodes,
        coverage, sa_coverage, sa_pairs, entropy, entropy_samples[, goal_transitions]}}``),
        ``union`` (the same measures for all rows), ``coverage_union`` (None without an env
        grid), ``measure_settings``, ``feature_ranges`` (``{name: [min, max]}``),
        ``reward_range``, ``terminals``, ``timeouts``, ``env``, ``env_options``, ``obs_dim``,
        ``action_dim``.
    """
    from myriad.datasets.measures import DatasetMeasures

    reader = open_reader(path)
    try:
        spec = reader.spec
        grid = env_grid(spec)
        measures = DatasetMeasures(spec, grid, goal, **measure_settings)
        p = len(spec.feature_names)
        lo, hi = np.full(p, np.inf), np.full(p, -np.inf)
        r_lo, r_hi = np.inf, -np.inf
        steps: dict[int, int] = {}
        episodes: dict[int, int] = {}
        n_terminal = n_timeout = 0
        for rows in reader.iter_chunks(chunk_rows):
            n = len(rows["rewards"])
            if n == 0:
                continue
            member = rows["member"]
            ends = rows["terminals"] | rows["timeouts"]
            for m, c in zip(*np.unique(member, return_counts=True)):
                steps[int(m)] = steps.get(int(m), 0) + int(c)
            for m, c in zip(*np.unique(member[ends], return_counts=True)):
                episodes[int(m)] = episodes.get(int(m), 0) + int(c)
            n_terminal += int(rows["terminals"].sum())
            n_timeout += int(rows["timeouts"].sum())
            if p:
                lo = np.minimum(lo, rows["features"].min(axis=0))
                hi = np.maximum(hi, rows["features"].max(axis=0))
            r_lo = min(r_lo, float(rows["rewards"].min()))
            r_hi = max(r_hi, float(rows["rewards"].max()))
            measures.add(rows)
        measured = measures.result()
        members = {
            m: {
                "steps": steps[m],
                "episodes": episodes.get(m, 0),
                "coverage": None,
                **measured["members"].get(m, {}),
            }
            for m in sorted(steps)
        }
        union = measured["union"].get("coverage")
        return {
            "path": str(reader.path),
            "format": reader.format,
            "size_bytes": disk_size(reader.path),
            "steps": sum(steps.values()),
            "episodes": sum(episodes.values()),
            "members": members,
            "coverage_union": union,
            "union": measured["union"],
            "measure_settings": measured["settings"],
            "feature_ranges": {
                name: [float(lo[i]), float(hi[i])] for i, name in enumerate(spec.feature_names)
            }
            if steps
            else {},
            "reward_range": [r_lo, r_hi] if steps else None,
            "terminals": n_terminal,
            "timeouts": n_timeout,
            "env": spec.metadata.get("env"),
            "env_options": spec.metadata.get("env_options"),
            "obs_dim": spec.obs_dim,
            "action_dim": spec.action_dim,
        }
    finally:
        reader.close()


# -- validation --------------------------------------------------------------------------------
@dataclass
class ValidationReport:
    """Outcome of :func:`validate`: one line per check, ``ok`` when all passed."""

    path: str
    checks: list[tuple[str, bool, str]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(passed for _, passed, _ in self.checks)

    def add(self, name: str, problems: list[str]) -> None:
        shown = "; ".join(problems[:5]) + (
            f" (+{len(problems) - 5} more)" if len(problems) > 5 else ""
        )
        self.checks.append((name, not problems, shown))

    def text(self) -> str:
        lines = [f"{self.path}: {'valid' if self.ok else 'INVALID'}"]
        for name, passed, detail in self.checks:
            lines.append(
                f"  {'ok  ' if passed else 'FAIL'} {name}" + ("" if passed else f": {detail}")
            )
        return "\n".join(lines)


class _Checker:
    """Streaming checks with a one-row carry across chunk boundaries."""

    def __init__(self, spec: DatasetSpec) -> None:
        self.spec = spec
        self.fields = spec.fields()
        self.problems: dict[str, list[str]] = {
            "schema, shapes and dtypes": [],
            "finite values": [],
            "episode boundaries": [],
            "next_observations continue within episodes": [],
            "one member per episode": [],
        }
        self.offset = 0
        self.prev: Rows | None = None  # last row of the previous chunk

    def _note(self, check: str, message: str) -> None:
        if len(self.problems[check]) < 50:
            self.problems[check].append(message)

    def chunk(self, rows: Rows) -> None:
        n = len(rows.get("observations", ()))
        schema_ok = True
        for key, (shape, dtype) in self.fields.items():
            value = rows.get(key)
            if value is None:
                self._note("schema, shapes and dtypes", f"missing {key}")
                schema_ok = False
            elif value.shape != (n, *shape):
                self._note(
                    "schema, shapes and dtypes",
                    f"{key} has shape {value.shape[1:]} per row, expected {shape}",
                )
                schema_ok = False
            elif value.dtype != dtype:
                self._note("schema, shapes and dtypes", f"{key} is {value.dtype}, expected {dtype}")
        if not schema_ok or n == 0:
            self.offset += n
            return
        for key in ("observations", "actions", "rewards", "next_observations", "features"):
            bad = ~np.isfinite(rows[key].reshape(n, -1)).all(axis=1)
            if bad.any():
                first = self.offset + int(np.argmax(bad))
                self._note(
                    "finite values",
                    f"{key}: {int(bad.sum())} rows with NaN/inf (first row {first})",
                )
        rows_ext = rows
        base = self.offset
        if self.prev is not None:
            rows_ext = {k: np.concatenate([self.prev[k], rows[k]]) for k in self.fields}
            base -= 1
        ends = rows_ext["terminals"] | rows_ext["timeouts"]
        cont = ~ends[:-1]  # row i continues into row i + 1
        same = (rows_ext["next_observations"][:-1] == rows_ext["observations"][1:]).all(axis=1)
        broken = np.flatnonzero(cont & ~same)
        for i in broken[:5]:
            self._note(
                "next_observations continue within episodes",
                f"row {base + i} is not an episode end but its next_observations differ from row "
                f"{base + i + 1}'s observations (a missing terminal/timeout, or rows out of order)",
            )
        switch = np.flatnonzero(cont & (rows_ext["member"][:-1] != rows_ext["member"][1:]))
        for i in switch[:5]:
            self._note(
                "one member per episode",
                f"the member changes between rows {base + i} and {base + i + 1} inside an episode",
            )
        self.prev = {k: v[-1:] for k, v in rows.items() if k in self.fields}
        self.offset += n

    def finish(self, report: ValidationReport, total_rows: int) -> None:
        if self.prev is not None and not (self.prev["terminals"][0] or self.prev["timeouts"][0]):
            self._note(
                "episode boundaries",
                f"the last row ({total_rows - 1}) has neither terminal nor timeout: the "
                "dataset ends inside an episode",
            )
        for name, problems in self.problems.items():
            report.add(name, problems)


def validate(path: str | os.PathLike[str], chunk_rows: int = CHUNK_ROWS) -> ValidationReport:
    """Check a dataset in one streaming pass; never raises for a bad dataset (the report says
    what is wrong)."""
    report = ValidationReport(str(path))
    try:
        reader = open_reader(path)
    except IncompleteDatasetError as exc:
        report.add("complete (the writer finished)", [str(exc)])
        return report
    except CorruptDatasetError as exc:  # Minari: every block is checked when it is opened
        report.add("checksums of every chunk", [str(exc)])
        return report
    except (OSError, ValueError, KeyError) as exc:
        report.add("readable", [f"{type(exc).__name__}: {exc}"])
        return report
    report.path = str(reader.path)
    report.add("complete (the writer finished)", [])
    try:
        layout = _layout_problems(reader)
        report.add("layout (columns of equal length)", layout)
        if layout:
            return report
        checker = _Checker(reader.spec)
        for rows in _safe_chunks(reader, chunk_rows, report):
            checker.chunk(rows)
        checker.finish(report, checker.offset)
        if reader.format == "zarr":
            try:
                meta = _zarr_meta(reader)
            except CorruptDatasetError as exc:
                meta = [str(exc)]
            report.add("meta/episode_ends and meta/member match the rows", meta)
    finally:
        reader.close()
    return report


def _safe_chunks(
    reader: DatasetReader, chunk_rows: int, report: ValidationReport
) -> Iterator[Rows]:
    try:
        yield from reader.iter_chunks(chunk_rows)
    except CorruptDatasetError as exc:
        report.add("checksums of every chunk", [str(exc)])
    except (OSError, ValueError, KeyError) as exc:
        report.add("readable", [f"{type(exc).__name__}: {exc}"])


def _layout_problems(reader: DatasetReader) -> list[str]:
    """Columns whose lengths disagree (HDF5 and zarr store columns separately)."""
    lengths: dict[str, int] = {}
    if reader.format == "hdf5":
        import h5py

        assert isinstance(reader, HDF5Reader)  # the reader of format "hdf5"
        f = reader.file
        f.visititems(
            lambda k, v: lengths.__setitem__(k, v.shape[0]) if isinstance(v, h5py.Dataset) else None
        )
        # infos/ is myriad's (members, features); files of other tools may lack it.
        missing = [k for k in CORE_KEYS if k not in lengths]
        if missing:
            return [f"missing datasets {missing}"]
    elif reader.format == "zarr":
        from myriad.datasets.zarr_store import ZarrReader

        assert isinstance(reader, ZarrReader)  # the reader of format "zarr"
        lengths = {f"data/{k}": int(a.shape[0]) for k, a in reader.arrays.items()}
    if len(set(lengths.values())) > 1:
        n = reader.num_rows
        return [f"{k} has {v} rows, observations {n}" for k, v in lengths.items() if v != n]
    return []


def _zarr_meta(reader: Any) -> list[str]:
    ends = reader.episode_ends()
    problems = []
    expected: list[np.ndarray] = []
    members: list[np.ndarray] = []
    offset = 0
    for rows in reader.iter_chunks():
        local = np.flatnonzero(rows["terminals"] | rows["timeouts"])
        expected.append(local + offset + 1)
        members.append(rows["member"][local])
        offset += len(rows["rewards"])
    exp = np.concatenate(expected) if expected else np.zeros(0, np.int64)
    if not np.array_equal(ends, exp):
        problems.append(
            f"meta/episode_ends has {len(ends)} entries, the terminals/timeouts give "
            f"{len(exp)} (or the values differ)"
        )
    meta_member = reader.root["meta/member"][:]
    got = np.concatenate(members) if members else np.zeros(0, np.int32)
    if len(meta_member) != len(got) or not np.array_equal(meta_member, got):
        problems.append("meta/member differs from the member of each episode's rows")
    return problems


def info_text(info: dict[str, Any]) -> str:
    """Human-readable rendering of :func:`dataset_info`."""

    def pct(x: float | None) -> str:
        return "-" if x is None else f"{100 * x:.1f}%"

    def ent(x: float | None) -> str:
        return "-" if x is None else f"{x:.3f}"

    def measures(d: dict[str, Any]) -> str:
        text = (
            f"coverage {pct(d.get('coverage')):>6}  state-action {pct(d.get('sa_coverage')):>6}  "
            f"entropy {ent(d.get('entropy')):>7}"
        )
        if "goal_transitions" in d:
            text += f"  goal {d['goal_transitions']:,}"
        return text

    size = info["size_bytes"]
    settings = info.get("measure_settings") or {}
    lines = [
        f"{info['path']}  ({info['format']}, {size / 2**20:.1f} MiB on disk)",
        f"  env           {info['env']}  options {info['env_options'] or {}}",
        f"  steps         {info['steps']:,}",
        f"  episodes      {info['episodes']:,}  (terminals {info['terminals']:,}, "
        f"timeouts {info['timeouts']:,})",
        f"  obs / action  {info['obs_dim']} / {info['action_dim']}",
        f"  rewards       {info['reward_range']}",
        "  feature ranges "
        + ", ".join(f"{k} [{lo:.3g}, {hi:.3g}]" for k, (lo, hi) in info["feature_ranges"].items()),
        f"  measures      over every row of the dataset (the whole run, not the final "
        "population); state-action: "
        f"{settings.get('action_bins')} bins per action dim; "
        f"entropy: k={settings.get('k')} on {settings.get('knn_samples'):,} sampled states"
        + (f"; goal {tuple(settings['goal'])}" if settings.get("goal") else ""),
        f"  union         {measures(info.get('union') or {'coverage': info['coverage_union']})}",
        f"  members       {len(info['members'])}",
    ]
    for m, d in info["members"].items():
        lines.append(
            f"    member {m:>3}: {d['steps']:>10,} steps {d['episodes']:>7,} episodes  "
            + measures(d)
        )
    return "\n".join(lines)
