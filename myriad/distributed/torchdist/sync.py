"""Keeping the replicated population identical on every rank.

Every rank holds the whole population model. Each PPO minibatch's gradients (and its scalar
stats, among them the KL that drives the adaptive learning rate) are averaged over the ranks
before clipping and the optimiser step, so every rank takes the same step; the running
normalisers merge the moments of all ranks' data. The replicas therefore stay bit-identical,
which :func:`replica_difference` checks at every checkpoint.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn

from myriad.distributed.torchdist.group import RankGroup
from myriad.nn.population import PopulationActorCritic
from myriad.rl.collector import EpisodeSums, EpisodeTracker
from myriad.utils.running_stats import GroupMeanStd, RunningMeanStd, merge_moments


class GradientAverager:
    """``PPO.grad_sync``: average the gradients and the minibatch stats over the ranks.

    One sum over the ranks per minibatch (:meth:`RankGroup.start_all_reduce_`) of a flat buffer
    of every parameter's gradient, a flag per parameter that says whether it has one, and the
    stats. Every rank's minibatch holds the same number of rows and its loss is a mean over
    them, so the average is the gradient of the mean loss over the union of the minibatches.
    A parameter without a gradient on every rank keeps none, as in one process (the optimiser
    then leaves it, and its state, alone: the actors during a critic-only warm-up). A call
    starts the sum and returns the call that completes the average (``PPO`` takes the next
    minibatch's rows in between, while the other rank catches up).

    Args:
        ranks: the process group.
        parameters: the optimiser's parameters, in the same order on every rank.
    """

    def __init__(self, ranks: RankGroup, parameters: Sequence[nn.Parameter]) -> None:
        self.ranks = ranks
        self.parameters = list(parameters)

    @torch.no_grad()
    def __call__(self, stats: dict[str, torch.Tensor]) -> Callable[[], None]:
        keys = sorted(stats)
        # A parameter that took no part in this rank's loss has no gradient; it counts as zero.
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.parameters]
        dtype = grads[0].dtype if grads else torch.float32
        present = [float(p.grad is not None) for p in self.parameters]
        flat = torch.cat(
            [g.reshape(-1) for g in grads]
            + [torch.tensor(present, dtype=dtype, device=grads[0].device if grads else None)]
            + [torch.stack([stats[k].detach().to(dtype).reshape(()) for k in keys])]
        )
        summed = self.ranks.start_all_reduce_(flat)

        @torch.no_grad()
        def finish() -> None:
            summed().div_(self.ranks.world_size)
            sizes = [g.numel() for g in grads] + [len(grads), len(keys)]
            *parts, anywhere, values = flat.split(sizes)
            # Read from the device only when some gradient is missing here (critic-only steps).
            found = [True] * len(grads) if all(present) else (anywhere > 0).tolist()
            for p, part, has in zip(self.parameters, parts, found):
                if not has:
                    p.grad = None
                elif p.grad is None:
                    p.grad = part.view_as(p).clone()
                else:
                    p.grad.copy_(part.view_as(p))
            for key, value in zip(keys, values):
                stats[key] = value.to(stats[key].dtype)

        return finish


def merge_rank_moments(
    ranks: RankGroup, count: torch.Tensor, mean: torch.Tensor, var: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Every rank's batch moments (``count``, ``mean``, ``var``: one shape on all ranks) merged
    in rank order (Chan et al.): the moments of the concatenated batch, on every rank."""
    local = torch.stack([count.expand_as(mean), mean, var]).to(torch.float64)
    moments = ranks.all_gather_cat(local.unsqueeze(0), dim=0)  # [R, 3, ...]
    merged = (moments[0, 0], moments[0, 1], moments[0, 2])
    for row in moments[1:]:
        merged = merge_moments(*merged, row[0], row[1], row[2])
    return merged


class RankMeanStd(RunningMeanStd):
    """A :class:`RunningMeanStd` whose ``update`` folds in the batches of all ranks at once.

    Each rank's batch moments (count, mean, variance) are gathered and merged in rank order
    (Chan et al.), then folded into the running statistics as one batch: the result equals the
    single-process update on the concatenated batch up to float64 rounding, on every rank. Its
    ``state_dict`` is that of a plain :class:`RunningMeanStd`.
    """

    def __init__(self, source: RunningMeanStd, ranks: RankGroup) -> None:
        super().__init__(tuple(source.mean.shape), clip=source.clip)
        self.load_state_dict(source.state_dict())
        self.to(source.mean.device)
        self.ranks = ranks

    @torch.no_grad()
    def update(self, x: torch.Tensor) -> None:
        x = x.detach().reshape(-1, *self.mean.shape).to(torch.float64)
        n = x.shape[0]
        zeros = torch.zeros_like(self.mean, device=x.device)
        count = torch.full_like(zeros, float(n))
        mean = x.mean(dim=0) if n else zeros
        var = x.var(dim=0, unbiased=False) if n else zeros
        count, mean, var = merge_rank_moments(self.ranks, count, mean, var)
        rows = count.reshape(-1)[0]  # every feature counts the same rows
        if rows == 0:
            return
        total, new_mean, new_var = merge_moments(
            self.count,
            self.mean,
            self.var,
            rows.to(self.count),
            mean.to(self.mean),
            var.to(self.mean),
        )
        self.mean.copy_(new_mean)
        self.var.copy_(new_var)
        self.count.copy_(total)


class RankGroupMeanStd(GroupMeanStd):
    """A :class:`GroupMeanStd` whose ``update`` folds in the rows of all ranks at once (each
    group's moments merged over ranks in rank order, as :class:`RankMeanStd`). Its
    ``state_dict`` is that of a plain :class:`GroupMeanStd`."""

    def __init__(self, source: GroupMeanStd, ranks: RankGroup) -> None:
        super().__init__(source.groups)
        self.load_state_dict(source.state_dict())
        self.to(source.mean.device)
        self.ranks = ranks

    @torch.no_grad()
    def fold(self, count: torch.Tensor, mean: torch.Tensor, var: torch.Tensor) -> None:
        super().fold(*merge_rank_moments(self.ranks, count, mean, var))


def share_normalizers(model: PopulationActorCritic, ranks: RankGroup) -> None:
    """Replace the model's observation and value normalisers by ones that merge all ranks'
    batches (:class:`RankMeanStd`, :class:`RankGroupMeanStd`)."""
    if model.obs_norm is not None:
        model.obs_norm = RankMeanStd(model.obs_norm, ranks)
    if model.value_norm is not None:
        model.value_norm = RankGroupMeanStd(model.value_norm, ranks)


class SummedEpisodeTracker(EpisodeTracker):
    """An :class:`EpisodeTracker` whose reads cover the episodes of all ranks (the sums are
    all-reduced first, so every rank reports the population's means)."""

    def __init__(self, source: EpisodeTracker, ranks: RankGroup) -> None:
        super().__init__(source.num_members, source.sums.device, source.per_member)
        self.sums.copy_(source.sums)
        self.has_success = source.has_success
        self.ranks = ranks

    def read(self, reset: bool = True) -> EpisodeSums:
        total = self.ranks.all_reduce_(self.sums.clone())  # this rank's sums stay its own
        if reset:
            self.sums.zero_()
        return EpisodeSums(*total.cpu().numpy())


@torch.no_grad()
def broadcast_module_(module: nn.Module, ranks: RankGroup) -> None:
    """Overwrite every parameter and buffer of ``module`` with rank 0's."""
    for tensor in [*module.parameters(), *module.buffers()]:
        ranks.broadcast_(tensor.data)


@torch.no_grad()
def replica_difference(module: nn.Module, ranks: RankGroup) -> float:
    """Largest ``|x - x_rank0|`` over every parameter and buffer entry of ``module`` and every
    rank: 0.0 when the replicas are identical."""
    tensors = [
        t.detach().reshape(-1).to(torch.float64) for t in (*module.parameters(), *module.buffers())
    ]
    mine = torch.cat(tensors)
    reference = ranks.broadcast_(mine.clone())
    worst = (mine - reference).abs().max().reshape(1)
    return float(ranks.all_reduce_(worst, op="max"))
