"""Ant on CPU: myriad's ``mujoco`` backend against EnvPool and MuJoCo's own ``mujoco.rollout``.

Three ways to step ``E`` copies of Gymnasium's ``Ant-v5`` MJCF (RK4, Newton with 100 iterations,
all body-floor contacts) with random actions in ``[-1, 1]`` and ``frame_skip = 5``:

- ``myriad``: ``make("mujoco-ant", E, model="gymnasium", backend="mujoco", num_workers=n)``, the
  full env step (task observations, rewards, terminations and auto-resets in torch, one torch
  thread in the calling process);
- ``envpool``: ``envpool.make("Ant-v5", env_type="gymnasium", num_envs=E, batch_size=E,
  num_threads=n)`` in synchronous mode (numpy actions in, observations and rewards out);
- ``rollout``: ``mujoco.rollout.Rollout(nthread=n)`` stepping the full physics state of every env
  ``frame_skip`` steps per call, the state fed back in (physics only: no observation, reward,
  ``mj_rnePostConstraint`` or reset; the limit the other two approach).

``n`` is both the number of worker processes (myriad) and of threads (EnvPool, rollout). Every
(``E``, ``n``) case is built once; each round then times one block of about ``--seconds`` for each
of the three, in an order that rotates between rounds, so a change of load on a shared machine
hits all three alike. Per-block ratios are myriad's figure over each reference's in the same
round; the reported ratio is their median. The load average is recorded before and after and
with every block.

EnvPool is a benchmark-only dependency (``pip install -e '.[bench]'``).

python benchmarks/mujoco_cpu_limit.py [--rounds 5] [--seconds 1.5] [--num-envs 256 1024]
    [--threads 1 2] [--out benchmarks/results/mujoco_cpu_limit.json] [--label TEXT]
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any, cast

import mujoco
import numpy as np
import torch

from myriad.bench.common import machine_info, print_table, write_json
from myriad.envs import make
from myriad.envs.mujoco.backends import CpuBackend
from myriad.envs.mujoco.base import MujocoVecEnv
from myriad.envs.mujoco.models import locomotion_model

FRAME_SKIP = 5
ENGINES = ("myriad", "envpool", "rollout")
# Goal: myriad at least EnvPool's figure and within 10% of mujoco.rollout's.
TARGET_VS_ENVPOOL = 1.0
TARGET_VS_ROLLOUT = 0.9
BANK = 16  # pre-generated action batches, so the figure is not the random generator's cost


def _process_cpu_seconds(pids: list[int]) -> float:
    """User + system CPU seconds of processes ``pids`` so far (Linux ``/proc``)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            # Fields after the command name, which may hold spaces: utime and stime are 12th, 13th.
            fields = f.read().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / tick
    return total


def _action_bank(num_envs: int, nu: int) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [rng.uniform(-1.0, 1.0, (num_envs, nu)) for _ in range(BANK)]


class MyriadCase:
    """myriad's Ant on the CPU backend with ``workers`` worker processes."""

    def __init__(self, num_envs: int, workers: int):
        self.env = make(
            "mujoco-ant", num_envs, "cpu", model="gymnasium", backend="mujoco", num_workers=workers
        )
        self.env.reset(seed=0)
        bank = _action_bank(num_envs, self.env.action_dim)
        self.bank = [torch.from_numpy(a).float() for a in bank]
        sim = cast(MujocoVecEnv, self.env).sim
        assert isinstance(sim, CpuBackend)
        self.worker_pids = [p.pid for p in sim._procs]

    def step(self, i: int) -> None:
        self.env.step(self.bank[i % BANK])

    def cpu_seconds(self) -> float:
        """CPU time of this process and of the env's worker processes."""
        return time.process_time() + _process_cpu_seconds(self.worker_pids)

    def close(self) -> None:
        self.env.close()


