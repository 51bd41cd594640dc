"""The pull of PPO's clip on off-policy rows: where the leader's loss on its followers' rows moves
it when the advantages carry no information about the actions.

SAPG's and CPO's leader minimises PPO's clipped loss on follower rows with the ratio
``r = pi_L(a|s) / pi_f(a|s)`` to the follower that acted (the authors' form,
``off_policy_trust_region="behaviour"``). Take advantages independent of the action with mean
zero, ``A ~ N(0, 1)``. A row whose ratio lies inside ``[1 - eps, 1 + eps]`` passes
``A r grad log pi_L``, zero on average. A row outside passes a gradient for one sign of ``A``
only: ``r < 1 - eps`` (the follower takes the action more often than the leader) for
``A > 0``, ``r > 1 + eps`` for ``A < 0`` (and, with the dual clip ``c``, only while
``r <= c``). So the expected gradient of the
objective (minus the loss) with respect to the leader's parameters is

    g = E[A; A > 0] * integral of pi_L(a) grad log pi_L(a) (1{r < 1 - eps} - 1{1 + eps < r <= c}) da

with ``E[A; A > 0] = 1 / sqrt(2 pi)``: it raises ``pi_L`` where the follower's density exceeds
the leader's and lowers it where the leader's exceeds the follower's, a pull towards the
follower's action distribution. With the trust region around the leader's own policy
(``off_policy_trust_region="leader"``) every row lies inside the clip when the update begins
and ``g = 0``.

Here the leader is ``N(0, I)`` in ``d`` dimensions and the follower ``N(m, s^2 I)``; ``g`` is
computed by quadrature on a grid for the leader's mean (first coordinate) and its log std
(summed over the ``d`` coordinates), PPO's ``eps = 0.2``, without and with the dual clip at 3.
``tests/test_off_policy_clip_pull.py`` checks the figures against Monte Carlo estimates through
the library's own loss functions.

    python benchmarks/off_policy_clip_pull.py

Writes ``benchmarks/results/off_policy_clip_pull.json``.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

import numpy as np

RESULTS = Path(__file__).resolve().parent / "results"
CLIP = 0.2
DUAL_CLIP = 3.0
#: (dimensions, follower mean offset on the first coordinate, follower std).
CASES: tuple[tuple[int, float, float], ...] = (
    (1, 0.0, 1.0),
    (1, 0.0, 1.5),
    (1, 0.0, 2.0),
    (1, 0.0, 0.7),
    (1, 0.5, 1.0),
    (1, 1.0, 1.0),
    (2, 0.0, 1.5),
    (2, 0.5, 1.0),
)
#: Decimals kept of each figure: the quadrature's error is below 5e-4.
DECIMALS = 3
#: E[A; A > 0] for A ~ N(0, 1).
POSITIVE_PART = 1.0 / math.sqrt(2.0 * math.pi)


def expected_pull(
    dims: int,
    offset: float,
    std: float,
    clip: float = CLIP,
    dual_clip: float | None = None,
    points: int | None = None,
    half_width: float = 10.0,
) -> dict[str, float]:
    """Expected gradient of the leader's clipped off-policy objective, per row, with
    ``A ~ N(0, 1)`` independent of the action: ``{"mean": d/d mu_1, "log_std": sum_i
    d/d log sigma_i}``, the leader ``N(0, I)`` and the follower ``N(offset e_1, std^2 I)`` in
    ``dims`` dimensions (1 or 2), by the rectangle rule on ``points`` per axis over
    ``[-half_width, half_width]`` (default: 200,001 in one dimension, 2,401 in two). The
    integrand jumps where the ratio crosses the clip's bounds, so the rule's error is of the
    order of the step: below 5e-4 at the defaults (:data:`DECIMALS` are kept)."""
    if dims not in (1, 2):
        raise ValueError(f"dims must be 1 or 2, got {dims}")
    if points is None:
        points = 200_001 if dims == 1 else 2_401
    axis = np.linspace(-half_width, half_width, points)
    step = axis[1] - axis[0]
    grids = np.meshgrid(*([axis] * dims), indexing="ij")
    a = np.stack([g.ravel() for g in grids], axis=1)  # [N, d]
    log_leader = -0.5 * (a**2).sum(1) - 0.5 * dims * math.log(2 * math.pi)
    shifted = a.copy()
    shifted[:, 0] -= offset
    log_follower = (
        -0.5 * (shifted**2).sum(1) / std**2
        - dims * math.log(std)
        - 0.5 * dims * math.log(2 * math.pi)
    )
    ratio = np.exp(log_leader - log_follower)
    upper = math.inf if dual_clip is None else dual_clip
    sign = (ratio < 1.0 - clip).astype(float) - ((ratio > 1.0 + clip) & (ratio <= upper))
    weight = np.exp(log_leader) * sign * step**dims
    # grad log N(a; mu, sigma) at mu = 0, sigma = 1: d/d mu = a, d/d log sigma = a^2 - 1.
    return {
        "mean": round(float(POSITIVE_PART * (weight * a[:, 0]).sum()), DECIMALS) + 0.0,
        "log_std": round(float(POSITIVE_PART * (weight * ((a**2) - 1.0).sum(1)).sum()), DECIMALS)
        + 0.0,
    }


def run_case(dims: int, offset: float, std: float) -> dict[str, Any]:
    """One case's expected pulls under the three forms of the off-policy loss."""
    return {
        "dims": dims,
        "follower_mean_offset": offset,
        "follower_std": std,
        "behaviour": expected_pull(dims, offset, std),
        "behaviour_dual_clip": expected_pull(dims, offset, std, dual_clip=DUAL_CLIP),
        "leader": {"mean": 0.0, "log_std": 0.0},
    }


def run() -> dict[str, Any]:
    rows = [run_case(dims, offset, std) for dims, offset, std in CASES]
    return {
        "benchmark": "off_policy_clip_pull",
        "clip": CLIP,
        "dual_clip": DUAL_CLIP,
        "advantages": "N(0, 1), independent of the action",
        "leader": "N(0, I)",
        "note": "expected gradient of the objective (minus the loss) per follower row, by "
        "quadrature; 'leader' is the trust region around the leader's own policy, zero as the "
        "update begins (every row inside the clip)",
        "cases": rows,
    }


def main() -> int:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from myriad.bench.common import write_json

    result = run()
    out = RESULTS / "off_policy_clip_pull.json"
    write_json(out, result)
    for row in result["cases"]:
        print(
            f"d={row['dims']} offset={row['follower_mean_offset']} std={row['follower_std']}: "
            f"behaviour {row['behaviour']}, dual clip {row['behaviour_dual_clip']}"
        )
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
