"""TD3 on a fixed dataset (Fujimoto et al. 2018), the plain off-policy learner of ExORL.

ExORL ("Don't Change the Algorithm, Change the Data", arXiv 2201.13425) trains unmodified TD3 on
reward-free exploration data relabelled with a task's reward; this module is that learner, with
no environment interaction: every update draws a uniform mini-batch of transitions.

One update, for a batch ``(s, a, r, s', d)`` of ``B`` transitions:

- target action ``a' = clip(pi_targ(s') + clip(eps, -c, c), -1, 1)``, ``eps ~ N(0, sigma^2)``;
- target ``y = r + gamma (1 - d) min(Q1_targ(s', a'), Q2_targ(s', a'))``;
- critics: ``sum_j mean (Q_j(s, a) - y)^2``;
- every ``policy_delay`` updates, the actor: ``-mean Q1(s, pi(s))`` (plus, with ``bc_weight``
  > 0, TD3+BC's ``bc_weight * mean (pi(s) - a)^2`` with ``Q`` scaled by ``1 / mean |Q|``),
  then Polyak averaging of every target network with rate ``tau``.

Actions live in ``[-1, 1]`` (``tanh`` output); the policy's action at evaluation is the
deterministic ``pi(s)``.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn


@dataclass(frozen=True)
class TD3Config:
    """Hyper-parameters (TD3's published defaults, smaller networks for a CPU).

    Attributes:
        hidden: hidden layer widths of the actor and of each critic.
        lr: Adam learning rate of actor and critics.
        gamma: discount.
        tau: Polyak rate of the target networks.
        policy_noise: ``sigma`` of the target-policy smoothing noise.
        noise_clip: ``c``, the clip of that noise.
        policy_delay: critic updates per actor update.
        batch_size: transitions per update.
        bc_weight: 0 for plain TD3; > 0 adds TD3+BC's behaviour-cloning term (its ``1 / alpha``).
    """

    hidden: tuple[int, ...] = (256, 256)
    lr: float = 3e-4
    gamma: float = 0.99
    tau: float = 0.005
    policy_noise: float = 0.2
    noise_clip: float = 0.5
    policy_delay: int = 2
    batch_size: int = 256
    bc_weight: float = 0.0


def mlp(inp: int, out: int, hidden: tuple[int, ...]) -> nn.Sequential:
    layers: list[nn.Module] = []
    for h in hidden:
        layers += [nn.Linear(inp, h), nn.ReLU()]
        inp = h
    layers.append(nn.Linear(inp, out))
    return nn.Sequential(*layers)


class TwinCritic(nn.Module):
    """TD3's two critics as one module: each layer's weights stacked ``[2, in, out]``, so both
    critics run in one batched product per layer instead of two small ones.

    Built from two :func:`mlp` critics (their initial weights, so the initialisation and the
    random numbers it draws are those of two separate networks).

    Args:
        critics: two ``Linear``/``ReLU`` stacks of the same shape.
    """

    def __init__(self, critics: list[nn.Sequential]) -> None:
        super().__init__()
        linears = [[m for m in c if isinstance(m, nn.Linear)] for c in critics]
        self.weights = nn.ParameterList(
            nn.Parameter(torch.stack([layer.weight.detach().t() for layer in layers]))
            for layers in zip(*linears)
        )
        self.biases = nn.ParameterList(
            nn.Parameter(torch.stack([layer.bias.detach()[None] for layer in layers]))
            for layers in zip(*linears)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[2, B]`` values of both critics for inputs ``x [B, O + A]``."""
        layers = zip(self.weights, self.biases)
        return _relu_stack(x.expand(2, *x.shape), layers, torch.baddbmm)

    def first(self, x: torch.Tensor) -> torch.Tensor:
        """``[B]`` values of the first critic alone, with its weights held fixed (the actor's
        objective: gradients flow to ``x`` only, none are computed for the critic)."""
        layers = ((w[0].detach(), b[0].detach()) for w, b in zip(self.weights, self.biases))
        return _relu_stack(x, layers, torch.addmm)


def _relu_stack(h: torch.Tensor, layers: Any, product: Any) -> torch.Tensor:
    """``product(bias, h, weight)`` per layer with a ReLU between layers; the last dimension
    (one value) squeezed."""
    layers = list(layers)
    for i, (w, b) in enumerate(layers):
        h = product(b, h, w)
        if i < len(layers) - 1:
            h = torch.relu(h)
    return h.squeeze(-1)


def adam(params: Any, lr: float) -> torch.optim.Adam:
    """Adam with torch's fused kernel where the installed torch has it for these tensors (CPU
    from torch 2.4): one kernel for all parameters instead of a handful of ops per parameter,
    which is most of an update's cost with small networks."""
    params = list(params)
    try:
        return torch.optim.Adam(params, lr=lr, fused=True)
    except (RuntimeError, TypeError):
        return torch.optim.Adam(params, lr=lr, foreach=True)


class OfflineTD3:
    """TD3 trained on fixed transitions (module docstring for the update).

    Args:
        obs_dim: ``O``.
        action_dim: ``A``.
        config: hyper-parameters.
        seed: seeds the initial weights, the mini-batches and the smoothing noise.
    """

    def __init__(
        self, obs_dim: int, action_dim: int, config: TD3Config | None = None, seed: int = 0
    ) -> None:
        self.config = cfg = config or TD3Config()
        torch.manual_seed(seed)
        self.generator = torch.Generator().manual_seed(seed)
        self.actor = nn.Sequential(mlp(obs_dim, action_dim, cfg.hidden), nn.Tanh())
        self.critics = TwinCritic([mlp(obs_dim + action_dim, 1, cfg.hidden) for _ in range(2)])
        self.actor_targ = copy.deepcopy(self.actor).requires_grad_(False)
        self.critics_targ = copy.deepcopy(self.critics).requires_grad_(False)
        self.actor_opt = adam(self.actor.parameters(), cfg.lr)
        self.critic_opt = adam(self.critics.parameters(), cfg.lr)
        self._online: list[torch.Tensor] = [*self.actor.parameters(), *self.critics.parameters()]
        self._targets: list[torch.Tensor] = [
            *self.actor_targ.parameters(),
            *self.critics_targ.parameters(),
        ]
        self.updates = 0

    def q(self, critics: TwinCritic, obs: torch.Tensor, act: torch.Tensor) -> torch.Tensor:
        """``[2, B]`` values of both critics."""
        return critics(torch.cat([obs, act], 1))

    def update(self, batch: dict[str, torch.Tensor]) -> dict[str, float]:
        """One TD3 update on ``observations [B, O], actions [B, A], rewards [B],
        next_observations [B, O], terminals [B]`` (float or bool)."""
        cfg = self.config
        obs, act = batch["observations"], batch["actions"]
        nxt, rew = batch["next_observations"], batch["rewards"]
        not_done = 1.0 - batch["terminals"].float()
        with torch.no_grad():
            noise = torch.randn(act.shape, generator=self.generator) * cfg.policy_noise
            a2 = (self.actor_targ(nxt) + noise.clamp(-cfg.noise_clip, cfg.noise_clip)).clamp(-1, 1)
            target = rew + cfg.gamma * not_done * self.q(self.critics_targ, nxt, a2).min(0).values
        q = self.q(self.critics, obs, act)
        critic_loss = ((q - target) ** 2).mean(1).sum()
        self.critic_opt.zero_grad(set_to_none=True)
        critic_loss.backward()
        self.critic_opt.step()
        stats = {"critic_loss": float(critic_loss.detach()), "q_mean": float(q[0].mean().detach())}
        self.updates += 1
        if self.updates % cfg.policy_delay == 0:
            pi = self.actor(obs)
            q_pi = self.critics.first(torch.cat([obs, pi], 1))
            if cfg.bc_weight > 0:
                lam = 1.0 / q_pi.abs().mean().detach().clamp_min(1e-6)
                actor_loss = -lam * q_pi.mean() + cfg.bc_weight * ((pi - act) ** 2).mean()
            else:
                actor_loss = -q_pi.mean()
            self.actor_opt.zero_grad(set_to_none=True)
            actor_loss.backward()
            self.actor_opt.step()
            with torch.no_grad():
                torch._foreach_lerp_(self._targets, self._online, cfg.tau)
            stats["actor_loss"] = float(actor_loss.detach())
        return stats

    def sample(self, data: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """A uniform mini-batch (with replacement) of ``config.batch_size`` rows of ``data``."""
        n = data["rewards"].shape[0]
        i = torch.randint(n, (self.config.batch_size,), generator=self.generator)
        return {k: v.index_select(0, i) for k, v in data.items()}

    def fit(self, data: dict[str, Any], steps: int) -> dict[str, float]:
        """``steps`` updates on ``data`` (arrays or tensors, keys of :meth:`update`); returns the
        last update's statistics."""
        tensors = {
            k: torch.as_tensor(data[k], dtype=torch.float32)
            for k in ("observations", "actions", "rewards", "next_observations", "terminals")
        }
        stats: dict[str, float] = {}
        for _ in range(int(steps)):
            stats = self.update(self.sample(tensors))
        return stats

    @torch.no_grad()
    def act(self, obs: torch.Tensor) -> torch.Tensor:
        """The deterministic action ``pi(s)``, ``[N, A]`` for ``obs [N, O]``."""
        return self.actor(torch.as_tensor(obs, dtype=torch.float32))