class EnvPoolCase:
    """EnvPool's ``Ant-v5`` (same MJCF as Gymnasium's) with ``threads`` threads, synchronous."""

    def __init__(self, num_envs: int, threads: int):
        try:
            import envpool
        except ImportError as exc:
            raise SystemExit("envpool is not installed: pip install -e '.[bench]'") from exc
        self.env = envpool.make(
            "Ant-v5",
            env_type="gymnasium",
            num_envs=num_envs,
            batch_size=num_envs,
            num_threads=threads,
            seed=0,
            frame_skip=FRAME_SKIP,
        )
        self.env.reset()
        self.bank = _action_bank(num_envs, 8)

    def step(self, i: int) -> None:
        self.env.step(self.bank[i % BANK])

    def cpu_seconds(self) -> float:
        return time.process_time()  # EnvPool's threads run in this process

    def close(self) -> None:
        self.env.close()


class RolloutCase:
    """``mujoco.rollout`` over the full physics state of ``num_envs`` Ants, ``threads`` threads."""

    def __init__(self, num_envs: int, threads: int):
        from mujoco import rollout

        self.model = locomotion_model("ant", "gymnasium")
        self.datas = [mujoco.MjData(self.model) for _ in range(max(1, threads))]
        self.pool = rollout.Rollout(nthread=threads)
        spec = mujoco.mjtState.mjSTATE_FULLPHYSICS
        nstate = mujoco.mj_stateSize(self.model, spec)
        # Gymnasium's reset distribution around the model's initial state.
        rng = np.random.default_rng(0)
        d = self.datas[0]
        self.state = np.empty((num_envs, nstate))
        for k in range(num_envs):
            mujoco.mj_resetData(self.model, d)
            d.qpos[:] = self.model.qpos0 + rng.uniform(-0.1, 0.1, self.model.nq)
            d.qvel[:] = 0.1 * rng.standard_normal(self.model.nv)
            mujoco.mj_getState(self.model, d, self.state[k], spec)
        self.out = np.empty((num_envs, FRAME_SKIP, nstate))
        # Controls held for the frame_skip physics steps of one env step.
        self.bank = [
            np.ascontiguousarray(np.repeat(a[:, None, :], FRAME_SKIP, axis=1))
            for a in _action_bank(num_envs, self.model.nu)
        ]
        self.sensordata = np.empty((num_envs, FRAME_SKIP, self.model.nsensordata))
        self.models = [self.model] * num_envs

    def step(self, i: int) -> None:
        self.pool.rollout(
            self.models,
            self.datas,
            self.state,
            self.bank[i % BANK],
            nstep=FRAME_SKIP,
            state=self.out,
            sensordata=self.sensordata,
            skip_checks=True,
        )
        self.state[...] = self.out[:, -1]

    def cpu_seconds(self) -> float:
        return time.process_time()  # the rollout threads run in this process

    def close(self) -> None:
        self.pool.close()


FACTORIES: dict[str, Callable[[int, int], Any]] = {
    "myriad": MyriadCase,
    "envpool": EnvPoolCase,
    "rollout": RolloutCase,
}


