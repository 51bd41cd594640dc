"""Diversity diagnostics of a leader and its followers, measured on the latest rollout.

- ``KL(pi_f || pi_L)`` of every follower f, on the leader's states and on f's own states;
- the pairwise KL matrix ``[M, M]`` of all members on the pooled states;
- each member's log std (state-independent), averaged over the action dimensions.

All KLs are exact (diagonal Gaussians) and averaged over a fixed, evenly strided sample of
``states_per_member`` states of each member's rollout, so the measurement draws no random
numbers and costs one batched actor pass over ``M * states_per_member`` states.
"""

from __future__ import annotations

import torch

from myriad.nn.distributions import gaussian_kl, pairwise_gaussian_kl
from myriad.nn.population import PopulationActorCritic
from myriad.rl.storage import RolloutStorage, member_major_index


def sample_index(
    member: torch.Tensor, num_members: int, num_steps: int, per_member: int
) -> torch.Tensor:
    """``[M, n]`` time-major flat rollout indices ``t * E + e``: an evenly strided sample of
    ``n = min(per_member, T * E_i)`` rows of each member (needs equal env counts per member)."""
    rows = member_major_index(member, num_members, num_steps)  # [M, T * E / M]
    total = rows.shape[1]
    pick = torch.linspace(0, total - 1, min(per_member, total), device=member.device)
    return rows[:, pick.round().long()]


class Diagnostics:
    """Computes the KL diagnostics after each update.

    Args:
        member: ``[E]`` the env-to-member mapping of the rollouts.
        num_members: M.
        num_steps: T of the rollouts.
        states_per_member: states sampled per member.
        per_member: log each follower's KLs (not only their mean).
    """

    def __init__(
        self,
        member: torch.Tensor,
        num_members: int,
        num_steps: int,
        states_per_member: int = 256,
        per_member: bool = True,
    ) -> None:
        self.num_members = num_members
        self.per_member = per_member
        self.index = sample_index(member, num_members, num_steps, states_per_member)
        self.last_matrix: torch.Tensor | None = None

    @torch.no_grad()
    def __call__(
        self, model: PopulationActorCritic, storage: RolloutStorage, leader: int
    ) -> dict[str, float]:
        """The diagnostics' scalars; the pairwise matrix is kept in :attr:`last_matrix`."""
        m = self.num_members
        log_std = model.member_log_std()  # [M, A]
        # How wide each member's policy is: a population whose policies widen while they
        # learn explores differently from one whose policies narrow.
        spread = log_std.mean(dim=1).cpu()  # [M]
        out = {"policy/log_std_mean": float(spread.mean())}
        if m < 2:
            return out
        if self.per_member:
            out.update({f"policy/log_std/member_{i}": float(spread[i]) for i in range(m)})
        n = self.index.shape[1]
        obs = storage.flat("obs").index_select(0, self.index.reshape(-1))  # [M * n, O]
        means = model.member_action_means(obs)  # [M members, M * n states, A]
        blocks = means.view(m, m, n, -1)  # [member, whose states, n, A]
        lead_mean, lead_std = blocks[leader], log_std[leader]  # leader on every block
        # KL(pi_f || pi_L) on the leader's states: every member's means on block `leader`.
        on_leader = gaussian_kl(
            blocks[:, leader], log_std[:, None], lead_mean[leader][None], lead_std
        ).mean(dim=1)
        # ... and on each follower's own states: block f of member f against the leader there.
        own = blocks[torch.arange(m), torch.arange(m)]  # [M, n, A]
        on_own = gaussian_kl(own, log_std[:, None], lead_mean, lead_std).mean(dim=1)
        matrix = pairwise_gaussian_kl(means, log_std.unsqueeze(1))
        self.last_matrix = matrix.cpu()

        followers = [i for i in range(m) if i != leader]
        values = torch.stack([on_leader, on_own]).cpu()
        off = matrix[~torch.eye(m, dtype=torch.bool, device=matrix.device)].cpu()
        out |= {
            "kl_to_leader/on_leader_states_mean": float(values[0, followers].mean()),
            "kl_to_leader/on_own_states_mean": float(values[1, followers].mean()),
            "diversity/pairwise_kl_mean": float(off.mean()),
            "diversity/pairwise_kl_min": float(off.min()),
            "diversity/pairwise_kl_max": float(off.max()),
        }
        if self.per_member:
            for i in followers:
                out[f"kl_to_leader/on_leader_states/member_{i}"] = float(values[0, i])
                out[f"kl_to_leader/on_own_states/member_{i}"] = float(values[1, i])
        return out
