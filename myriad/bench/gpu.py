"""``myriad bench gpu`` (``make gpu-check``): every CUDA path of myriad, end to end, in minutes.

Stages, each independent (a failing stage records its one-line error, and the traceback when it
raised, and the check goes on):

- ``cuda_tests``: the tests that skip without CUDA (``pytest -k "cuda or warp"``).
- ``nav_envs``: navigation envs at 65,536 envs (env-steps/s).
- ``pretrain``: default K-Myriad pretraining with 16,384 envs and 16 members (steps/s, k-NN share
  of an iteration) and one rollout under ``torch.cuda.set_sync_debug_mode("error")``: a host
  sync inside the collector's rollout fails the stage and names where it happened, except the
  documented one of action validation's NaN check (the rollout is then run again without it).
- ``knn``: exact k-NN on the device at 65,536 and 1,000,000 states (faiss-gpu when it is installed
  and sees the GPU, else the torch backend that pretraining then uses) against an exact CPU search
  of the same data (faiss-cpu when installed, else the torch kernel on the CPU): recall of the
  exact neighbours, distance error, both times.
- ``mujoco_warp``: MuJoCo Warp Ant (CUDA graph capture) at 4,096 and 16,384 worlds: env-steps/s;
  and Warp's one-step agreement with CPU MuJoCo along a CPU trajectory, on HalfCheetah and on Ant
  with elliptic cones (at most 1% of env-steps over ``MUJOCO_TOLERANCE``).
  Skipped with one line when ``warp`` / ``mujoco_warp`` cannot be imported.
- ``cpo_finetune``: CPO finetuning initialised from the ``pretrain`` stage's run (from fresh
  members when that stage failed, so the finetuning path is still checked).
- ``install_gpu``: ``make install-gpu`` into a fresh virtual environment in a temporary copy of the
  source tree; faiss must see the GPU afterwards. Skipped with ``--offline`` (the check of an
  offline node, ``scripts/gpu-check.sh``), since it installs from the package index.

Results go to ``benchmarks/results/gpu-<device name>.json``, rewritten after every stage
(``complete`` false and ``ok`` false until the last has run): per stage its status, seconds,
figures and error; a skipped stage is recorded with its reason and does not fail the check. The
exit code is 1 when any stage failed. Without a CUDA device the command
prints one line and exits 0. ``--device cpu --small`` runs the same stages on the CPU at small
sizes, which checks the check itself (the tests do).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import torch

from myriad.bench.common import machine_info, write_json
from myriad.utils.commandline import ArgumentParser
from myriad.utils.threads import intra_op_threads, openmp_threads, search_threads

STAGES = (
    "cuda_tests",
    "nav_envs",
    "pretrain",
    "knn",
    "mujoco_warp",
    "cpo_finetune",
    "install_gpu",
)
#: Exact search: recall below this means the GPU and CPU neighbours differ beyond ties.
MIN_EXACT_RECALL = 0.999
#: MuJoCo Warp (float32) against CPU MuJoCo (float64): the one-step relative gap of qpos/qvel,
#: Warp started from the CPU state every step, that all but 1% of env-steps stay within
#: (myriad.envs.mujoco.agreement.STEP_TOLERANCE; measured at most 3e-4 for HalfCheetah and 7e-4
#: for Ant with elliptic cones over 100 steps, docs/mujoco.md). Free-running trajectories leave
#: it within 10-60 steps even between two float64 MuJoCo runs one float32 rounding apart, and
#: Ant with Gymnasium's pyramidal cones leaves it from the first contact of a near-vertical leg
#: (MuJoCo Warp's plane-capsule contact frame): compare with agreement.stepwise_gaps on
#: HalfCheetah or elliptic-cone Ant.
MUJOCO_TOLERANCE = 1e-3
SOURCE_ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Sizes:
    """Problem sizes of the stages (defaults: the sizes the check is specified at)."""

    nav_envs: int = 65536
    nav_names: tuple[str, ...] = ("nav-maze", "nav-empty", "nav-four-rooms")
    pretrain_envs: int = 16384
    pretrain_members: int = 16
    pretrain_iterations: int = 10
    pretrain_overrides: tuple[str, ...] = ()
    knn_states: tuple[int, ...] = (65536, 1_000_000)
    knn_dims: tuple[int, ...] = (2, 29)
    knn_k: int = 10
    knn_reference_queries: int = 16384
    mujoco_worlds: tuple[int, ...] = (4096, 16384)
    mujoco_agreement_envs: int = 64
    mujoco_agreement_steps: int = 100
    finetune_envs: int = 16384
    finetune_iterations: int = 5
    finetune_overrides: tuple[str, ...] = ()
    timed_seconds: float = 1.0
    tests_timeout_s: int = 300
    install_timeout_s: int = 420


#: Sizes for running the stages on a CPU: proves the plumbing, not the GPU.
SMALL = Sizes(
    nav_envs=1024,
    nav_names=("nav-maze",),
    pretrain_envs=64,
    pretrain_members=4,
    pretrain_iterations=2,
    pretrain_overrides=("num_steps=16", "env.options.max_episode_steps=20"),
    knn_states=(2048, 4096),
    knn_dims=(2, 8),
    knn_k=5,
    knn_reference_queries=256,
    mujoco_worlds=(4, 8),
    mujoco_agreement_envs=4,
    mujoco_agreement_steps=20,
    finetune_envs=64,
    finetune_iterations=2,
    finetune_overrides=(
        "num_steps=16",
        "env.options.max_episode_steps=20",
        "init.episodes=2",
        "init.critic_warmup=1",
        "eval.episodes=4",
        "eval.final_episodes=4",
    ),
    timed_seconds=0.2,
)


class StageSkipped(Exception):
    """A stage cannot run here (a package that does not travel, no network); the message says
    why."""


class StageFailed(Exception):
    """A stage ran but a check failed; ``figures`` are what it measured before failing."""

    def __init__(self, message: str, figures: dict[str, Any]) -> None:
        super().__init__(message)
        self.figures = figures


@dataclass
class Check:
    """What the stages share: the device, the sizes, a scratch folder and earlier results."""

    device: str
    sizes: Sizes
    workdir: Path
    offline: bool = False
    pretrain_run: Path | None = None
    results: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def cuda(self) -> bool:
        return self.device.startswith("cuda")

    def synchronize(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)


def one_line(exc: BaseException) -> str:
    """``Type: first line of the message``, at most 300 characters."""
    text = str(exc).strip().splitlines()
    message = f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")
    return message if len(message) <= 300 else message[:297] + "..."


def device_slug(device: str) -> str:
    """File-name form of the device's name, e.g. ``nvidia-h100-80gb-hbm3`` (``cpu`` on CPU)."""
    name = torch.cuda.get_device_name(torch.device(device)) if device.startswith("cuda") else "cpu"
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


