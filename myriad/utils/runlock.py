"""One process at a time in a run folder: a lock file held with ``flock``.

The lock is ``RUN/.myriad.lock``; the process that holds it writes its PID and host into it. The
kernel releases an ``flock`` when its process ends, however it ends (``kill -9`` included), so a
lock file left by a killed process is not held by anyone and the next process takes it over: a
stale lock needs no clean-up and no timeout. A second process that finds the lock held is
refused in one line naming the PID that holds it.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from types import TracebackType

from myriad.utils.config import ConfigError
from myriad.utils.ownership import LOCK_NAME


class RunInUseError(ConfigError):
    """Another process holds the run folder's lock."""


class RunLock:
    """The lock of the run folder ``run_dir``, held from :meth:`acquire` to :meth:`release`
    (or the end of the process).

    Args:
        run_dir: the run folder (it exists).
        command: what holds it, for the message a second process prints (``"pretrain"``).
    """

    def __init__(self, run_dir: str | os.PathLike[str], command: str) -> None:
        self.path = Path(run_dir) / LOCK_NAME
        self.command = command
        self._fd: int | None = None
        self._key = ""
        self._nested: str | None = None
        #: The PID a stale lock file named when this process took it over (None: no stale lock).
        self.took_over: int | None = None

    def acquire(self) -> RunLock:
        """Take the lock.

        Raises:
            RunInUseError: another live process holds it (the message names its PID).
        """
        key = str(self.path.resolve())
        if key in _HELD:  # this process holds it already (report renders into its own run)
            _HELD[key] += 1
            self._nested = key
            return self
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read(fd)
            os.close(fd)
            raise in_use_error(self.path, holder) from None
        pid = _read(fd).get("pid")
        if isinstance(pid, int):
            self.took_over = pid
        record = {"pid": os.getpid(), "host": socket.gethostname(), "command": self.command}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(record).encode(), 0)
        self._fd = fd
        _HELD[key] = 1
        self._key = key
        return self

    def release(self) -> None:
        """Release the lock; the file stays (its content names the last holder)."""
        if self._nested is not None:
            _HELD[self._nested] -= 1
            self._nested = None
            return
        if self._fd is not None:
            _HELD.pop(self._key, None)
            os.ftruncate(self._fd, 0)
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()


def in_use_error(path: Path, holder: dict[str, object]) -> RunInUseError:
    """The one-line refusal for the lock file ``path`` held by ``holder`` (its record)."""
    pid = holder.get("pid", "?")
    what = holder.get("command", "myriad")
    return RunInUseError(
        f"{path.parent} is in use by process {pid} (myriad {what}, lock {path}): wait for it "
        f"to end, or stop it (kill {pid}) and run again"
    )


def check_not_in_use(run_dir: str | os.PathLike[str]) -> None:
    """Refuse (:class:`RunInUseError`, naming the PID) a run folder whose lock another live
    process holds; a folder without a lock file, or with a stale one, passes. Nothing is
    created or changed: the lock is only probed (a shared ``flock`` taken and dropped).

    Raises:
        RunInUseError: another process holds the lock.
    """
    path = Path(run_dir) / LOCK_NAME
    if str(path.resolve()) in _HELD:
        return
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # no lock file (or none this process may read): nobody to wait for
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        raise in_use_error(path, _read(fd)) from None
    finally:
        os.close(fd)  # closing drops the probe's shared lock


def lock_if_inside_a_run(
    out: str | os.PathLike[str], command: str
) -> AbstractContextManager[RunLock | None]:
    """The lock of the run folder that holds the output ``out`` (a folder above it with a
    ``config.yaml``), for a command that writes into a run (``eval``'s ``RUN/eval.json``,
    ``export-policy``'s ``RUN/policy/``); nothing to hold for an output outside any run."""
    target = Path(out).resolve()
    for folder in (target, *target.parents):
        if (folder / "config.yaml").is_file():
            return RunLock(folder, command)
    return nullcontext()


#: Lock files this process holds, with how many :class:`RunLock` objects share each.
_HELD: dict[str, int] = {}


def _read(fd: int) -> dict[str, object]:
    try:
        data = json.loads(os.pread(fd, 4096, 0) or b"{}")
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}
