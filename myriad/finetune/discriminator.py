"""CPO's adversarial diversity reward: a classifier q(i | s, a) over members (algorithms.md §7).

Each rollout is labelled with the member that acted in every env (the env-to-member mapping of
the storage, whatever it is), each follower's reward gets ``c_adv * log q(i|s,a)`` (it pays for
being mistaken for another member), and the classifier is then trained on that rollout by cross
entropy.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from myriad.finetune.losses import discriminator_bonus
from myriad.nn.population import ACTIVATIONS
from myriad.rl.row_share import RowShare
from myriad.rl.storage import RolloutStorage
from myriad.utils.settings import Check, at_least, check_fields, one_of, positive, setting


def rollout_labels(storage: RolloutStorage) -> torch.Tensor:
    """The member that acted at every step, ``[T * E]`` long, time-major like ``storage.flat``.

    Row ``t * E + e`` is labelled ``storage.member[e]``.
    """
    return storage.member.unsqueeze(0).expand(storage.num_steps, -1).reshape(-1)


@dataclass
class DiscriminatorConfig:
    """Settings of the member classifier.

    Attributes:
        hidden: hidden layer sizes.
        activation: one of :data:`myriad.nn.population.ACTIVATIONS`.
        lr: Adam learning rate.
        epochs: passes over each rollout.
        minibatches: minibatches per pass.
        log_q_floor: ``log q`` is floored here before it becomes a reward.
    """

    hidden: Sequence[int] = setting((64, 64), help="hidden layer sizes")
    activation: str = setting("elu", help="hidden activation", check=one_of(*ACTIVATIONS))
    lr: float = setting(1e-3, help="Adam learning rate", check=positive())
    epochs: int = setting(1, help="passes over each rollout", check=at_least(1))
    minibatches: int = setting(4, help="minibatches per pass", check=at_least(1))
    log_q_floor: float = setting(
        -10.0,
        help="log q is floored here before it becomes a reward",
        check=Check(lambda v: v < 0, "< 0"),
    )

    def __post_init__(self) -> None:
        self.hidden = tuple(int(h) for h in self.hidden)
        check_fields(self)


class Discriminator(nn.Module):
    """An MLP ``(obs, action) -> logits [N, M]`` over the M members.

    Args:
        obs_dim, action_dim: O and A.
        num_members: M.
        hidden: hidden layer sizes.
        activation: hidden activation.
    """

    def __init__(
        self,
        obs_dim: int,
        action_dim: int,
        num_members: int,
        hidden: Sequence[int] = (64, 64),
        activation: str = "elu",
    ) -> None:
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(
                f"unknown activation {activation!r}; choose one of {list(ACTIVATIONS)}"
            )
        sizes = [obs_dim + action_dim, *hidden]
        layers: list[nn.Module] = []
        for a, b in itertools.pairwise(sizes):
            layers += [nn.Linear(a, b), ACTIVATIONS[activation]()]
        layers.append(nn.Linear(sizes[-1], num_members))
        self.net = nn.Sequential(*layers)
        self.num_members = num_members

    def forward(self, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """Logits ``[N, M]`` of ``obs [N, O]`` (already normalised) and ``actions [N, A]``."""
        return self.net(torch.cat([obs, actions], dim=-1))


class AdversarialReward:
    """Scores a rollout with the discriminator, then trains the discriminator on it.

    Args:
        obs_dim, action_dim: O and A.
        num_members: M.
        coef: c_adv.
        config: the classifier's settings.
        normalize_obs: maps raw observations to the classifier's input (the policy's
            observation normaliser, so both see the same scale).
        generator: minibatch shuffling.
        leader: the member whose steps get no bonus.
        device: where the classifier lives.
    """

    def __init__(
        self,
        obs_dim: int,
        action_dim: int,
        num_members: int,
        coef: float,
        config: DiscriminatorConfig | None = None,
        normalize_obs: Callable[[torch.Tensor], torch.Tensor] | None = None,
        generator: torch.Generator | None = None,
        leader: int = 0,
        device: torch.device | str = "cpu",
    ) -> None:
        self.config = config or DiscriminatorConfig()
        self.coef = float(coef)
        self.leader = leader
        self.num_members = num_members
        self.normalize_obs = normalize_obs
        self.generator = generator
        self.net = Discriminator(
            obs_dim, action_dim, num_members, self.config.hidden, self.config.activation
        ).to(device)
        self.optimizer = torch.optim.Adam(self.net.parameters(), lr=self.config.lr)
        #: This process's share when processes holding the same rollout split the work
        #: (torchrun ranks): it scores its own envs' steps (the bonuses are gathered) and fits
        #: on its share of every minibatch with the gradients averaged over the processes.
        self.share: RowShare | None = None

    def _inputs(self, storage: RolloutStorage) -> tuple[torch.Tensor, torch.Tensor]:
        obs = storage.flat("obs")
        if self.normalize_obs is not None:
            obs = self.normalize_obs(obs)
        return obs.detach(), storage.flat("actions").detach()

    @torch.no_grad()
    def score(
        self, obs: torch.Tensor, actions: torch.Tensor, labels: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(log q(label | s, a) [N], accuracy)`` under the current classifier."""
        logits = self.net(obs, actions)
        log_q = torch.log_softmax(logits, dim=-1).gather(1, labels.unsqueeze(1)).squeeze(1)
        accuracy = (logits.argmax(dim=-1) == labels).float().mean()
        return log_q, accuracy

    def fit(self, obs: torch.Tensor, actions: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Cross-entropy training for the configured epochs and minibatches; mean loss."""
        cfg = self.config
        n = obs.shape[0]
        total = torch.zeros((), device=obs.device)
        steps = 0
        share = self.share
        for _ in range(cfg.epochs):
            perm = torch.randperm(n, generator=self.generator, device=obs.device)
            for idx in perm.tensor_split(cfg.minibatches):
                if share is not None:
                    idx = share.rows(idx, 1, blocked=False)
                loss = nn.functional.cross_entropy(self.net(obs[idx], actions[idx]), labels[idx])
                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()
                if share is not None:
                    grads = [p.grad for p in self.net.parameters() if p.grad is not None]
                    loss = loss.detach().clone()
                    share.average_([*grads, loss.view(1)])
                self.optimizer.step()
                total = total + loss.detach()
                steps += 1
        return total / max(steps, 1)

    def __call__(self, storage: RolloutStorage) -> tuple[torch.Tensor, dict[str, float]]:
        """The followers' reward bonus ``[T, E]`` for this rollout, and the classifier's stats.

        The rollout is scored before the classifier trains on it, so ``disc_accuracy`` is the
        accuracy on data it has not fitted yet.
        """
        obs, actions = self._inputs(storage)
        labels = rollout_labels(storage)
        t, e = storage.num_steps, storage.num_envs
        block = None if self.share is None else self.share.block(e)
        if block is None:
            log_q, accuracy = self.score(obs, actions, labels)
            bonus = discriminator_bonus(
                log_q, labels, self.coef, self.leader, self.config.log_q_floor
            ).view(t, e)
        else:
            assert self.share is not None
            own_obs, own_actions = (
                x.view(t, e, -1)[:, block].reshape(-1, x.shape[-1]) for x in (obs, actions)
            )
            own_labels = labels.view(t, e)[:, block].reshape(-1)
            log_q, accuracy = self.score(own_obs, own_actions, own_labels)
            bonus = discriminator_bonus(
                log_q, own_labels, self.coef, self.leader, self.config.log_q_floor
            )
            bonus = self.share.all_gather(bonus.view(t, -1), 1)
            accuracy = accuracy.reshape(1).clone()
            self.share.average_([accuracy])
            accuracy = accuracy[0]
        loss = self.fit(obs, actions, labels)
        stats = torch.stack([accuracy, loss, bonus.mean()]).tolist()
        return bonus, dict(zip(("disc_accuracy", "disc_loss", "adversarial_bonus"), stats))

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {
            "net": self.net.state_dict(),
            "optimizer": self.optimizer.state_dict(),
        }
        if self.generator is not None:
            state["generator"] = self.generator.get_state()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.net.load_state_dict(state["net"])
        self.optimizer.load_state_dict(state["optimizer"])
        if self.generator is not None and "generator" in state:
            self.generator.set_state(state["generator"])