# ----------------------------------------------------------------------------- stages


def stage_cuda_tests(check: Check) -> dict[str, Any]:
    """The test suite's CUDA tests, in a subprocess; pass/fail/skip counts from JUnit XML."""
    tests = SOURCE_ROOT / "tests"
    if not tests.is_dir():
        raise FileNotFoundError(f"{tests} not found: the CUDA tests run from a source checkout")
    report = check.workdir / "cuda_tests.xml"
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:xdist",
        "-p",
        "no:cacheprovider",
        "-k",
        "cuda or warp",
        # A test module that needs a package this machine lacks (an extra that does not travel
        # in the offline bundle) is recorded as uncollected; the other modules still run.
        "--continue-on-collection-errors",
        str(tests),
        f"--junitxml={report}",
    ]
    proc = subprocess.run(
        cmd,
        cwd=SOURCE_ROOT,
        capture_output=True,
        text=True,
        timeout=check.sizes.tests_timeout_s,
    )
    figures = junit_counts(report) if report.exists() else {}
    figures["returncode"] = proc.returncode
    if not report.exists():
        tail = (proc.stdout + proc.stderr).strip().splitlines()
        raise StageFailed(f"pytest wrote no report: {tail[-1] if tail else 'no output'}", figures)
    if figures["failed"]:
        raise StageFailed(
            f"{figures['failed']} CUDA test(s) failed: {figures['failures']}", figures
        )
    if not figures["passed"]:
        raise StageFailed("no CUDA test ran (all skipped or none selected)", figures)
    return figures


