"""Integrity under ``torchrun`` (gloo on CPU, 127.0.0.1 only): the run lock, full disks and
permissions for two-rank pretraining and finetuning launched as a user would
(docs/guarantees.md, "Integrity: no dead ends").

A launch is held at a fault point (``MYRIAD_PAUSE_AT``: rank 0, right after its first
checkpoint) while other commands are aimed at its folder, then every rank is killed with
SIGKILL; nothing here waits on a clock."""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
from pathlib import Path

import pytest
from conftest import (
    TINY_FINETUNE,
    TINY_PRETRAIN,
    Pause,
    finish_launch,
    kill_launch,
    rank_env,
    rank_stderr,
    torchrun_command,
)
from test_bad_inputs import assert_one_line_error, run_cli

from myriad.cli import main

#: The suite's tiny pretraining without plots.
PRETRAIN = (*TINY_PRETRAIN, "plots=false")

#: A tiny CPO over two ranks (4 members, 16 envs), started from the suite's tiny pretraining.
FINETUNE = (
    *(o for o in TINY_FINETUNE if not o.startswith(("population.actor", "population.critic"))),
    "num_envs=16",
    "population.size=4",
    "task=dense",
    "iterations=4",
    "plots=false",
    "tensorboard=false",
    "init.episodes=2",
    "init.critic_warmup=1",
)


