"""Shared pieces of the ``myriad bench`` commands: machine facts, JSON output, tables."""

from __future__ import annotations

import json
import os
import platform
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

from myriad import __version__


def machine_info(device: str = "cpu") -> dict[str, Any]:
    """Facts that a benchmark figure depends on."""
    info: dict[str, Any] = {
        "myriad": __version__,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        # The same cloud machine type can land on different CPUs; figures differ with them.
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        # Read by the OpenMP runtime when it loads; unset means libgomp's default.
        "openmp": {k: os.environ.get(k) for k in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")},
        "device": device,
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "commit": code_commit(),
    }
    if device.startswith("cuda") and torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(torch.device(device))
    return info


def cpu_model() -> str | None:
    """The CPU's model name as Linux reports it (``/proc/cpuinfo``), None elsewhere."""
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        return None
    return None


def code_commit() -> str | None:
    """The git commit of the ``myriad`` package that ran, with ``-dirty`` appended when tracked
    files differ from it (None outside a git checkout), so that a result can be traced to the
    code that produced it."""
    where = Path(__file__).resolve().parent

    def git(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["git", *args], cwd=where, capture_output=True, text=True)

    try:
        head = git("rev-parse", "HEAD")
        if head.returncode:
            return None
        dirty = git("diff", "--quiet", "HEAD", "--").returncode == 1
    except OSError:
        return None
    return head.stdout.strip() + ("-dirty" if dirty else "")


def write_json(path: str | Path, payload: dict[str, Any]) -> Path:
    """Write ``payload`` atomically (temporary file, then rename). A benchmark replaces its own
    results, but never a file of a run (:func:`myriad.utils.ownership.claim_output`)."""
    from myriad.utils.ownership import claim_output

    path = Path(path)
    claim_output(path, "bench", overwrite=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(payload, indent=2, default=str) + "\n")
    tmp.replace(path)
    return path


def print_table(title: str, columns: list[str], rows: list[list[Any]]) -> None:
    """Print rows as a rich table."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=title)
    for i, col in enumerate(columns):
        table.add_column(col, justify="left" if i == 0 else "right")
    for row in rows:
        table.add_row(
            *[escape(f"{v:,.0f}" if isinstance(v, float) and v >= 100 else str(v)) for v in row]
        )
    Console().print(table)


def free_port() -> int:
    """A TCP port free on the loopback now (for a launch's rendezvous)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def torchrun_prefix(ranks: int) -> list[str]:
    """``python -m torch.distributed.run`` launching ``ranks`` ranks on this machine, meeting on
    a free loopback port; the script (or ``-m module``) and its arguments follow."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nproc_per_node={ranks}",
        "--master_addr=127.0.0.1",
        f"--master_port={free_port()}",
    ]


def run_myriad_over_ranks(args: list[str], run_dir: Path, ranks: int) -> dict[str, Any]:
    """``python -m myriad <args>`` (which must write its run to ``run_dir``) in one process
    (``ranks == 1``) or over ``ranks`` torchrun ranks on the loopback, one thread each; returns
    the run's summary and the per-iteration history of its last checkpoint.

    Raises ``RuntimeError`` with the end of stderr when the command fails."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}
    env.pop("WORLD_SIZE", None)  # a launch inside a launch would join the outer group
    launcher = [*torchrun_prefix(ranks), "-m"] if ranks > 1 else [sys.executable, "-m"]
    command = [*launcher, "myriad", *args]
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")
    summary = json.loads((run_dir / "summary.json").read_text())
    last = sorted((run_dir / "checkpoints").glob("iter_*.pt"))[-1]
    history = torch.load(last, weights_only=True)["logger"]["history"]
    return {"summary": summary, "history": history}
