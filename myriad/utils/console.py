"""The console block of a run: the key figures every few seconds, as rsl_rl and SB3 print them.

While a run trains, :class:`ConsoleReport` prints a compact block of its latest scalars (speed,
returns or success, entropy and coverage for pretraining, KL to the leader for CPO, losses)
every ``every`` iterations, or, by default, at most every ``every_s`` seconds. On a terminal the
block goes above the progress bar (through the bar's own console, so the bar stays at the
bottom); when stdout is a file or a pipe (SLURM, ``nohup``) the same block is written as plain
lines and flushed, so a log file shows progress while the run trains. :meth:`ConsoleReport.status`
says what a run is doing between blocks (final evaluation, plots), so nothing stays silent long.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TextIO

#: A line of the block: a label and the scalars it shows as ``(name, label, format)``; a name
#: ending in ``*`` shows every scalar under that prefix as one list (per-follower values).
Line = tuple[str, Sequence[tuple[str, str, str]]]


def _fields(*specs: str) -> tuple[tuple[str, str, str], ...]:
    """``"name|label|format"`` specs as ``(name, label, format)`` triples."""
    fields = []
    for spec in specs:
        name, label, fmt = spec.split("|")
        fields.append((name, label, fmt))
    return tuple(fields)


#: The block's lines, in order; scalars a run does not log are left out, and so are empty lines.
LINES: tuple[Line, ...] = (
    (
        "episodes",
        _fields(
            "episode/return|return|{:.3f}",
            "episode/success|success|{:.1%}",
            "episode/length|length|{:.1f}",
            "episode/count|count|{:.0f}",
            "train/intrinsic_reward|intrinsic reward|{:.3g}",
        ),
    ),
    (
        "evaluation",
        _fields(
            "eval/leader_success|leader success|{:.1%}",
            "eval/leader_return|leader return|{:.3f}",
            "eval/population_success|best member|{:.1%}",
        ),
    ),
    (
        "entropy",
        _fields(
            "entropy/collective|collective|{:.3f}",
            "entropy/individual_mean|individual|{:.3f}",
            "entropy/diversity|diversity|{:.3f}",
        ),
    ),
    (
        "coverage",
        _fields(
            "coverage/union|union|{:.1%}",
            "coverage/member_mean|member mean|{:.1%}",
            "coverage/cumulative_union|visited|{:.1%}",
        ),
    ),
    (
        "KL to leader",
        _fields(
            "kl_to_leader/on_own_states_mean|mean|{:.3g}",
            "cpo/kl/follower_*|followers|{:.3g}",
            "cpo/kl_mean|followers mean|{:.3g}",
            "cpo/kl_target/follower_*|targets|{:.3g}",
        ),
    ),
    (
        "diversity",
        _fields(
            "diversity/pairwise_kl_mean|pairwise KL mean|{:.3g}",
            "diversity/pairwise_kl_min|min|{:.3g}",
        ),
    ),
    (
        "losses",
        _fields(
            "train/loss|total|{:.4g}",
            "train/policy_loss|policy|{:.4g}",
            "train/value_loss|value|{:.4g}",
            "train/disc_loss|discriminator|{:.4g}",
        ),
    ),
    (
        "update",
        _fields(
            "train/entropy|policy entropy|{:.3f}",
            "train/approx_kl|approx KL|{:.3g}",
            "train/clip_fraction|clipped|{:.1%}",
            "train/explained_variance|expl. var|{:.3f}",
            "train/lr|lr|{:.2e}",
        ),
    ),
)


def _duration(seconds: float) -> str:
    seconds = max(0, round(seconds))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def _field(scalars: Mapping[str, float], name: str, label: str, fmt: str) -> str | None:
    if name.endswith("*"):
        prefix = name[:-1]
        keys = [k for k in scalars if k.startswith(prefix)]
        keys.sort(key=lambda k: (len(k), k))  # follower_2 before follower_10
        if not keys:
            return None
        return f"{label} " + " ".join(fmt.format(scalars[k]) for k in keys)
    if name not in scalars:
        return None
    value = scalars[name]
    return f"{label} {fmt.format(value) if value == value else 'nan'}"


def format_block(
    scalars: Mapping[str, float],
    iteration: int,
    total: int,
    env_steps: int,
    elapsed_s: float,
    steps_per_second: float,
    eta_s: float = 0.0,
) -> list[str]:
    """The block's lines for the latest ``scalars`` after ``iteration`` of ``total``
    iterations: a header (iteration, env steps, steps/s, time elapsed and left), then one line
    per group of :data:`LINES` that the run logs."""
    left = f", ETA {_duration(eta_s)}" if iteration < total else ""
    lines = [
        f"iteration {iteration}/{total} | {env_steps:,} env steps | "
        f"{steps_per_second:,.0f} steps/s | {_duration(elapsed_s)} elapsed{left}"
    ]
    width = max(len(label) for label, _ in LINES)
    for label, fields in LINES:
        parts = [p for f in fields if (p := _field(scalars, *f)) is not None]
        if parts:
            lines.append(f"  {label:<{width}}  " + "  ".join(parts))
    return lines


class ConsoleReport:
    """Prints :func:`format_block` during training and status lines around it.

    Args:
        enabled: print anything at all (off on the ranks of a ``torchrun`` launch but rank 0).
        every: iterations between blocks; 0 prints by time instead.
        every_s: with ``every`` 0, seconds between blocks (at least one iteration apart); 0
            turns the blocks off (status lines are still printed).
        stream: where plain lines go (default ``sys.stdout``, read when printing).
        clock: seconds, monotonic (tests pass their own).
    """

    def __init__(
        self,
        enabled: bool = True,
        every: int = 0,
        every_s: float = 10.0,
        stream: TextIO | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if every < 0 or every_s < 0:
            from myriad.utils.config import ConfigError

            raise ConfigError(
                f"console.every and console.every_s must be >= 0, got {every} and {every_s}"
            )
        self.enabled = enabled
        self.every = int(every)
        self.every_s = float(every_s)
        self._stream = stream
        self._clock = clock
        self._last = clock()
        #: A rich console to print through while a progress bar is shown (set by the runner).
        self.rich: Any = None

    def due(self, iteration: int) -> bool:
        """Whether a block is due after ``iteration`` (1-based)."""
        if not self.enabled:
            return False
        if self.every:
            return iteration % self.every == 0
        return self.every_s > 0 and self._clock() - self._last >= self.every_s

    def block(self, lines: Sequence[str]) -> None:
        """Print the block's ``lines`` (:func:`format_block`) and restart the interval."""
        self._print(lines)
        self._last = self._clock()

    def status(self, text: str) -> None:
        """One line saying what the run is doing now (``myriad: final evaluation ...``)."""
        if self.enabled:
            self._print([f"myriad: {text}"])
            self._last = self._clock()

    def _print(self, lines: Sequence[str]) -> None:
        if self.rich is not None:
            # Above the live progress bar, in one print so the bar is redrawn once; markup off,
            # the figures may hold brackets.
            self.rich.print("\n".join(lines), markup=False, highlight=False, soft_wrap=True)
            return
        stream = self._stream or sys.stdout
        stream.write("\n".join(lines) + "\n")
        stream.flush()
