"""A KL set point for CPO's followers: the coupling coefficients adapted every iteration.

With fixed coefficients a follower's distance to the leader drifts with training: the AWAC pull
and the KL penalty collapse it onto the leader, or a strong adversarial reward drives it off the
task. :class:`KLSetpointController` holds each follower's ``D_i = KL(pi_i || pi_L)`` on its own
rollout states near a target ``delta_i`` by dual ascent on the log of the KL penalty's
coefficient, and raises the adversarial coefficient while a follower sits below half its
target (docs/algorithms.md §7):

    e_i = (D_i - delta_i) / delta_i
    log lambda_i <- clip(log lambda_i + eta * e_i, log lambda_min, log lambda_max)
    log c_i      <- clip(log c_i - eta_adv * e_i, log c_min, log c_max)
                    only when D_i < low * delta_i (c rises) or D_i > delta_i (c decays)

Everything is a tensor over the F followers; one :meth:`KLSetpointController.step` per
iteration, after the PPO epochs, from the KL of the updated policies.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class KLSetpointConfig:
    """The controller's gains and bounds (``algo.setpoint.*``).

    Attributes:
        kl_coef_init: lambda of every follower at the start (None: the fixed mode's, the
            preset's or ``kl_coef``).
        adversarial_coef_init: c at the start (None: ``adversarial_coef``).
        eta: step of ``log lambda`` per unit of relative KL error ``(D - delta) / delta``.
        kl_coef_min, kl_coef_max: bounds of lambda.
        adversarial_eta: step of ``log c`` per unit of relative KL error.
        adversarial_coef_min: the floor c decays toward while a follower is above its target.
        adversarial_coef_max: the ceiling of c.
        low: c rises while ``D < low * delta``.
        scale_awac: the AWAC pull toward the leader's actions, the other coupling that draws a
            follower in, follows the penalty: follower i's beta is ``beta * lambda_i /
            lambda_init``.
    """

    kl_coef_init: float | None = None
    adversarial_coef_init: float | None = 0.02
    eta: float = 0.5
    kl_coef_min: float = 0.01
    kl_coef_max: float = 0.5
    adversarial_eta: float = 0.1
    adversarial_coef_min: float = 0.002
    adversarial_coef_max: float = 0.1
    low: float = 0.5
    scale_awac: bool = True

    def __post_init__(self) -> None:
        for name in ("eta", "adversarial_eta"):
            if not float(getattr(self, name)) > 0:
                raise ValueError(f"setpoint.{name} must be > 0, got {getattr(self, name)}")
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
        if not 0 < float(self.low) < 1:
            raise ValueError(f"setpoint.low must be in (0, 1), got {self.low}")


class KLSetpointController:
    """Per-follower KL penalty and adversarial coefficients driven toward KL targets.

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
        """lambda of every follower, ``[F]``."""
        return self.log_kl_coef.exp()

    @property
    def adversarial_coef(self) -> torch.Tensor | None:
        """c of every follower, ``[F]`` (None without the adversarial reward)."""
        return None if self.log_adversarial_coef is None else self.log_adversarial_coef.exp()

    def in_band(self, kl: torch.Tensor, low: float = 0.5, high: float = 2.0) -> torch.Tensor:
        """``[F]`` bool: ``low * delta_i <= D_i <= high * delta_i``."""
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
        error = (kl - self.targets) / self.targets  # relative error, >= -1
        self.log_kl_coef.add_(cfg.eta * error).clamp_(*self.log_kl_bounds)
        if self.log_adversarial_coef is not None:
            # Raised only well below the target, lowered above it: inside [low * delta, delta]
            # the penalty alone settles the distance and the adversarial reward holds still.
            outside = (kl < cfg.low * self.targets) | (kl > self.targets)
            step = -cfg.adversarial_eta * error * outside.to(error.dtype)
            self.log_adversarial_coef.add_(step).clamp_(*self.log_adv_bounds)

    def state_dict(self) -> dict[str, Any]:
        state = {
            "targets": self.targets.detach().cpu().clone(),
            "log_kl_coef": self.log_kl_coef.detach().cpu().clone(),
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
