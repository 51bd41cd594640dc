"""What a worker needs from a policy, and the action distributions it samples from.

A policy for worker-side inference is any ``torch.nn.Module`` with

- ``action_params(obs [N, O], member [N] long) -> params``: the action distribution of each row's
  member, as ``(mean [N, A], log_std [N, A] or [A])`` for a diagonal Gaussian (what
  :class:`myriad.nn.PopulationActorCritic` returns) or ``logits [N, K]`` for a categorical; a
  mapping with keys ``{"mean", "log_std"}`` or ``{"logits"}`` is accepted too;
- ``act(obs, member, ...)``: the policy's own sampler, used by learner-side code. Workers sample
  from ``action_params`` with the functions below instead, so the log-probability they return is
  exactly the density of the parameters they return (the quantity APS and PPO need).

Parameters travel as a plain dict of tensors, ``{"mean", "log_std"}`` or ``{"logits"}``, every
entry with the same leading shape as the states (``log_std`` is expanded to the mean's shape).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

import torch
from torch import nn

from myriad.nn.distributions import (
    categorical_kl,
    categorical_log_prob,
    gaussian_kl,
    gaussian_log_prob,
    gaussian_sample,
)

GAUSSIAN = "gaussian"
CATEGORICAL = "categorical"
DistParams = dict[str, torch.Tensor]


@runtime_checkable
class ParamsPolicy(Protocol):
    """What a worker calls on its policy copy: ``action_params`` (see the module docstring)."""

    def action_params(self, obs: torch.Tensor, member: torch.Tensor) -> Any: ...


@runtime_checkable
class WorkerPolicy(ParamsPolicy, Protocol):
    """The interface :class:`myriad.distributed.APSCollector` needs from a policy module."""

    def act(self, obs: torch.Tensor, member: torch.Tensor, *args: Any, **kwargs: Any) -> Any: ...


def as_dist_params(output: Any) -> DistParams:
    """Normalise what ``action_params`` returned into ``{"mean", "log_std"}`` or ``{"logits"}``.

    A state-independent ``log_std`` (``[A]`` or ``[1, A]``) is expanded to the mean's shape, so
    parameters of different rows can be concatenated and indexed uniformly.

    Raises:
        TypeError: the output is none of the accepted forms.
    """
    if isinstance(output, torch.Tensor):
        return {"logits": output}
    if isinstance(output, Mapping):
        keys = set(output)
        if keys == {"logits"}:
            return {"logits": output["logits"]}
        if keys == {"mean", "log_std"}:
            mean, log_std = output["mean"], output["log_std"]
            return {"mean": mean, "log_std": log_std.expand_as(mean)}
        raise TypeError(
            f"action_params returned a mapping with keys {sorted(keys)}; expected "
            "{'mean', 'log_std'} (Gaussian) or {'logits'} (categorical)"
        )
    if isinstance(output, tuple | list) and len(output) == 2:
        mean, log_std = output
        return {"mean": mean, "log_std": log_std.expand_as(mean)}
    raise TypeError(
        "action_params must return (mean, log_std), logits, or a mapping with those keys; "
        f"got {type(output).__name__}"
    )


def dist_kind(params: Mapping[str, torch.Tensor]) -> str:
    """``"gaussian"`` or ``"categorical"`` for a parameter dict from :func:`as_dist_params`."""
    return CATEGORICAL if "logits" in params else GAUSSIAN


def dist_kl(p: Mapping[str, torch.Tensor], q: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """Exact ``KL(p || q)`` per row between two parameter dicts of the same kind -> ``[...]``."""
    kind_p, kind_q = dist_kind(p), dist_kind(q)
    if kind_p != kind_q:
        raise ValueError(f"cannot compare a {kind_p} policy with a {kind_q} one")
    if kind_p == CATEGORICAL:
        return categorical_kl(p["logits"], q["logits"])
    return gaussian_kl(p["mean"], p["log_std"], q["mean"], q["log_std"])


def dist_log_prob(params: Mapping[str, torch.Tensor], actions: torch.Tensor) -> torch.Tensor:
    """Log-probability of ``actions`` (``[..., A]`` float or ``[...]`` integer) -> ``[...]``."""
    if dist_kind(params) == CATEGORICAL:
        return categorical_log_prob(actions, params["logits"])
    return gaussian_log_prob(actions, params["mean"], params["log_std"])


def dist_sample(
    params: Mapping[str, torch.Tensor], generator: torch.Generator | None = None
) -> torch.Tensor:
    """One sample per row: ``[..., A]`` float (Gaussian) or ``[...]`` long (categorical)."""
    if dist_kind(params) == CATEGORICAL:
        logits = params["logits"]
        probs = torch.softmax(logits, dim=-1).reshape(-1, logits.shape[-1])
        idx = torch.multinomial(probs, 1, generator=generator)
        return idx.reshape(logits.shape[:-1])
    return gaussian_sample(params["mean"], params["log_std"], generator)


class LinearPolicy(nn.Module):
    """M linear policies (one per member) for worker-side inference: a small reference policy.

    Gaussian: ``mean = obs @ weight[m] + bias[m]``, state-independent ``log_std[m]``.
    Categorical: ``logits = obs @ weight[m] + bias[m]`` over ``num_outputs`` actions.

    Args:
        obs_dim: ``O``.
        num_outputs: ``A`` (Gaussian) or the number of discrete actions ``K`` (categorical).
        num_members: ``M``.
        kind: ``"gaussian"`` or ``"categorical"``.
        init_log_std: initial log standard deviation (Gaussian).
    """

    def __init__(
        self,
        obs_dim: int,
        num_outputs: int,
        num_members: int = 1,
        kind: str = GAUSSIAN,
        init_log_std: float = 0.0,
    ) -> None:
        super().__init__()
        if kind not in (GAUSSIAN, CATEGORICAL):
            raise ValueError(f"kind must be {GAUSSIAN!r} or {CATEGORICAL!r}, got {kind!r}")
        self.kind = kind
        self.weight = nn.Parameter(torch.zeros(num_members, obs_dim, num_outputs))
        self.bias = nn.Parameter(torch.zeros(num_members, num_outputs))
        self.log_std = nn.Parameter(torch.full((num_members, num_outputs), float(init_log_std)))

    def _linear(self, obs: torch.Tensor, member: torch.Tensor) -> torch.Tensor:
        # Gathering each row's weights keeps one batched matmul for any member assignment.
        w = self.weight[member]  # [N, O, K]
        return torch.bmm(obs.unsqueeze(1), w).squeeze(1) + self.bias[member]

    def action_params(
        self, obs: torch.Tensor, member: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor] | torch.Tensor:
        """``(mean [N, A], log_std [N, A])`` or ``logits [N, K]`` for ``obs [N, O]``."""
        out = self._linear(obs, member)
        if self.kind == CATEGORICAL:
            return out
        return out, self.log_std[member]

    @torch.no_grad()
    def act(
        self,
        obs: torch.Tensor,
        member: torch.Tensor,
        generator: torch.Generator | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(actions, log_prob [N])``; actions ``[N, A]`` float or ``[N]`` long."""
        params = as_dist_params(self.action_params(obs, member))
        actions = dist_sample(params, generator)
        return actions, dist_log_prob(params, actions)
