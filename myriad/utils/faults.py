"""Named fault points: where a test can kill or hold the process to prove that no data is lost.

Code that writes durable state calls :func:`fault_point` at the moments between two writes
(a segment renamed, the finished dataset published, a checkpoint replaced, ...). Normally this is
one dictionary lookup. When the environment variable ``MYRIAD_KILL_AT`` names that point
(``name`` or ``name:N`` for its N-th passage, counted from 1; ``...@R`` on the rank ``R`` of a
``torchrun`` launch only), the process kills itself with
``SIGKILL`` there: no ``finally`` blocks, no flushes, as a power cut or ``kill -9`` would leave
it. The fault-injection tests (``tests/test_fault_injection.py``) run a command with each point,
resume it, and compare the result row for row with an uninterrupted run.

``MYRIAD_PAUSE_AT`` (same form) holds the process at a point instead, so that a test can act on
a run in a known state (aim a second command at a locked run, kill every process of a launch):
the process connects to the Unix socket named by ``MYRIAD_PAUSE_SOCKET``, sends
``"<point> <pid>\\n"`` and waits until the test closes the connection. A trigger, not a sleep.
"""

from __future__ import annotations

import os
import signal
import socket

ENV_VAR = "MYRIAD_KILL_AT"
PAUSE_VAR = "MYRIAD_PAUSE_AT"
PAUSE_SOCKET_VAR = "MYRIAD_PAUSE_SOCKET"

_passages: dict[tuple[str, str], int] = {}


def _selected(variable: str, name: str) -> bool:
    """Whether ``variable`` (``point``, ``point:N``, either with ``@RANK``) selects this
    passage of ``name``."""
    spec = os.environ.get(variable)
    if not spec:
        return False
    spec, _, rank = spec.partition("@")
    point, _, count = spec.partition(":")
    if point != name or (rank and os.environ.get("RANK", "0") != rank):
        return False
    key = (variable, name)
    _passages[key] = _passages.get(key, 0) + 1
    return _passages[key] == (int(count) if count else 1)


def fault_point(name: str) -> None:
    """Kill this process with SIGKILL if ``MYRIAD_KILL_AT`` selects this passage of ``name``;
    hold it until released if ``MYRIAD_PAUSE_AT`` does."""
    if _selected(PAUSE_VAR, name):
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as channel:
            channel.connect(os.environ[PAUSE_SOCKET_VAR])
            channel.sendall(f"{name} {os.getpid()}\n".encode())
            while channel.recv(64):  # until the test closes the connection
                pass
    if _selected(ENV_VAR, name):
        os.kill(os.getpid(), signal.SIGKILL)
