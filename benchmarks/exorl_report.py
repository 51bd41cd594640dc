"""Aggregation of ``benchmarks/exorl.py``'s finished runs: ``exorl.json`` and ``exorl.png``.

Per (env, learner, dataset size, data source): the success rate over the goals per seed, its
IQM and mean with 95% stratified bootstrap intervals over seeds (rliable,
``seed_statistics.iqm_and_mean``), the same for the progress towards the goals (``1 -`` closest
geodesic distance / distance from the start, :func:`exorl.evaluate`), success, progress and
closest distance per goal against the goal's distance from the start, the learning curve
(success and progress against gradient steps, mean over seeds), and the dataset measures
of ``myriad dataset info`` (coverage, state-action coverage, k-NN entropy of the union and the
mean over members, goal-reaching transitions per goal), averaged over the seeds' datasets: as
each run recorded them, else read from its dataset (``--store-measures`` records them), else
kept from the last report where the cell's seeds are the same.
Only finished runs count; the JSON lists how many seeds each cell has.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
from seed_statistics import iqm_and_mean

SOURCES = ("kmyriad", "single", "independent", "random")


def load_runs(folder: Path) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))]


#: The dataset measures a run records when it is made (``exorl.py``), so that a report never
#: needs the datasets themselves: its own dataset's, and those of the whole pretraining run that
#: dataset was drawn from (none for random actions).
MEASURES = ("dataset_measures", "pretraining_dataset_measures")


def dataset_measures(path: str) -> dict[str, Any] | None:
    """Union and member-mean measures of one dataset file (None when the file is gone)."""
    from myriad.datasets import dataset_info

    if not Path(path).is_file():
        return None
    info = dataset_info(path)
    members = list(info["members"].values())
    out = {
        "union": {k: info["union"].get(k) for k in ("coverage", "sa_coverage", "entropy")},
        "member_mean": {
            k: float(np.mean([m[k] for m in members])) if members else None
            for k in ("coverage", "sa_coverage", "entropy")
        },
        "members": len(members),
        # How many members cover a covered cell on average (1: disjoint members, M: identical).
        "overlap": float(sum(m["coverage"] for m in members) / info["union"]["coverage"])
        if members and info["union"].get("coverage")
        else None,
    }
    return out


def pretraining_dataset(dataset: str, source: str) -> Path:
    """The whole pretraining run's dataset (every iteration) that a run's dataset was drawn from."""
    return Path(dataset).parent.parent / source / "dataset" / "transitions.hdf5"


def read_measures(dataset: str, source: str) -> dict[str, Any]:
    """:data:`MEASURES` of a run's dataset, read from the files (None where one is gone)."""
    return {
        "dataset_measures": dataset_measures(dataset),
        "pretraining_dataset_measures": dataset_measures(str(pretraining_dataset(dataset, source))),
    }