def time_block(case: Any, num_envs: int, seconds: float, warmup: int = 3) -> tuple[float, float]:
    """Env-steps/s of ``case`` over about ``seconds`` after ``warmup`` untimed steps, and the CPU
    microseconds its processes spent per env-step (on a loaded machine the first depends on the
    share of the cores the case got, the second much less)."""
    for i in range(warmup):
        case.step(i)
    cpu0, start, steps = case.cpu_seconds(), time.perf_counter(), 0
    while time.perf_counter() - start < seconds:
        case.step(steps)
        steps += 1
    wall, cpu = time.perf_counter() - start, case.cpu_seconds() - cpu0
    return num_envs * steps / wall, 1e6 * cpu / (num_envs * steps)


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=1.5, help="timed seconds per block")
    ap.add_argument("--num-envs", type=int, nargs="+", default=[256, 1024])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--out", default="benchmarks/results/mujoco_cpu_limit.json")
    ap.add_argument("--label", default="", help="what the run measures, recorded in the JSON")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)  # the physics runs in the workers; the task code is small

    load_before = os.getloadavg()
    keys = [(e, n) for e in args.num_envs for n in args.threads]
    cases = {(e, n, name): FACTORIES[name](e, n) for e, n in keys for name in ENGINES}
    blocks: list[dict[str, Any]] = []
    try:
        for r in range(args.rounds):
            for e, n in keys:
                order = ENGINES[r % 3 :] + ENGINES[: r % 3]
                row: dict[str, Any] = {"round": r, "num_envs": e, "threads": n, "order": order}
                for name in order:
                    row[name], row[f"{name}_cpu_us"] = time_block(
                        cases[e, n, name], e, args.seconds
                    )
                row["load_1min"] = os.getloadavg()[0]
                row["myriad_over_envpool"] = row["myriad"] / row["envpool"]
                row["myriad_over_rollout"] = row["myriad"] / row["rollout"]
                # CPU cost of the reference over myriad's: above 1, myriad spends less per step.
                for ref in ("envpool", "rollout"):
                    row[f"cpu_{ref}_over_myriad"] = row[f"{ref}_cpu_us"] / row["myriad_cpu_us"]
                blocks.append(row)
                print(
                    f"round {r} E={e} n={n}: "
                    + ", ".join(f"{k} {row[k]:,.0f}" for k in ENGINES)
                    + f" | x envpool {row['myriad_over_envpool']:.3f}"
                    + f", x rollout {row['myriad_over_rollout']:.3f}"
                    + f" | CPU x rollout {row['cpu_rollout_over_myriad']:.3f}"
                    + f" | load {row['load_1min']:.2f}",
                    flush=True,
                )
    finally:
        for case in cases.values():
            case.close()

    summary = []
    for e, n in keys:
        rows = [b for b in blocks if b["num_envs"] == e and b["threads"] == n]
        entry: dict[str, Any] = {"num_envs": e, "threads": n}
        for name in ENGINES:
            entry[f"{name}_median"] = statistics.median(b[name] for b in rows)
            entry[f"{name}_range"] = [min(b[name] for b in rows), max(b[name] for b in rows)]
            entry[f"{name}_cpu_us_median"] = statistics.median(b[f"{name}_cpu_us"] for b in rows)
        for ref in ("envpool", "rollout"):
            ratios = [b[f"myriad_over_{ref}"] for b in rows]
            entry[f"myriad_over_{ref}_median"] = statistics.median(ratios)
            entry[f"myriad_over_{ref}_blocks"] = ratios
            cpu_ratios = [b[f"cpu_{ref}_over_myriad"] for b in rows]
            entry[f"cpu_{ref}_over_myriad_median"] = statistics.median(cpu_ratios)
        entry["meets_envpool"] = entry["myriad_over_envpool_median"] >= TARGET_VS_ENVPOOL
        entry["meets_rollout"] = entry["myriad_over_rollout_median"] >= TARGET_VS_ROLLOUT
        summary.append(entry)

    payload = {
        "machine": machine_info("cpu"),
        "label": args.label,
        "versions": {p: _version(p) for p in ("torch", "mujoco", "envpool", "numpy", "gymnasium")},
        "task": "Ant-v5 MJCF (Gymnasium's), random actions in [-1, 1]",
        "frame_skip": FRAME_SKIP,
        "seconds_per_block": args.seconds,
        "rounds": args.rounds,
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
        "target": {
            "myriad_over_envpool": TARGET_VS_ENVPOOL,
            "myriad_over_rollout": TARGET_VS_ROLLOUT,
        },
        "summary": summary,
        "blocks": blocks,
    }
    write_json(args.out, payload)
    print_table(
        f"Ant-v5 MJCF, env-steps/s (median of {args.rounds} interleaved rounds)",
        ["envs", "threads", *ENGINES, "x envpool", "x rollout", "CPU us/step", "CPU x rollout"],
        [
            [
                s["num_envs"],
                s["threads"],
                *(s[f"{k}_median"] for k in ENGINES),
                f"{s['myriad_over_envpool_median']:.3f}",
                f"{s['myriad_over_rollout_median']:.3f}",
                " / ".join(f"{s[f'{k}_cpu_us_median']:.0f}" for k in ENGINES),
                f"{s['cpu_rollout_over_myriad_median']:.3f}",
            ]
            for s in summary
        ],
    )
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