def junit_counts(path: Path) -> dict[str, Any]:
    """Passed, failed and skipped tests of a JUnit XML report, with the failing test ids.

    A module that could not be collected because a package is missing (``ModuleNotFoundError``)
    is listed under ``uncollected`` with the package's name; any other collection error is a
    failure.
    """
    passed, failures, skipped, uncollected = 0, [], [], []
    for case in ET.parse(path).getroot().iter("testcase"):
        name = f"{case.get('classname', '')}::{case.get('name', '')}"
        problem = case.find("failure")
        if problem is None:
            problem = case.find("error")
        if problem is not None:
            text = (problem.text or "") + (problem.get("message") or "")
            missing = re.search(r"ModuleNotFoundError: No module named '([\w.]+)'", text)
            if not case.get("classname") and missing:
                uncollected.append(f"{case.get('name', '')}: needs {missing.group(1)}")
            else:
                failures.append(name)
        elif (skip := case.find("skipped")) is not None:
            skipped.append(f"{name}: {skip.get('message', '')}")
        else:
            passed += 1
    return {
        "passed": passed,
        "failed": len(failures),
        "skipped": len(skipped),
        "failures": failures[:10],
        "skip_reasons": skipped[:10],
        "uncollected": uncollected,
    }


def stage_nav_envs(check: Check) -> dict[str, Any]:
    """Env-steps/s of the navigation envs at ``sizes.nav_envs`` envs."""
    from myriad.bench.envs import time_env

    n = check.sizes.nav_envs
    figures: dict[str, Any] = {"num_envs": n}
    for name in check.sizes.nav_names:
        result = time_env(name, n, check.device, {}, seconds=check.sizes.timed_seconds)
        figures[name] = {"steps_per_s": result["steps_per_s"], "step_ms": result["step_ms"]}
    return figures


def rollout_host_sync(collector: Any, storage: Any, device: str) -> str | None:
    """Run one rollout under ``torch.cuda.set_sync_debug_mode("error")``; the first host sync
    inside it, as ``message (file:line in myriad)``, or None when there was none.

    A warm-up rollout runs first, so one-off set-up (allocations, kernel loading) is not
    counted. On a CPU device there is nothing to check: None.
    """
    if not device.startswith("cuda"):
        return None
    collector.collect(storage)
    torch.cuda.synchronize(device)
    torch.cuda.set_sync_debug_mode("error")
    try:
        # The loop; the truncation bootstrap after it reads one count from the device.
        collector.collect_steps(storage)
    except RuntimeError as exc:
        frames = [
            f"{Path(f.filename).name}:{f.lineno} ({f.name})"
            for f in traceback.extract_tb(exc.__traceback__)
            if "myriad" in f.filename
        ]
        return f"{str(exc).splitlines()[0]} at {frames[-1] if frames else 'unknown'}"
    finally:
        torch.cuda.set_sync_debug_mode("default")
    return None


def _pretrain_overrides(check: Check) -> list[str]:
    s = check.sizes
    return [
        f"device={check.device}",
        f"num_envs={s.pretrain_envs}",
        f"population.size={s.pretrain_members}",
        f"iterations={s.pretrain_iterations}",
        "progress=false",
        "plots=false",
        *s.pretrain_overrides,
    ]


def _sync_check(check: Check, overrides: list[str], name: str) -> str | None:
    from myriad.pretrain.api import resolve_config
    from myriad.pretrain.runner import PretrainRunner

    cfg = resolve_config([*overrides, "dataset.enabled=false"])
    runner = PretrainRunner(cfg, check.workdir / name)
    try:
        return rollout_host_sync(runner.collector, runner.storage, check.device)
    finally:
        runner.close()


