"""Shared test set-up: deterministic torch, modest threading on the 2-core CI machine, and one tiny
pretraining run shared by the tests that only read a finished run (or copy it before changing it).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

torch.set_num_threads(1)


def rank_env() -> dict[str, str]:
    """The environment of a torchrun launch in a test: one thread per rank, gloo on loopback,
    no inherited ``WORLD_SIZE``."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}
    env.pop("WORLD_SIZE", None)
    return env


def assert_same_training(a: dict, b: dict) -> None:
    """Two checkpoints hold the same model weights and every logged scalar but timings."""
    for key, value in a["state"]["model"].items():
        assert torch.equal(value, b["state"]["model"][key]), key
    for key, points in a["logger"]["history"].items():
        if not key.startswith("perf/"):
            assert points == b["logger"]["history"][key], key


DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])

#: The tiny pretraining every run-folder, dataset and resume test starts from: 4 iterations of
#: 16 steps x 64 envs, checkpoints at iterations 2 and 4.
TINY_PRETRAIN: tuple[str, ...] = (
    "env=four_rooms",
    "num_envs=64",
    "num_steps=16",
    "population.size=4",
    "population.actor_hidden=[32,32]",
    "population.critic_hidden=[32,32]",
    "ppo.epochs=2",
    "ppo.minibatches=2",
    "iterations=4",
    "checkpoint_every=2",
    "keep_checkpoints=null",
    "progress=false",
    "env.options.max_episode_steps=20",
)

#: The tiny finetuning the runner and set-point tests start from (they add ``num_envs`` and their
#: algorithm's settings): 6-step episodes of the empty room, 8 steps per iteration, evaluations
#: and checkpoints every 2 iterations.
TINY_FINETUNE: tuple[str, ...] = (
    "env=empty",
    "num_steps=8",
    "env.options.max_episode_steps=6",
    "population.actor_hidden=[16]",
    "population.critic_hidden=[16]",
    "ppo.epochs=2",
    "ppo.minibatches=2",
    "eval.every=2",
    "eval.episodes=2",
    "eval.final_episodes=2",
    "diagnostics.states_per_member=16",
    "checkpoint_every=2",
    "progress=false",
)


@dataclass(frozen=True)
class PretrainedRun:
    """A finished run of :data:`TINY_PRETRAIN`.

    Attributes:
        path: the run folder; tests must not change it (use :meth:`copy`).
        overrides: the overrides it was run with.
        summary: what ``pretrain`` returned.
    """

    path: Path
    overrides: tuple[str, ...]
    summary: dict

    def copy(self, target: Path) -> Path:
        """A private copy of the run folder at ``target``, for tests that resume or break it."""
        shutil.copytree(self.path, target)
        return target


