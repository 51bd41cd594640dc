"""Named fault points: where a test can kill the process to prove that no data is lost.

Code that writes durable state calls :func:`fault_point` at the moments between two writes
(a segment renamed, the finished dataset published, a checkpoint replaced, ...). Normally this is
one dictionary lookup. When the environment variable ``MYRIAD_KILL_AT`` names that point
(``name`` or ``name:N`` for its N-th passage, counted from 1), the process kills itself with
``SIGKILL`` there: no ``finally`` blocks, no flushes, as a power cut or ``kill -9`` would leave
it. The fault-injection tests (``tests/test_fault_injection.py``) run a command with each point,
resume it, and compare the result row for row with an uninterrupted run.
"""

from __future__ import annotations

import os
import signal

ENV_VAR = "MYRIAD_KILL_AT"

_passages: dict[str, int] = {}


def _target() -> tuple[str, int] | None:
    spec = os.environ.get(ENV_VAR)
    if not spec:
        return None
    name, _, count = spec.partition(":")
    return name, int(count) if count else 1


def fault_point(name: str) -> None:
    """Kill this process with SIGKILL if ``MYRIAD_KILL_AT`` selects this passage of ``name``."""
    target = _target()
    if target is None or target[0] != name:
        return
    _passages[name] = _passages.get(name, 0) + 1
    if _passages[name] == target[1]:
        os.kill(os.getpid(), signal.SIGKILL)