def stage_pretrain(check: Check) -> dict[str, Any]:
    """Default pretraining on the device: throughput, k-NN share, host syncs in the rollout."""
    from myriad.envs.base import validate_actions
    from myriad.pretrain import pretrain

    overrides = _pretrain_overrides(check)
    figures: dict[str, Any] = {
        "num_envs": check.sizes.pretrain_envs,
        "members": check.sizes.pretrain_members,
        "iterations": check.sizes.pretrain_iterations,
    }
    sync = _sync_check(check, overrides, "sync_default") if check.cuda else None
    if sync is not None and sync.endswith(f"({validate_actions.__name__})"):
        # Action validation's NaN check reads one flag per step (documented: TensorVecEnv's
        # ``validate``); without it the loop must not sync at all.
        figures["action_validation_sync"] = sync
        sync = _sync_check(check, [*overrides, "+env.options.validate=false"], "sync_novalidate")
    figures["rollout_host_sync"] = sync if check.cuda else "not applicable on cpu"
    folder = check.workdir / "pretrain"
    summary = pretrain(overrides, run_dir=folder, quiet=True)
    check.pretrain_run = folder
    figures.update(
        {
            "steps_per_s": summary["steps_per_second"],
            "last_iteration_steps_per_s": summary.get("perf/steps_per_second"),
            "knn_share": summary.get("perf/knn_share"),
            "collect_share": summary.get("perf/collect_share"),
            "update_share": summary.get("perf/update_share"),
            "entropy_collective": summary.get("entropy/collective"),
            "coverage_union": summary.get("coverage/cumulative_union"),
            "wall_time_s": summary.get("wall_time_s"),
        }
    )
    if sync is not None:
        raise StageFailed(f"host sync inside the rollout: {sync}", figures)
    return figures


def _timed(check: Check, fn: Callable[[], Any]) -> tuple[Any, float]:
    check.synchronize()
    start = time.perf_counter()
    out = fn()
    check.synchronize()
    return out, time.perf_counter() - start


def exact_recall(found: torch.Tensor, exact: torch.Tensor) -> float:
    """Mean fraction of each row's exact neighbour indices ``[Q, k]`` present in ``found``."""
    hits = (found.unsqueeze(2) == exact.unsqueeze(1)).any(dim=1)
    return float(hits.float().mean())


def knn_backends() -> tuple[str, str]:
    """``(device backend, CPU reference backend)`` of the k-NN stage: faiss where it is
    installed (faiss-gpu on the device only when it sees a GPU), else the torch kernel, which
    is what ``backend=auto`` searches with on a CUDA device without faiss-gpu."""
    from myriad.entropy.knn import faiss_available, faiss_gpu_available

    return (
        "faiss" if faiss_gpu_available() else "torch",
        "faiss" if faiss_available() else "torch",
    )


def stage_knn(check: Check) -> dict[str, Any]:
    """Exact k-NN on the device against an exact CPU search of the same points."""
    from myriad.entropy.knn import faiss_gpu_available, knn

    s = check.sizes
    on_device, reference = knn_backends()
    # The reference runs on every core the process may use (torch's and every OpenMP runtime's
    # thread count), not on the learner's one thread.
    cpu_threads = search_threads()
    threads_used = torch.get_num_threads()
    if not check.cuda:
        on_device = reference  # the same search on the same device: the plumbing only
    gen = torch.Generator().manual_seed(0)
    runs, worst = [], 1.0
    for n in s.knn_states:
        for dim in s.knn_dims:
            points = torch.randn(n, dim, generator=gen)
            device_points = points.to(check.device)
            found, seconds = _timed(check, partial(knn, device_points, s.knn_k, backend=on_device))
            queries = min(n, s.knn_reference_queries)
            start = time.perf_counter()
            # The reference set includes each query itself: ask for k + 1 and drop it by index.
            with intra_op_threads(cpu_threads), openmp_threads(cpu_threads):
                threads_used = torch.get_num_threads()
                ref = knn(points[:queries], s.knn_k + 1, points, backend=reference)
            cpu_seconds = time.perf_counter() - start
            own = torch.arange(queries).unsqueeze(1)
            keep = ref.indices != own
            first_k = keep.cumsum(dim=1) <= s.knn_k
            exact_idx = ref.indices[keep & first_k].view(queries, s.knn_k)
            exact_dist = ref.distances[keep & first_k].view(queries, s.knn_k)
            recall = exact_recall(found.indices[:queries].cpu(), exact_idx)
            worst = min(worst, recall)
            runs.append(
                {
                    "states": n,
                    "dim": dim,
                    "k": s.knn_k,
                    "device_seconds": seconds,
                    "cpu_queries": queries,
                    "cpu_seconds": cpu_seconds,
                    "cpu_seconds_extrapolated": cpu_seconds * n / queries,
                    "speedup_vs_cpu": cpu_seconds * n / queries / seconds,
                    "recall": recall,
                    "max_distance_error": float(
                        (found.distances[:queries].cpu() - exact_dist).abs().max()
                    ),
                }
            )
    figures = {
        "faiss_gpu": faiss_gpu_available(),
        "device_backend": on_device,
        "cpu_backend": reference,
        "cpu_threads": threads_used,
        "runs": runs,
    }
    if worst < MIN_EXACT_RECALL:
        raise StageFailed(
            f"device neighbours differ from the CPU reference: recall {worst:.4f} < "
            f"{MIN_EXACT_RECALL}",
            figures,
        )
    return figures