@pytest.fixture(params=DEVICES)
def device(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(scope="session")
def tiny_pretrain(tmp_path_factory: pytest.TempPathFactory) -> PretrainedRun:
    """One :data:`TINY_PRETRAIN` run per test process (each xdist worker runs its own)."""
    from myriad.pretrain import pretrain

    folder = tmp_path_factory.mktemp("tiny_pretrain") / "run"
    summary = pretrain(list(TINY_PRETRAIN), run_dir=folder, quiet=True)
    return PretrainedRun(folder, TINY_PRETRAIN, summary)


@pytest.fixture(scope="session")
def tiny_cpo(tiny_pretrain: PretrainedRun, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-iteration CPO finetuning run started (--init) from :func:`tiny_pretrain`; tests must
    not change its folder beyond the files they write themselves (eval.json, policy/)."""
    from myriad.finetune import finetune

    folder = tmp_path_factory.mktemp("tiny_cpo") / "run"
    overrides = [o for o in TINY_FINETUNE if "_hidden" not in o]  # --init brings the networks
    overrides += ["num_envs=16", "iterations=2", "env=four_rooms", "init.episodes=2"]
    finetune("cpo", overrides, init=tiny_pretrain.path, run_dir=folder, quiet=True)
    return folder


def run_myriad(args: list[str], cwd: Path, kill_at: str | None = None) -> str:
    """Run ``myriad`` in a child process; returns its stderr. With ``kill_at`` (a
    ``MYRIAD_KILL_AT`` point, see myriad.utils.faults) it must die there by SIGKILL, else it must
    succeed."""
    from myriad.utils.faults import ENV_VAR

    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    env.pop(ENV_VAR, None)
    if kill_at is not None:
        env[ENV_VAR] = kill_at
    child = subprocess.run(
        [sys.executable, "-m", "myriad.cli", *args],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        cwd=cwd,
    )
    expected = -signal.SIGKILL if kill_at is not None else 0
    assert child.returncode == expected, (args, kill_at, child.returncode, child.stderr[-3000:])
    return child.stderr


def torchrun_command(*args: str, ranks: int = 2) -> list[str]:
    """``torchrun --nproc_per_node=ranks ARGS`` on this machine, rendezvous on a free port of
    127.0.0.1 (run it with :func:`rank_env`)."""
    from myriad.bench.common import torchrun_prefix

    return [*torchrun_prefix(ranks), *args]


def rank_stderr(stderr: str) -> list[str]:
    """The lines the ranks of a torchrun launch printed: ``stderr`` without the agent's own
    report (its log lines and, for a launch that failed, its ``ChildFailedError`` traceback)."""
    import re

    agent = stderr.rfind("Traceback (most recent call last):")
    if agent >= 0 and "ChildFailedError" in stderr[agent:]:
        stderr = stderr[:agent]
    return [
        line
        for line in stderr.splitlines()
        if line.strip() and not re.match(r"^[IWE]\d{4} \d\d:\d\d:\d\d", line)
    ]


class Pause:
    """Hold a myriad process at a fault point (``MYRIAD_PAUSE_AT``, see myriad.utils.faults)
    until :meth:`release`: a trigger, not a sleep. Use as a context manager; :attr:`env` goes
    into the child's environment."""

    def __init__(self, point: str) -> None:
        import socket
        import tempfile

        from myriad.utils.faults import PAUSE_SOCKET_VAR, PAUSE_VAR

        # A Unix socket path must stay under ~100 bytes: pytest's tmp_path can be longer.
        self._dir = tempfile.mkdtemp(prefix="myriad-pause-")
        path = os.path.join(self._dir, "s")
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._server.bind(path)
        self._server.listen(1)
        self._conn: socket.socket | None = None
        self.env = {PAUSE_VAR: point, PAUSE_SOCKET_VAR: path}

    def wait(self, child: subprocess.Popen, timeout: float = 300.0) -> int:
        """Wait until a process of ``child`` reaches the point; returns that process's PID.
        Fails at once if ``child`` ends first."""
        import select
        import time

        deadline = time.monotonic() + timeout
        while not select.select([self._server], [], [], 1.0)[0]:
            if child.poll() is not None:
                _, err = child.communicate()
                raise AssertionError(f"ended before the pause point: {err[-3000:]}")
            assert time.monotonic() < deadline, "the pause point was never reached"
        self._conn, _ = self._server.accept()
        line = self._conn.makefile().readline().split()
        return int(line[1])

    def release(self) -> None:
        """Let the paused process go on (a no-op once released or if it is gone)."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def __enter__(self) -> Pause:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
        self._server.close()
        shutil.rmtree(self._dir, ignore_errors=True)


def kill_launch(agent: subprocess.Popen) -> None:
    """SIGKILL every rank of a torchrun launch (the agent's children; they run in sessions of
    their own) and then the agent, as ``kill -9`` of the whole job would."""
    try:
        children = Path(f"/proc/{agent.pid}/task/{agent.pid}/children").read_text().split()
    except FileNotFoundError:  # the agent has ended (and reaped its ranks)
        children = []
    for pid in children:
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(pid), signal.SIGKILL)
    agent.kill()
    agent.communicate()


def finish_launch(agent: subprocess.Popen, timeout: float = 300) -> tuple[str, str]:
    """Wait for a launch started with pipes; its stdout and stderr. A launch that outlives
    ``timeout``, or a test stopped while it runs, is killed with every rank it started
    (:func:`kill_launch`): a timeout that kills the agent alone leaves its ranks running, holding
    cores and ports for every test after it."""
    try:
        return agent.communicate(timeout=timeout)
    except BaseException:
        kill_launch(agent)
        raise


def run_launch(
    command: list[str], env: dict[str, str], timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """``subprocess.run(command, capture_output=True, text=True)`` for a torchrun launch (or a
    plain process), killed with its ranks past ``timeout`` (:func:`finish_launch`)."""
    agent = subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    out, err = finish_launch(agent, timeout)
    return subprocess.CompletedProcess(command, agent.returncode, out, err)