def file_sha256(path: str | Path) -> str:
    """The SHA-256 of a file's bytes (hex)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def dataset_mismatch(run: dict[str, Any], path: str) -> str | None:
    """Why the file at ``path`` is not the dataset ``run`` trained on, or None when it is.

    A dataset path names a (env, seed, source, size), not one file: a rebuilt dataset of the same
    seed lies at the same path and may differ (pretraining's floats differ between machines), and
    its measures are not the run's. A run that recorded its dataset's SHA-256 is checked against
    it; an older run against what it recorded of its data: the number of transitions and, per
    goal, of transitions that reach the goal."""
    if "dataset_sha256" in run:
        digest = file_sha256(path)
        if digest == run["dataset_sha256"]:
            return None
        return f"its SHA-256 is {digest[:12]}..., the run's {run['dataset_sha256'][:12]}..."
    from myriad.datasets import load, relabel

    data = load(path)
    radius = run["settings"].get("goal_radius")
    reaching = [
        int(relabel(data, "sparse", tuple(g), radius).terminals.sum()) for g in run["goals"]
    ]
    if len(data) == run["transitions"] and reaching == run["goal_reaching_transitions"]:
        return None
    return (
        f"it holds {len(data)} transitions, {reaching} reaching the goals; the run's data held "
        f"{run['transitions']}, {run['goal_reaching_transitions']}"
    )


def own_dataset(run: dict[str, Any]) -> bool:
    """Whether the run's dataset is on this machine and is the one it trained on (a line on
    stderr where a file lies at its path but is another dataset)."""
    if not Path(run["dataset"]).is_file():
        return False
    why = dataset_mismatch(run, run["dataset"])
    if why is not None:
        print(f"{run['run']}: {run['dataset']} is not this run's dataset ({why})", file=sys.stderr)
    return why is None


def run_measures(run: dict[str, Any], cache: dict[str, Any]) -> dict[str, Any] | None:
    """A run's :data:`MEASURES`: those it recorded, else read from its datasets where they are
    on this machine (and are its own: :func:`dataset_mismatch`), else None."""
    if all(k in run for k in MEASURES):
        return {k: run[k] for k in MEASURES}
    if not own_dataset(run):
        return None
    if run["dataset"] not in cache:
        cache[run["dataset"]] = read_measures(run["dataset"], run["source"])
    return cache[run["dataset"]]


def store_measures(folder: Path) -> int:
    """Write :data:`MEASURES` into the finished runs of ``folder`` that predate them: read from
    their datasets where these are on this machine and are theirs (:func:`dataset_mismatch`), else
    taken from the last report
    (``<folder>/../../exorl.json``) where the run's cell held its seed alone (a cell's measures
    are the mean over its seeds' datasets, so there they are this run's own). Returns how many
    runs were completed."""
    from myriad.utils.checkpoint import atomic_write_text

    report = folder.parent.parent / f"{folder.parent.name}.json"
    previous = json.loads(report.read_text())["table"] if report.is_file() else {}
    done = 0
    for path in sorted(folder.glob("*.json")):
        run = json.loads(path.read_text())
        if all(k in run for k in MEASURES):
            continue
        if own_dataset(run):
            run.update(read_measures(run["dataset"], run["source"]))
        else:
            key = f"{run['env']}/{run['learner']}/n{run['size']}"
            cell = previous.get(key, {}).get(run["source"])
            if cell is None or cell["seeds"] != [run["seed"]]:
                continue
            run["dataset_measures"] = cell["dataset_measures_mean"]
            run["pretraining_dataset_measures"] = cell["pretraining_dataset_measures_mean"]
            run["measures_from"] = f"{report.name}, {key} {run['source']} (this seed alone)"
        atomic_write_text(path, json.dumps(run, indent=1))
        done += 1
    return done


def mean_dicts(items: list[dict[str, Any]]) -> dict[str, Any]:
    keys = items[0].keys()
    return {
        k: (
            mean_dicts([i[k] for i in items])
            if isinstance(items[0][k], dict)
            else float(np.mean([i[k] for i in items]))
            if items[0][k] is not None
            else None
        )
        for k in keys
    }


def remedies(every: list[dict[str, Any]], protocol: list[dict[str, Any]]) -> dict[str, Any]:
    """The remedies of ``exorl.py --sources`` run on two seeds or more: per (env, learner, size,
    remedy) the success's IQM and mean with 95% intervals over its seeds, and beside it, seed by
    seed, K-Myriad's (beta 1) run of the same cell: the paired differences, in how many seeds
    the remedy is higher and lower, and the exact two-sided sign test of those counts."""
    from scipy.stats import binomtest

    population = {
        (r["env"], r["learner"], r["size"], r["seed"]): r["success"]
        for r in protocol
        if r["source"] == "kmyriad"
    }
    cells: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
    for r in every:
        if r["source"] not in SOURCES:
            cells[(r["env"], r["learner"], r["size"], r["source"])].append(r)
    out: dict[str, Any] = {}
    for (env, learner, size, source), rs in sorted(cells.items()):
        rs = sorted(rs, key=lambda r: r["seed"])
        if len(rs) < 2:
            continue
        stats = iqm_and_mean({source: np.array([[r["success"]] for r in rs])}, reps=2000)[source]
        pairs = [
            (r["seed"], r["success"], population[(env, learner, size, r["seed"])])
            for r in rs
            if (env, learner, size, r["seed"]) in population
        ]
        higher = sum(a > b for _, a, b in pairs)
        lower = sum(a < b for _, a, b in pairs)
        out.setdefault(f"{env}/{learner}/n{size}", {})[source] = {
            **stats,
            "seeds": [r["seed"] for r in rs],
            "kmyriad_same_seeds": [b for _, _, b in pairs],
            "difference_to_kmyriad": [a - b for _, a, b in pairs],
            "higher_than_kmyriad": higher,
            "lower_than_kmyriad": lower,
            "sign_test_p": float(binomtest(higher, higher + lower).pvalue)
            if higher + lower
            else 1.0,
        }
    return out


def report(args: argparse.Namespace) -> dict[str, Any]:
    out = Path(args.out)
    # The remedies' runs (exorl.py --sources) are one seed's diagnosis, reported by
    # benchmarks/exorl_why.py, not sources of the protocol.
    runs = [r for r in load_runs(out / "runs") if r["source"] in SOURCES]
    if not runs:
        raise SystemExit(f"no finished runs under {out / 'runs'}")
    cells: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
    for r in runs:
        cells[(r["env"], r["learner"], r["size"], r["source"])].append(r)
    target = out.parent / f"{out.name}.json"
    # A cell whose runs neither recorded their measures nor have their datasets here keeps the
    # measures of the last report where its seeds are the same (the same datasets); otherwise the
    # report would replace them with nothing.
    previous = json.loads(target.read_text())["table"] if target.is_file() else {}
    measures_cache: dict[str, Any] = {}
    measures: dict[tuple, list[dict[str, Any] | None]] = {}
    carried: dict[tuple, dict[str, Any]] = {}
    missing: list[str] = []
    for cell, rs in cells.items():
        rs.sort(key=lambda r: r["seed"])
        measures[cell] = [run_measures(r, measures_cache) for r in rs]
        if all(m is not None for m in measures[cell]):
            continue
        env, learner, size, source = cell
        before = previous.get(f"{env}/{learner}/n{size}", {}).get(source)
        if before is not None and before["seeds"] == [r["seed"] for r in rs]:
            carried[cell] = before
        else:
            missing += [r["dataset"] for r, m in zip(rs, measures[cell]) if m is None]
    if missing and not getattr(args, "allow_missing_datasets", False):
        raise SystemExit(
            f"{len(missing)} of {len(runs)} runs' datasets are not on this machine and their "
            f"measures are not recorded (first: {missing[0]}), so their coverage and entropy "
            "would be lost from the report; run `exorl.py --store-measures` where they are "
            "(exorl.py's --work) or pass --allow-missing-datasets"
        )
    table: dict[str, Any] = {}
    for (env, learner, size, source), rs in sorted(cells.items()):
        key = f"{env}/{learner}/n{size}"
        scores = {source: np.array([[r["success"]] for r in rs])}
        stats = iqm_and_mean(scores, reps=2000)[source]
        progress = iqm_and_mean({source: np.array([[r["progress"]] for r in rs])}, reps=2000)
        per_goal = np.array([r["success_per_goal"] for r in rs])
        curve_steps = [c["step"] for c in rs[0]["curve"]]
        full = [r for r in rs if len(r["curve"]) == len(curve_steps)]
        curves = np.array([[np.mean(c["success_per_goal"]) for c in r["curve"]] for r in full])
        progress_curves = np.array(
            [[np.mean(c["progress_per_goal"]) for c in r["curve"]] for r in full]
        )
        cell = (env, learner, size, source)
        found = [m["dataset_measures"] for m in measures[cell] if m and m["dataset_measures"]]
        pre = [
            m["pretraining_dataset_measures"]
            for m in measures[cell]
            if m and m["pretraining_dataset_measures"]
        ]
        row = table.setdefault(key, {})[source] = {
            **stats,
            "seeds": [r["seed"] for r in rs],
            "success_per_goal_mean": per_goal.mean(0).tolist(),
            "progress": progress[source],
            "progress_per_goal_mean": np.mean([r["progress_per_goal"] for r in rs], 0).tolist(),
            "closest_cells_per_goal_mean": np.mean(
                [r["closest_cells_per_goal"] for r in rs], 0
            ).tolist(),
            "goal_distances_from_start": rs[0]["goal_distances_from_start"],
            "goals": rs[0]["goals"],
            "goal_reaching_transitions_mean": np.mean(
                [r["goal_reaching_transitions"] for r in rs], 0
            ).tolist(),
            "curve_steps": curve_steps,
            "curve_success_mean": curves.mean(0).tolist() if len(curves) else [],
            "curve_progress_mean": progress_curves.mean(0).tolist() if len(curves) else [],
            "gradient_steps": rs[0]["steps"],
            "train_minutes_mean": float(np.mean([r["train_s"] for r in rs]) / 60),
            "train_cpu_minutes_mean": float(np.mean([r["train_cpu_s"] for r in rs]) / 60),
            "dataset_measures_mean": mean_dicts(found) if found else None,
            "pretraining_dataset_measures_mean": mean_dicts(pre) if pre else None,
        }
        if cell in carried:
            for k in ("dataset_measures_mean", "pretraining_dataset_measures_mean"):
                row[k] = carried[cell][k]
    result = {
        "benchmark": "exorl",
        "protocol": "benchmarks/exorl.py docstring",
        "settings": runs[0]["settings"],
        "finished_runs": len(runs),
        "table": table,
        "remedies": remedies(load_runs(out / "runs"), runs),
    }
    target.write_text(json.dumps(result, indent=1))
    plot(result, target.with_suffix(".png"))
    nan = float("nan")
    for key, row in table.items():
        print(key)
        for source, s in row.items():
            m = s["dataset_measures_mean"] or {}
            u, mm = m.get("union") or {}, m.get("member_mean") or {}
            lo, hi = s["iqm_ci95"]
            goals = [round(x, 2) for x in s["success_per_goal_mean"]]
            prog = [round(x, 2) for x in s["progress_per_goal_mean"]]
            reach = [round(x) for x in s["goal_reaching_transitions_mean"]]
            print(
                f"  {source:12s} IQM {s['iqm']:.3f} [{lo:.3f}, {hi:.3f}] mean {s['mean']:.3f} "
                f"seeds {s['seeds']} per goal {goals} progress {s['progress']['iqm']:.3f} "
                f"per goal {prog} goal rows {reach} | coverage "
                f"{u.get('coverage', nan):.3f} (members {mm.get('coverage', nan):.3f}, "
                f"overlap {m.get('overlap') or nan:.2f}) sa {u.get('sa_coverage', nan):.3f} "
                f"entropy {u.get('entropy', nan):.2f}"
            )
    print(f"wrote {target} and .png ({len(runs)} finished runs)")
    return result


def plot(result: dict[str, Any], path: Path) -> None:
    """Per env and learner (columns): success per goal against its distance, IQM bars with 95%
    intervals, learning curves; last column: maze TD3 success against dataset size, and the
    datasets' coverage (union and member mean)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    table = result["table"]
    main_keys = [k for k in table if k.endswith(f"n{result['settings']['size']}")]
    cols = len(main_keys) + 1
    fig, axes = plt.subplots(3, cols, figsize=(4.0 * cols, 10), squeeze=False)
    colours = {s: f"C{i}" for i, s in enumerate(SOURCES)}
    for j, key in enumerate(main_keys):
        ax, bx, cx = axes[0, j], axes[1, j], axes[2, j]
        for source, s in table[key].items():
            ax.plot(
                s["goal_distances_from_start"],
                s["success_per_goal_mean"],
                "o-",
                color=colours[source],
                label=f"{source} ({len(s['seeds'])} seeds)",
            )
            ax.plot(
                s["goal_distances_from_start"], s["progress_per_goal_mean"], "x--",
                color=colours[source], alpha=0.6,
            )  # fmt: skip
            if s["curve_success_mean"]:
                cx.plot(s["curve_steps"], s["curve_success_mean"], "o-", color=colours[source])
                cx.plot(s["curve_steps"], s["curve_progress_mean"], "x--", color=colours[source],
                        alpha=0.6)  # fmt: skip
        ax.set_title(f"{key}: success (o) and progress (x) per goal", fontsize=9)
        ax.set_xlabel("goal distance from start (cells)", fontsize=8)
        ax.set_ylim(-0.02, 1.02)
        ax.legend(fontsize=7)
        names = list(table[key])
        iqm = np.array([table[key][n]["iqm"] for n in names])
        lo = iqm - np.array([table[key][n]["iqm_ci95"][0] for n in names])
        hi = np.array([table[key][n]["iqm_ci95"][1] for n in names]) - iqm
        bx.bar(names, iqm, yerr=[lo, hi], capsize=4, color=[colours[n] for n in names])
        bx.set_ylim(0, 1)
        bx.set_title(f"{key}: IQM success over goals, 95% CI", fontsize=9)
        bx.tick_params(labelsize=7)
        cx.set_title(f"{key}: success (o), progress (x) vs gradient steps", fontsize=9)
        cx.xaxis.set_major_formatter(plt.FuncFormatter(lambda v, _: f"{v / 1000:.0f}k"))
        cx.set_ylim(-0.02, 1.02)
    sizes: dict[str, dict[int, float]] = defaultdict(dict)
    for key, row in table.items():
        env, learner, n = key.split("/")
        if env == "maze" and learner == "td3":
            for source, s in row.items():
                sizes[source][int(n[1:])] = s["mean"]
    ax = axes[0, -1]
    for source, pts in sizes.items():
        xs = sorted(pts)
        ax.plot(xs, [pts[x] for x in xs], "o-", color=colours[source], label=source)
    ax.set_xscale("log")
    ax.set_xlabel("transitions", fontsize=8)
    ax.set_ylim(-0.02, 1.02)
    ax.set_title("maze, TD3: mean success vs dataset size", fontsize=9)
    # The datasets' measures beside the results: union and member-mean coverage per source.
    bx = axes[1, -1]
    labels, union, member = [], [], []
    for key in main_keys:
        for source, s in table[key].items():
            m = s["dataset_measures_mean"]
            if m is not None and m["union"]["coverage"] is not None:
                labels.append(f"{key.split('/')[0]}\n{source}")
                union.append(m["union"]["coverage"])
                member.append(m["member_mean"]["coverage"])
    x = np.arange(len(labels))
    bx.bar(x - 0.2, union, 0.4, label="union")
    bx.bar(x + 0.2, member, 0.4, label="member mean")
    bx.set_xticks(x)
    bx.set_xticklabels(labels, fontsize=6, rotation=60)
    bx.set_ylim(0, 1)
    bx.legend(fontsize=7)
    bx.set_title("dataset coverage of the grid", fontsize=9)
    axes[2, -1].set_visible(False)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