def steps_per_second(check: Check, env: Any, seconds: float) -> float:
    """Env-steps/s of ``env`` with random actions (pre-generated), after a warm-up."""
    gen = torch.Generator().manual_seed(0)
    bank = [
        (torch.rand(env.num_envs, env.action_dim, generator=gen) * 2 - 1).to(env.device)
        for _ in range(4)
    ]
    env.reset(seed=0)
    for i in range(3):
        env.step(bank[i % 4])
    steps, elapsed = 0, 0.0
    while elapsed < seconds or steps < 3:
        _, dt = _timed(check, partial(env.step, bank[steps % 4]))
        steps, elapsed = steps + 1, elapsed + dt
    return env.num_envs * steps / elapsed


def stepwise_agreement(robot: str, elliptic: bool, check: Check) -> dict[str, Any]:
    """One-step gaps of MuJoCo Warp on the device against CPU MuJoCo along a CPU trajectory
    (:func:`myriad.envs.mujoco.agreement.stepwise_gaps`): the share of env-steps over
    ``MUJOCO_TOLERANCE``, the largest and the 99th-percentile gap."""
    import mujoco

    from myriad.envs.mujoco.agreement import stepwise_gaps
    from myriad.envs.mujoco.backends import CpuBackend, WarpBackend
    from myriad.envs.mujoco.models import locomotion_model

    s = check.sizes
    model = locomotion_model(robot, "gymnasium")
    if elliptic:
        model.opt.cone = mujoco.mjtCone.mjCONE_ELLIPTIC
    fields = ("xpos", "cfrc_ext")
    cpu = CpuBackend(model, s.mujoco_agreement_envs, 5, fields, num_workers=0)
    warp = WarpBackend(
        model, s.mujoco_agreement_envs, 5, fields, check.device, nconmax=32, njmax=192
    )
    try:
        gaps = stepwise_gaps(cpu, warp, s.mujoco_agreement_steps, seed=0)
    finally:
        cpu.close()
        warp.close()
    return {
        "robot": robot,
        "cone": "elliptic" if elliptic else "pyramidal (as shipped)",
        "envs": s.mujoco_agreement_envs,
        "steps": s.mujoco_agreement_steps,
        "share_over_tolerance": float((gaps > MUJOCO_TOLERANCE).double().mean()),
        "max_gap": float(gaps.max()),
        "p99_gap": float(torch.quantile(gaps.flatten(), 0.99)),
    }


def stage_mujoco_warp(check: Check) -> dict[str, Any]:
    """MuJoCo Warp: Ant's throughput (CUDA graph capture) at the sizes' world counts, and step by
    step agreement with CPU MuJoCo on HalfCheetah as shipped and on Ant with elliptic cones (with
    Gymnasium's pyramidal cones Ant differs from its first near-vertical leg contact, a
    difference of MuJoCo Warp's contact frames, docs/mujoco.md)."""
    for package in ("warp", "mujoco_warp", "mujoco"):
        if importlib.util.find_spec(package) is None:
            raise StageSkipped(
                f"{package} is not installed (pip install 'myriad-rl[warp]'; its wheel does not "
                "travel in the offline bundle)"
            )
    from myriad.envs import make
    from myriad.envs.mujoco.base import MujocoVecEnv

    s = check.sizes
    runs = []
    for worlds in s.mujoco_worlds:
        warp = make("mujoco-ant", worlds, device=check.device, backend="warp", model="gymnasium")
        assert isinstance(warp, MujocoVecEnv)  # the mujoco-* envs are MujocoVecEnv
        try:
            runs.append(
                {
                    "worlds": worlds,
                    "graph_capture": bool(getattr(warp.sim, "use_graph", False)),
                    "steps_per_s": steps_per_second(check, warp, s.timed_seconds),
                }
            )
        finally:
            warp.close()
    agreement = [
        stepwise_agreement("halfcheetah", False, check),
        stepwise_agreement("ant", True, check),
    ]
    figures = {"tolerance": MUJOCO_TOLERANCE, "throughput": runs, "agreement": agreement}
    failures = [
        f"{a['robot']}: {100 * a['share_over_tolerance']:.1f}% of env-steps over the tolerance"
        for a in agreement
        if a["share_over_tolerance"] > 0.01
    ]
    if failures:
        raise StageFailed(
            f"Warp and CPU MuJoCo differ beyond {MUJOCO_TOLERANCE}: {'; '.join(failures)}",
            figures,
        )
    return figures


