"""K-Myriad vs a single policy vs independent explorers, at equal environment steps.

For each env and seed, three pretraining runs with the same number of envs, rollout length and
iterations (so the same env steps):

- ``kmyriad``: M = 8 members, beta = 1 (collective entropy);
- ``single``: M = 1 (one policy in every env, the "identical agents" baseline);
- ``independent``: M = 8 members, beta = 0 (each maximises its own entropy).

The final population is then evaluated for one full episode per env (``PretrainRunner.evaluate``),
giving collective entropy, diversity and union coverage. Results: mean and 95% bootstrap CI over
seeds, written to ``benchmarks/results/pretrain_compare.json`` with a bar plot. A second part
measures the throughput of the pretraining loop at 16,384 envs against the raw env throughput.

    python benchmarks/pretrain_compare.py --seeds 5 --iterations 60
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from myriad.bench.common import machine_info, write_json
from myriad.bench.envs import time_env
from myriad.pretrain import pretrain
from myriad.pretrain.api import resolve_config
from myriad.pretrain.runner import PretrainRunner

VARIANTS = {
    "kmyriad": ["population.size=8", "objective.beta=1.0"],
    "single": ["population.size=1", "objective.beta=1.0"],
    "independent": ["population.size=8", "objective.beta=0.0"],
}
METRICS = ("eval_coverage_union", "eval_entropy_collective", "eval_entropy_diversity")


def bootstrap_ci(values: list[float], resamples: int = 10000, seed: int = 0) -> list[float]:
    """95% percentile-bootstrap interval of the mean."""
    x = np.asarray(values, dtype=np.float64)
    if len(x) < 2:
        return [float(x.mean()), float(x.mean())]
    rng = np.random.default_rng(seed)
    means = rng.choice(x, size=(resamples, len(x)), replace=True).mean(axis=1)
    return [float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))]


def compare(envs: list[str], seeds: int, iterations: int, num_envs: int) -> dict:
    runs = []
    for env in envs:
        for variant, overrides in VARIANTS.items():
            for seed in range(seeds):
                with tempfile.TemporaryDirectory() as tmp:
                    start = time.perf_counter()
                    summary = pretrain(
                        [
                            f"env={env}",
                            f"seed={seed}",
                            f"iterations={iterations}",
                            f"num_envs={num_envs}",
                            "dataset.enabled=false",
                            "progress=false",
                            "checkpoint_every=0",
                            *overrides,
                        ],
                        run_dir=Path(tmp) / "run",
                        quiet=True,
                    )
                row = {"env": env, "variant": variant, "seed": seed}
                row.update({m: float(summary[m]) for m in METRICS})
                row["env_steps"] = int(summary["env_steps"])
                row["seconds"] = time.perf_counter() - start
                runs.append(row)
                print(json.dumps(row), flush=True)
    table = {}
    for env in envs:
        for variant in VARIANTS:
            rows = [r for r in runs if r["env"] == env and r["variant"] == variant]
            table[f"{env}/{variant}"] = {
                m: {
                    "mean": float(np.mean([r[m] for r in rows])),
                    "ci95": bootstrap_ci([r[m] for r in rows]),
                }
                for m in METRICS
            }
    return {"runs": runs, "table": table}


def loop_throughput(num_envs: int = 16384, iterations: int = 4) -> dict:
    """Env-steps/s of the whole pretraining loop vs the bare env at the same size."""
    cfg = resolve_config(
        [f"num_envs={num_envs}", "progress=false", "dataset.enabled=false", "checkpoint_every=0"]
    )
    with tempfile.TemporaryDirectory() as tmp:
        runner = PretrainRunner(cfg, Path(tmp) / "run")
        runner.iteration()  # warm-up
        start = time.perf_counter()
        shares = []
        for _ in range(iterations):
            s = runner.iteration()
            shares.append(
                {k: s[k] for k in ("perf/knn_share", "perf/collect_share", "perf/update_share")}
            )
        elapsed = time.perf_counter() - start
        runner.close()
    loop = runner.steps_per_iteration * iterations / elapsed
    env = time_env(cfg["env"]["name"], num_envs, "cpu", dict(cfg["env"]["options"]), seconds=1.0)
    return {
        "num_envs": num_envs,
        "loop_steps_per_s": loop,
        "env_steps_per_s": env["steps_per_s"],
        "overhead_ratio": env["steps_per_s"] / loop,
        "shares": {k: float(np.mean([s[k] for s in shares])) for k in shares[0]},
    }


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    envs = sorted({k.split("/")[0] for k in result["table"]})
    fig, axes = plt.subplots(1, len(METRICS), figsize=(5 * len(METRICS), 4))
    width = 0.25
    for ax, metric in zip(axes, METRICS):
        for j, variant in enumerate(VARIANTS):
            means, lo, hi = [], [], []
            for env in envs:
                cell = result["table"][f"{env}/{variant}"][metric]
                means.append(cell["mean"])
                lo.append(cell["mean"] - cell["ci95"][0])
                hi.append(cell["ci95"][1] - cell["mean"])
            x = np.arange(len(envs)) + (j - 1) * width
            ax.bar(x, means, width, yerr=[lo, hi], capsize=3, label=variant)
        ax.set_xticks(np.arange(len(envs)), envs)
        ax.set_title(metric.replace("eval_", ""))
        ax.grid(axis="y", alpha=0.3)
    axes[0].legend(frameon=False)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--envs", nargs="*", default=["maze", "two_rooms"])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--iterations", type=int, default=60)
    parser.add_argument("--num-envs", type=int, default=512)
    parser.add_argument("--skip-throughput", action="store_true")
    parser.add_argument("--out", default="benchmarks/results/pretrain_compare.json")
    args = parser.parse_args()
    result = {"machine": machine_info("cpu"), "config": vars(args)}
    result.update(compare(args.envs, args.seeds, args.iterations, args.num_envs))
    if not args.skip_throughput:
        result["throughput"] = loop_throughput()
    out = write_json(args.out, result)
    plot(result, out.with_suffix(".png"))
    for key, cells in result["table"].items():
        line = "  ".join(
            f"{m.replace('eval_', '')}={c['mean']:.3f} [{c['ci95'][0]:.3f}, {c['ci95'][1]:.3f}]"
            for m, c in cells.items()
        )
        print(f"{key:<24} {line}")
    if "throughput" in result:
        print(json.dumps(result["throughput"], indent=2))
    print(f"written {out}")


if __name__ == "__main__":
    torch.set_num_threads(max(1, torch.get_num_threads()))
    main()
