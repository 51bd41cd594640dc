"""Does a change of the code change what a run computes? The default pretraining and a CPO
finetuning from it, run at two commits, compared: every weight and optimiser tensor of the final
checkpoints, every dataset row, every figure of the summaries.

    python benchmarks/behaviour_unchanged.py --before 0793d03            # against HEAD's tree
    python benchmarks/behaviour_unchanged.py --before A --after B --out benchmarks/results/x.json

Each commit is checked out into a temporary git worktree and run with this interpreter (its
``PYTHONPATH`` pointing at the worktree), from the command line as users run it:
``myriad pretrain`` with the given overrides, then ``myriad finetune --algo cpo --init`` on its
output. The JSON lists every difference (key, before, after); ``identical`` is true when there is
none besides wall times and paths.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
#: Summary keys that differ between any two runs: wall times and the shares of them, places,
#: versions, and the digest of the summary file (it covers those).
VOLATILE = (
    "time",
    "seconds",
    "per_s",
    "_share",
    "steps_per",
    "run_dir",
    "path",
    "checkpoint",
    "dataset",
    "summary",
    "commit",
    "version",
    "wall",
    "date",
    "folder",
    "report",
    "plots",
    "digest",
    "init.source",
)


def run_at(commit: str, work: Path, pretrain: list[str], finetune: list[str]) -> dict[str, Path]:
    """Run the two stages at ``commit``; their run folders."""
    tree = work / f"tree-{commit}"
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), commit],
        check=True,
        capture_output=True,
    )
    env = {**os.environ, "PYTHONPATH": str(tree)}
    cli = [sys.executable, "-m", "myriad"]
    pre, fine = work / f"pretrain-{commit}", work / f"finetune-{commit}"
    try:
        for args in (
            ["pretrain", *pretrain, "--run-dir", str(pre)],
            ["finetune", "--algo", "cpo", "--init", str(pre), *finetune, "--run-dir", str(fine)],
        ):
            subprocess.run(
                [*cli, *args, "progress=false", "plots=false"],
                check=True,
                env=env,
                cwd=work,
                stdout=subprocess.DEVNULL,
            )
    finally:
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)],
            check=False,
            capture_output=True,
        )
    return {"pretrain": pre, "finetune": fine}


def _tensors(obj: Any, prefix: str = "") -> dict[str, Any]:
    """Every tensor and number of a nested checkpoint state, by dotted key."""
    out: dict[str, Any] = {}
    if isinstance(obj, dict):
        for k, v in obj.items():
            out.update(_tensors(v, f"{prefix}{k}."))
    elif isinstance(obj, list | tuple):
        for i, v in enumerate(obj):
            out.update(_tensors(v, f"{prefix}{i}."))
    elif torch.is_tensor(obj) or isinstance(obj, int | float | np.ndarray):
        out[prefix.rstrip(".")] = obj
    return out


def _same(a: Any, b: Any) -> bool:
    if torch.is_tensor(a) and torch.is_tensor(b):
        if a.shape != b.shape or a.dtype != b.dtype:
            return False
        if a.is_floating_point():  # NaN where the other has NaN is the same value here
            return bool(torch.allclose(a, b, rtol=0.0, atol=0.0, equal_nan=True))
        return bool(torch.equal(a, b))
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return np.array_equal(np.asarray(a), np.asarray(b), equal_nan=True)
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return bool(a == b)


def _show(v: Any) -> Any:
    if torch.is_tensor(v) or isinstance(v, np.ndarray):
        arr = np.asarray(v.cpu() if torch.is_tensor(v) else v, dtype=np.float64)
        return {"shape": list(arr.shape), "sum": float(arr.sum())}
    return v


def compare_checkpoints(a: Path, b: Path) -> list[dict[str, Any]]:
    """Differences between the last checkpoints of two run folders (model, optimiser, every
    state tensor and number)."""
    last = lambda run: sorted((run / "checkpoints").glob("iter_*.pt"))[-1]  # noqa: E731
    sa = _tensors(torch.load(last(a), weights_only=True)["state"])
    sb = _tensors(torch.load(last(b), weights_only=True)["state"])
    diffs = []
    for key in sorted(set(sa) | set(sb)):
        if key not in sa or key not in sb or not _same(sa[key], sb[key]):
            diffs.append(
                {
                    "key": f"checkpoint:{key}",
                    "before": _show(sa.get(key)),
                    "after": _show(sb.get(key)),
                }
            )
    return diffs


def compare_datasets(a: Path, b: Path) -> list[dict[str, Any]]:
    """Differences between the datasets of two pretraining runs (every array, row by row)."""
    diffs: list[dict[str, Any]] = []
    fa, fb = a / "dataset" / "transitions.hdf5", b / "dataset" / "transitions.hdf5"
    with h5py.File(fa, "r") as ha, h5py.File(fb, "r") as hb:
        names: set[str] = set()
        ha.visit(lambda n: names.add(n) if isinstance(ha[n], h5py.Dataset) else None)
        hb.visit(lambda n: names.add(n) if isinstance(hb[n], h5py.Dataset) else None)
        for name in sorted(names):
            if name not in ha or name not in hb:
                diffs.append({"key": f"dataset:{name}", "before": name in ha, "after": name in hb})
            elif not np.array_equal(ha[name][()], hb[name][()]):
                diffs.append(
                    {
                        "key": f"dataset:{name}",
                        "before": _show(ha[name][()]),
                        "after": _show(hb[name][()]),
                    }
                )
    return diffs


def _flat(obj: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(obj, dict):
        out: dict[str, Any] = {}
        for k, v in obj.items():
            out.update(_flat(v, f"{prefix}{k}."))
        return out
    return {prefix.rstrip("."): obj}


def compare_summaries(a: Path, b: Path) -> list[dict[str, Any]]:
    """Differences between the ``summary.json`` figures of two runs (times and paths aside)."""
    sa = _flat(json.loads((a / "summary.json").read_text()))
    sb = _flat(json.loads((b / "summary.json").read_text()))
    diffs = []
    for key in sorted(set(sa) | set(sb)):
        if any(word in key for word in VOLATILE):
            continue
        if sa.get(key, "<missing>") != sb.get(key, "<missing>"):
            diffs.append(
                {
                    "key": f"summary:{key}",
                    "before": sa.get(key, "<missing>"),
                    "after": sb.get(key, "<missing>"),
                }
            )
    return diffs


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--before", required=True, help="the commit before the change")
    p.add_argument("--after", default="HEAD", help="the commit after it (default HEAD)")
    p.add_argument(
        "--pretrain", nargs="*", default=[], help="pretraining overrides (default: none)"
    )
    p.add_argument("--finetune", nargs="*", default=[], help="finetuning overrides (default: none)")
    p.add_argument("--out", default="benchmarks/results/behaviour_unchanged.json")
    args = p.parse_args(argv)
    commits = [
        subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", c],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
        for c in (args.before, args.after)
    ]
    with tempfile.TemporaryDirectory() as tmp:
        runs = [run_at(c, Path(tmp), args.pretrain, args.finetune) for c in commits]
        diffs: dict[str, list[dict[str, Any]]] = {}
        for stage in ("pretrain", "finetune"):
            a, b = runs[0][stage], runs[1][stage]
            diffs[stage] = compare_checkpoints(a, b) + compare_summaries(a, b)
        diffs["pretrain"] += compare_datasets(runs[0]["pretrain"], runs[1]["pretrain"])
    result = {
        "before": commits[0],
        "after": commits[1],
        "pretrain_overrides": args.pretrain,
        "finetune_overrides": args.finetune,
        "identical": not any(diffs.values()),
        "ignored_summary_keys": list(VOLATILE),
        "differences": diffs,
    }
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(
        f"{commits[0]} -> {commits[1]}: "
        + (
            "identical"
            if result["identical"]
            else f"{sum(len(d) for d in diffs.values())} differences"
        )
        + f" ({args.out})"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
