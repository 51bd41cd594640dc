"""A KL set point for CPO's followers: the coupling coefficients adapted every iteration.

With fixed coefficients a follower's distance to the leader drifts with training: the AWAC pull
and the KL penalty collapse it onto the leader, or a strong adversarial reward drives it off the
task. :class:`KLSetpointController` holds each follower's ``D_i = KL(pi_i || pi_L)`` on its own
rollout states near a target ``delta_i`` (docs/algorithms.md §11): dual ascent on the log of the
KL penalty's coefficient, and, while a follower sits below ``low * delta_i``, a repulsion that
turns the penalty into a bonus for moving away from the leader and a larger adversarial
coefficient:

    e_i = clip(log(D_i / delta_i), -e_max, e_max)
    log lambda_i <- clip(log lambda_i + eta * e_i, log lambda_min, log lambda_max)
    rho_i        <- clip(rho_i - eta_rho * e_i, 0, rho_max)
    log c_i      <- clip(log c_i - eta_adv * e_i, log c_min, log c_max)
                    (rho and c: only when D_i < low * delta_i, rising, or D_i > delta_i, falling)

The penalty's coefficient in effect is ``lambda_i - rho_i`` (negative: a KL bonus). Everything
is a tensor over the F followers; one :meth:`KLSetpointController.step` per iteration, after the
PPO epochs, from the KL of the updated policies.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from myriad.utils.settings import Check, at_least, check_fields, positive, setting


@dataclass
class KLSetpointConfig:
    """The controller's gains and bounds (``algo.setpoint.*``).

    Attributes:
        kl_coef_init: lambda of every follower at the start (None: the fixed mode's, the
            preset's or ``kl_coef``).
        adversarial_coef_init: c at the start (None: ``adversarial_coef``).
        eta: step of ``log lambda`` per unit of KL error ``log(D / delta)``.
        max_error: the error's clip ``e_max``: one iteration far from the target moves the
            coefficients no more than one at ``exp(e_max)`` x the target (no wind-up after the
            large KL of a freshly initialised follower).
        kl_coef_min, kl_coef_max: bounds of lambda.
        repulsion_eta: step of rho per unit of KL error (0 turns the repulsion off).
        repulsion_max: the ceiling of rho.
        damping: ``k_d``, the derivative term added to the coefficient in effect, ``k_d (e_t -
            e_{t-1})``: a KL that rises fast is pulled in before it overshoots, one that falls
            fast is let go (the derivative term of a PID Lagrangian); 0 turns it off.
        adversarial_eta: step of ``log c`` per unit of KL error.
        adversarial_coef_min: the floor c decays toward while a follower is above its target.
        adversarial_coef_max: the ceiling of c.
        low: rho and c rise while ``D < low * delta``.
        scale_awac: the AWAC pull toward the leader's actions, the other coupling that draws a
            follower in, follows the penalty: follower i's beta is ``beta * lambda_i /
            lambda_init``.
    """

    kl_coef_init: float | None = setting(
        None, help="lambda at the start (null: kl_coef, else the preset's)", check=at_least(0)
    )
    adversarial_coef_init: float | None = setting(
        0.02, help="c_adv once the actors train (null: adversarial_coef)", check=at_least(0)
    )
    eta: float = setting(
        0.5,
        help="log lambda += eta e, e = clip(log(KL / target), -max_error, max_error)",
        check=positive(),
    )
    max_error: float = setting(2.0, help="clip of the KL error e", check=positive())
    kl_coef_min: float = setting(0.01, help="floor of lambda", check=positive())
    kl_coef_max: float = setting(0.5, help="ceiling of lambda", check=positive())
    repulsion_eta: float = setting(
        0.05,
        help="rho -= repulsion_eta e outside [low target, target]; penalty lambda - rho "
        "(0: no repulsion)",
        check=at_least(0),
    )
    repulsion_max: float = setting(0.5, help="ceiling of rho", check=at_least(0))
    damping: float = setting(
        0.2, help="k_d: penalty += k_d (e_t - e_{t-1}) (0: none)", check=at_least(0)
    )
    adversarial_eta: float = setting(
        0.1,
        help="log c_adv -= adversarial_eta e, outside [low target, target]",
        check=positive(),
    )
    adversarial_coef_min: float = setting(0.002, help="floor of c_adv", check=positive())
    adversarial_coef_max: float = setting(0.1, help="ceiling of c_adv", check=positive())
    low: float = setting(
        0.5,
        help="rho and c_adv rise while KL < low x target",
        check=Check(lambda v: 0 < v < 1, "in (0, 1)"),
    )
    scale_awac: bool = setting(
        True, help="follower i's awac_coef follows its lambda: beta lambda_i / lambda_init"
    )

    def __post_init__(self) -> None:
        check_fields(self)
        for low, high in (
            ("kl_coef_min", "kl_coef_max"),
            ("adversarial_coef_min", "adversarial_coef_max"),
        ):
            lo, hi = float(getattr(self, low)), float(getattr(self, high))
            if not 0 < lo <= hi:
                raise ValueError(
                    f"setpoint.{low} and setpoint.{high} must satisfy 0 < min <= max, "
                    f"got {lo} and {hi}"
                )


class KLSetpointController:
    """Per-follower KL penalty, repulsion and adversarial coefficients driven toward KL targets.

    Args:
        targets: ``[F]`` KL targets ``delta_i`` in nats, all > 0.
        config: gains and bounds.
        kl_coef: initial lambda of every follower (clipped into the bounds).
        adversarial_coef: initial c of every follower (clipped into the bounds); None when the
            adversarial reward is off (only lambda is adapted).
        device: where the state lives.
    """

    def __init__(
        self,
        targets: Sequence[float] | torch.Tensor,
        config: KLSetpointConfig | None = None,
        kl_coef: float = 0.1,
        adversarial_coef: float | None = 0.002,
        device: torch.device | str = "cpu",
    ) -> None:
        self.config = config or KLSetpointConfig()
        cfg = self.config
        self.targets = torch.as_tensor(targets, dtype=torch.float32, device=device).reshape(-1)
        if self.targets.numel() == 0 or not bool((self.targets > 0).all()):
            raise ValueError(f"KL targets must be > 0, got {self.targets.tolist()}")
        f = self.targets.shape[0]
        self.log_kl_bounds = (math.log(cfg.kl_coef_min), math.log(cfg.kl_coef_max))
        self.log_adv_bounds = (
            math.log(cfg.adversarial_coef_min),
            math.log(cfg.adversarial_coef_max),
        )
        self.log_kl_coef = torch.full((f,), math.log(kl_coef), device=device).clamp(
            *self.log_kl_bounds
        )
        self.repulsion = torch.zeros(f, device=device)
        # e of the last step (NaN before the first) and its change over that step.
        self.last_error = torch.full((f,), float("nan"), device=device)
        self.error_change = torch.zeros(f, device=device)
        self.log_adversarial_coef: torch.Tensor | None = None
        if adversarial_coef is not None:
            self.log_adversarial_coef = torch.full(
                (f,), math.log(adversarial_coef), device=device
            ).clamp(*self.log_adv_bounds)

    @property
    def num_followers(self) -> int:
        return int(self.targets.shape[0])

    @property
    def kl_coef(self) -> torch.Tensor:
        """lambda of every follower, ``[F]`` (the pull, > 0)."""
        return self.log_kl_coef.exp()

    @property
    def penalty_coef(self) -> torch.Tensor:
        """The KL penalty's coefficient in effect, ``lambda - rho + k_d (e_t - e_{t-1})``,
        ``[F]`` (< 0: a bonus for moving away from the leader)."""
        return self.kl_coef - self.repulsion + self.config.damping * self.error_change

    @property
    def adversarial_coef(self) -> torch.Tensor | None:
        """c of every follower, ``[F]`` (None without the adversarial reward)."""
        return None if self.log_adversarial_coef is None else self.log_adversarial_coef.exp()

    def in_band(self, kl: torch.Tensor, low: float = 0.5, high: float = 2.0) -> torch.Tensor:
        """``[F]`` bool: ``low * delta_i <= D_i <= high * delta_i`` (``kl`` is brought to the
        targets' device and dtype)."""
        kl = kl.to(self.targets)
        return (kl >= low * self.targets) & (kl <= high * self.targets)

    @torch.no_grad()
    def step(self, kl: torch.Tensor) -> None:
        """One controller step from the followers' KL to the leader after an update.

        Args:
            kl: ``[F]``, ``D_i = KL(pi_i || pi_L)`` on follower i's own rollout states.
        """
        cfg = self.config
        kl = kl.to(self.targets)
        if kl.shape != self.targets.shape:
            raise ValueError(
                f"expected one KL per follower, shape {list(self.targets.shape)}, "
                f"got {list(kl.shape)}"
            )
        # The log-ratio treats "twice too far" and "half too close" alike; the clip keeps one
        # iteration far off (the large KL of a freshly initialised follower) from winding the
        # multiplier up for many iterations after.
        ratio = kl.clamp(min=1e-12) / self.targets
        error = ratio.log().clamp(-cfg.max_error, cfg.max_error)
        self.error_change = torch.nan_to_num(error - self.last_error, nan=0.0)
        self.last_error = error.clone()
        self.log_kl_coef.add_(cfg.eta * error).clamp_(*self.log_kl_bounds)
        # The pushes away act well below the target and relax above it: inside
        # [low * delta, delta] the penalty alone settles the distance and they hold still.
        outside = ((kl < cfg.low * self.targets) | (kl > self.targets)).to(error.dtype)
        self.repulsion.sub_(cfg.repulsion_eta * error * outside).clamp_(0.0, cfg.repulsion_max)
        if self.log_adversarial_coef is not None:
            step = -cfg.adversarial_eta * error * outside
            self.log_adversarial_coef.add_(step).clamp_(*self.log_adv_bounds)

    def state_dict(self) -> dict[str, Any]:
        state = {
            "targets": self.targets.detach().cpu().clone(),
            "log_kl_coef": self.log_kl_coef.detach().cpu().clone(),
            "repulsion": self.repulsion.detach().cpu().clone(),
            "last_error": self.last_error.detach().cpu().clone(),
            "error_change": self.error_change.detach().cpu().clone(),
        }
        if self.log_adversarial_coef is not None:
            state["log_adversarial_coef"] = self.log_adversarial_coef.detach().cpu().clone()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the coefficients; the targets must be the ones the state was saved with."""
        targets = state["targets"].to(self.targets)
        if not torch.equal(targets, self.targets):
            raise ValueError(
                f"the saved KL targets {targets.tolist()} differ from the configured "
                f"{self.targets.tolist()}"
            )
        self.log_kl_coef.copy_(state["log_kl_coef"])
        self.repulsion.copy_(state["repulsion"])
        self.last_error.copy_(state["last_error"])
        self.error_change.copy_(state["error_change"])
        if self.log_adversarial_coef is not None:
            self.log_adversarial_coef.copy_(state["log_adversarial_coef"])


def fraction_in_band(
    kl: torch.Tensor, targets: torch.Tensor, low: float = 0.5, high: float = 2.0
) -> torch.Tensor:
    """Per follower, the fraction of iterations with ``low * delta_i <= D_i <= high * delta_i``.

    Args:
        kl: ``[I, F]``, the followers' KL over I iterations.
        targets: ``[F]``.

    Returns:
        ``[F]`` in [0, 1] (NaN when I is 0).
    """
    inside = (kl >= low * targets) & (kl <= high * targets)
    return inside.to(torch.float32).mean(dim=0)