def stage_cpo_finetune(check: Check) -> dict[str, Any]:
    """CPO finetuning on the device, initialised from the ``pretrain`` stage's run."""
    from myriad.finetune import finetune

    if check.pretrain_run is None and "pretrain" not in check.results:
        raise StageFailed(
            "CPO finetunes the pretrain stage's run: include pretrain in --stages, before "
            "cpo_finetune",
            {},
        )
    # When the pretrain stage ran and failed, the members start fresh: the finetuning path
    # on the device is still checked, and the record says it was not initialised.
    s = check.sizes
    overrides = [
        f"device={check.device}",
        f"num_envs={s.finetune_envs}",
        f"iterations={s.finetune_iterations}",
        "progress=false",
        "plots=false",
        *s.finetune_overrides,
    ]
    summary = finetune(
        "cpo", overrides, init=check.pretrain_run, run_dir=check.workdir / "cpo", quiet=True
    )
    final = summary.get("final_eval") or {}
    return {
        "init": (
            "pretrain stage's run"
            if check.pretrain_run is not None
            else "fresh (the pretrain stage failed)"
        ),
        "num_envs": s.finetune_envs,
        "iterations": s.finetune_iterations,
        "steps_per_s": summary["steps_per_second"],
        "wall_time_s": summary.get("wall_time_s"),
        "leader_success": final.get("eval/leader_success"),
        "leader_return": final.get("eval/leader_return"),
    }


def source_copy(target: Path) -> Path:
    """The source tree (git's tracked and unignored files, or the tree less build outputs)."""
    try:
        names = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=SOURCE_ROOT,
            capture_output=True,
            check=True,
        ).stdout.split(b"\0")
    except (OSError, subprocess.CalledProcessError):
        ignore = shutil.ignore_patterns(".venv", "runs", "outputs", "*.egg-info", "__pycache__")
        shutil.copytree(SOURCE_ROOT, target, ignore=ignore)
        return target
    for raw in names:
        if not raw:
            continue
        src = SOURCE_ROOT / raw.decode()
        if src.is_file():
            dst = target / raw.decode()
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst)
    return target


def stage_install_gpu(check: Check) -> dict[str, Any]:
    """``make install-gpu`` into a fresh venv in a copy of the source tree; faiss sees a GPU."""
    if check.offline:
        raise StageSkipped("--offline: make install-gpu installs from the package index")
    tree = source_copy(check.workdir / "install" / "src")
    venv = tree / ".venv"
    cmd = ["make", "install-gpu", f"PYTHON={sys.executable}", f"VENV={venv}"]
    start = time.perf_counter()
    proc = subprocess.run(
        cmd, cwd=tree, capture_output=True, text=True, timeout=check.sizes.install_timeout_s
    )
    figures: dict[str, Any] = {
        "returncode": proc.returncode,
        "install_seconds": time.perf_counter() - start,
    }
    if proc.returncode != 0:
        lines = [ln for ln in (proc.stderr or proc.stdout).splitlines() if ln.strip()]
        raise StageFailed(f"make install-gpu failed: {lines[-1] if lines else ''}", figures)
    probe = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import faiss; print(faiss.get_num_gpus())"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    figures["faiss_gpus"] = int(probe.stdout.strip() or -1) if probe.returncode == 0 else -1
    if figures["faiss_gpus"] < 1:
        raise StageFailed("after make install-gpu, faiss sees no GPU", figures)
    return figures


STAGE_FUNCTIONS: dict[str, Callable[[Check], dict[str, Any]]] = {
    "cuda_tests": stage_cuda_tests,
    "nav_envs": stage_nav_envs,
    "pretrain": stage_pretrain,
    "knn": stage_knn,
    "mujoco_warp": stage_mujoco_warp,
    "cpo_finetune": stage_cpo_finetune,
    "install_gpu": stage_install_gpu,
}