def launch(*args: str, env: dict[str, str] | None = None, **popen) -> subprocess.Popen:
    """``torchrun --nproc_per_node=2 -m myriad ARGS`` in the background."""
    return subprocess.Popen(
        torchrun_command("-m", "myriad", *args),
        env={**rank_env(), **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **popen,
    )


def finish(child: subprocess.Popen, timeout: float = 300) -> tuple[int, list[str]]:
    """Wait for a launch; its status and what its ranks printed on stderr."""
    _, err = finish_launch(child, timeout)
    return child.returncode, rank_stderr(err)


def assert_one_line_from_rank_0(code: int, lines: list[str]) -> str:
    """A failed launch whose ranks printed one line between them, ``myriad: error: ...``."""
    assert code != 0, lines
    assert len(lines) == 1 and lines[0].startswith("myriad: error: "), lines
    return lines[0]


def hold_then_kill(
    start: list[str], refused: list[list[str]], torchrun_refused: list[str], capsys
) -> tuple[Path, int]:
    """Launch ``start`` on two ranks, hold rank 0 after its first checkpoint and aim every
    command of ``refused`` (in this process) and ``torchrun_refused`` (another two-rank launch)
    at its folder: each is refused in one line naming rank 0's PID. Then kill every rank.
    Returns the run folder (its ``--run-dir`` is the last argument) and rank 0's PID."""
    run = Path(start[start.index("--run-dir") + 1])
    with Pause("checkpoint.saved:1") as pause:
        child = launch(*start, env=pause.env)
        try:
            pid = pause.wait(child)
            # Rank 0 holds the lock; the other rank never took it (the launch got this far).
            assert json.loads((run / ".myriad.lock").read_text())["pid"] == pid
            for args in refused:
                code, err = run_cli(args, capsys)
                assert_one_line_error(code, err)
                assert f"in use by process {pid}" in err, (args, err)
            if torchrun_refused:
                code, lines = finish(launch(*torchrun_refused))
                assert f"in use by process {pid}" in assert_one_line_from_rank_0(code, lines)
        finally:
            kill_launch(child)  # every rank, SIGKILL: the lock file stays, held by nobody
    return run, pid


def test_pretraining_on_two_ranks_is_locked_and_a_killed_launch_is_taken_over(tmp_path, capsys):
    run = tmp_path / "run"
    start = ["pretrain", *PRETRAIN, "--run-dir", str(run)]
    refused = [
        ["pretrain", "--resume", str(run)],
        ["pretrain", *PRETRAIN, "--run-dir", str(run)],
        ["pretrain", *PRETRAIN, "--run-dir", str(run), "--overwrite"],
        ["report", str(run), "--no-render"],
    ]
    run, pid = hold_then_kill(start, refused, ["pretrain", "--resume", str(run)], capsys)
    assert [p.name for p in (run / "checkpoints").glob("*.pt")] == ["iter_000002.pt"]
    code, lines = finish(launch("pretrain", "--resume", str(run)))
    assert code == 0, lines
    assert any(f"took over the lock of {run} from process {pid}" in line for line in lines)
    assert json.loads((run / "summary.json").read_text())["iterations"] == 4
    assert main(["dataset", "verify", str(run)]) == 0
    # No row lost or doubled across the kill: every env's every step, 4 x 16 x 64, as an
    # uninterrupted run writes.
    from myriad.datasets import load

    assert len(load(run)) == 4 * 16 * 64
    assert json.loads((run / ".myriad.lock").read_text() or "{}") == {}  # released at the end


def test_finetuning_on_two_ranks_is_locked_taken_over_and_names_a_denied_write(
    tiny_pretrain, tmp_path, capsys
):
    run = tmp_path / "ft"
    start = ["finetune", "--algo", "cpo", "--init", str(tiny_pretrain.path), *FINETUNE]
    start += ["--run-dir", str(run)]
    refused = [
        ["finetune", "--resume", str(run)],
        ["finetune", "--algo", "cpo", *FINETUNE, "--run-dir", str(run)],
        ["eval", str(run), "--episodes", "1"],
        ["export-policy", str(run), "--format", "torchscript"],
    ]
    run, pid = hold_then_kill(start, refused, [], capsys)
    code, lines = finish(launch("finetune", "--resume", str(run)))
    assert code == 0, lines
    assert any(f"took over the lock of {run} from process {pid}" in line for line in lines)
    assert json.loads((run / "summary.json").read_text())["iterations"] == 4
    # A permission error on two ranks: extending the run into a checkpoints/ folder it may not
    # write fails in one line naming the checkpoint and the command to resume with.
    checkpoints = run / "checkpoints"
    if os.geteuid() == 0:  # owned by someone else: root without its override cannot write it
        os.chown(checkpoints, 65534, 65534)
    checkpoints.chmod(0o555)
    child = launch(
        "finetune", "--resume", str(run), "iterations=6", preexec_fn=_without_permission_override
    )
    line = assert_one_line_from_rank_0(*finish(child))
    checkpoints.chmod(0o755)
    assert str(checkpoints) in line and "ermission denied" in line, line
    assert f"then run: torchrun --nproc_per_node=2 -m myriad finetune --resume {run}" in line


def _without_permission_override() -> None:
    """Root ignores file permissions: drop CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH from the
    bounding set, so that the launch and the ranks it starts honour them as any user does."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    for capability in (1, 2):
        if libc.prctl(24, capability, 0, 0, 0) != 0:  # PR_CAPBSET_DROP
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")


def _write_limit() -> None:
    """What a full disk looks like to the writer: every file write past 60 kB fails (EFBIG),
    for the agent and the ranks it starts."""
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (60_000, 60_000))


def test_full_disk_on_two_ranks_names_the_file_and_the_torchrun_command(tmp_path):
    run = tmp_path / "run"
    child = launch("pretrain", *PRETRAIN, "--run-dir", str(run), preexec_fn=_write_limit)
    line = assert_one_line_from_rank_0(*finish(child))
    assert str(run) in line and ("File too large" in line or "space" in line), line
    assert f"then run: torchrun --nproc_per_node=2 -m myriad pretrain --resume {run}" in line
    # The command it names continues the run once the disk has room.
    code, lines = finish(launch("pretrain", "--resume", str(run)))
    assert code == 0, lines
    assert main(["dataset", "verify", str(run)]) == 0


def test_a_rank_that_dies_leaves_rank_0_at_most_one_line_naming_it(tiny_pretrain, tmp_path):
    """Rank 1 killed (SIGKILL, right after its share of --init's ranking) while rank 0 waits
    for it in a collective: rank 0 says in one line that another rank stopped, never the
    internal-error form; or, when torchrun's SIGTERM reaches it first, nothing at all."""
    start = ["finetune", "--algo", "cpo", "--init", str(tiny_pretrain.path), *FINETUNE]
    child = launch(
        *start, "--run-dir", str(tmp_path / "ft"), env={"MYRIAD_KILL_AT": "init.ranked@1"}
    )
    code, lines = finish(child)
    assert code != 0 and len(lines) <= 1, lines
    for line in lines:
        assert line.startswith("myriad: error: another rank of this torchrun launch stopped"), line
        assert "GLHF" not in line and "Traceback" not in line, line  # gloo's advice cut off


def _gone(pid: int) -> bool:
    """The process has ended (reaped, or a zombie waiting for its new parent to reap it)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1].startswith(("Z", "X"))
    except FileNotFoundError:
        return True


def test_a_launch_past_its_timeout_is_killed_with_its_ranks(tmp_path):
    """The suite's launch helpers kill the ranks of a launch that outlives its timeout, not
    only the torchrun agent (whose ranks, in sessions of their own, would keep running)."""
    import time

    script = tmp_path / "hold.py"
    script.write_text(
        "import os, signal, sys\n"
        "from pathlib import Path\n"
        "Path(sys.argv[1], os.environ['RANK']).write_text(str(os.getpid()))\n"
        "signal.pause()\n"
    )
    agent = subprocess.Popen(
        torchrun_command(str(script), str(tmp_path)),
        env=rank_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    files = [tmp_path / "0", tmp_path / "1"]
    deadline = time.monotonic() + 120
    while not all(f.is_file() and f.read_text() for f in files):  # both ranks are up
        assert agent.poll() is None, agent.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "the ranks never started"
        time.sleep(0.05)
    ranks = [int(f.read_text()) for f in files]
    with pytest.raises(subprocess.TimeoutExpired):
        finish_launch(agent, timeout=0.1)
    assert agent.poll() is not None
    assert all(_gone(pid) for pid in ranks), ranks