def run_stage(check: Check, name: str) -> dict[str, Any]:
    """Run one stage; its record ``{status, seconds, figures, error}`` (never raises)."""
    start = time.perf_counter()
    record: dict[str, Any] = {"status": "ok", "figures": {}, "error": None}
    try:
        record["figures"] = STAGE_FUNCTIONS[name](check)
    except StageSkipped as exc:
        record.update(status="skipped", error=str(exc))
    except StageFailed as exc:
        record.update(status="failed", figures=exc.figures, error=one_line(exc))
    except Exception as exc:  # any error of one stage is that stage's result
        # The whole traceback too: from an offline node the JSON may be all that comes back.
        record.update(
            status="failed", error=one_line(exc), traceback=traceback.format_exc()[-6000:]
        )
    record["seconds"] = time.perf_counter() - start
    check.results[name] = record
    return record


def run_check(
    device: str,
    sizes: Sizes,
    stages: list[str],
    workdir: Path,
    offline: bool = False,
    out: Path | None = None,
) -> dict[str, Any]:
    """Run ``stages`` in order on ``device``; the JSON payload.

    With ``out``, the payload so far is written there after every stage (``complete`` false
    until the last), so a check stopped by a node's time limit keeps the stages it finished.
    """
    check = Check(device, sizes, workdir, offline)
    load_start = [round(v, 2) for v in os.getloadavg()]
    # Read once, before the stages change the process (pretraining sets torch's thread count).
    machine = machine_info(device)
    started = time.perf_counter()

    def payload(complete: bool) -> dict[str, Any]:
        failed = [n for n, r in check.results.items() if r["status"] == "failed"]
        return {
            "benchmark": "gpu-check",
            "machine": machine,
            "load_average_start": load_start,
            "sizes": asdict(sizes),
            "complete": complete,
            # A file cut short is not a pass, whatever its finished stages say.
            "ok": complete and not failed,
            "failed": failed,
            "skipped": [n for n, r in check.results.items() if r["status"] == "skipped"],
            "offline": offline,
            "seconds": time.perf_counter() - started,
            "stages": check.results,
        }

    for name in stages:
        record = run_stage(check, name)
        line = f"{name}: {record['status']} ({record['seconds']:.1f} s)"
        print(line if record["error"] is None else f"{line}: {record['error']}", flush=True)
        if out is not None and len(check.results) < len(stages):
            write_json(out, payload(complete=False))
    final = payload(complete=True)
    if out is not None:
        write_json(out, final)
    return final


def _parse_stages(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise argparse.ArgumentTypeError(f"no stage named; choose from {', '.join(STAGES)}")
    unknown = [n for n in names if n not in STAGES]
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown stage(s) {unknown}; choose from {', '.join(STAGES)}"
        )
    return names


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog="myriad bench gpu", description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda", help="cuda (default), cuda:N, or cpu")
    parser.add_argument(
        "--stages",
        type=_parse_stages,
        default=list(STAGES),
        help=f"comma-separated subset of {','.join(STAGES)}",
    )
    parser.add_argument("--small", action="store_true", help="small sizes (a check of the check)")
    parser.add_argument(
        "--out", type=Path, help="JSON path (default benchmarks/results/gpu-<device name>.json)"
    )
    parser.add_argument("--keep", type=Path, help="keep the runs in this folder (default: removed)")
    parser.add_argument(
        "--offline",
        action="store_true",
        help="no package index: skip the stages that install packages (scripts/gpu-check.sh)",
    )
    args = parser.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("myriad bench gpu: no CUDA device on this machine, nothing to check")
        return 0
    sizes = SMALL if args.small else Sizes()
    out = args.out or Path("benchmarks/results") / f"gpu-{device_slug(args.device)}.json"
    if args.keep is not None:
        args.keep.mkdir(parents=True, exist_ok=True)
        payload = run_check(args.device, sizes, args.stages, args.keep, args.offline, out)
    else:
        with tempfile.TemporaryDirectory(prefix="myriad-gpu-check-") as tmp:
            payload = run_check(args.device, sizes, args.stages, Path(tmp), args.offline, out)
    path = out
    verdict = "all stages passed" if payload["ok"] else f"failed: {', '.join(payload['failed'])}"
    print(f"GPU check {verdict} in {payload['seconds']:.0f} s; results written to {path}")
    return 0 if payload["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
