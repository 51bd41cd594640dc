"""Keeping the replicated population identical on every rank.

Every rank holds the whole population model. Each PPO minibatch's gradients (and its scalar
stats, among them the KL that drives the adaptive learning rate) are averaged over the ranks
before clipping and the optimiser step, so every rank takes the same step; the running
normalisers merge the moments of all ranks' data. The replicas therefore stay bit-identical,
which :func:`replica_difference` checks at every checkpoint.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from myriad.distributed.torchdist.group import RankGroup
from myriad.nn.population import PopulationActorCritic
from myriad.rl.collector import EpisodeSums, EpisodeTracker
from myriad.utils.running_stats import RunningMeanStd


class GradientAverager:
    """``PPO.grad_sync``: average the gradients and the minibatch stats over the ranks.

    One all-reduce per minibatch over a flat buffer of every parameter's gradient followed by
    the stats. Every rank's minibatch holds the same number of rows and its loss is a mean over
    them, so the average is the gradient of the mean loss over the union of the minibatches.

    Args:
        ranks: the process group.
        parameters: the optimiser's parameters, in the same order on every rank.
    """

    def __init__(self, ranks: RankGroup, parameters: Sequence[nn.Parameter]) -> None:
        self.ranks = ranks
        self.parameters = list(parameters)

    @torch.no_grad()
    def __call__(self, stats: dict[str, torch.Tensor]) -> None:
        keys = sorted(stats)
        # A parameter that took no part in this rank's loss has no gradient; it counts as zero.
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.parameters]
        dtype = grads[0].dtype if grads else torch.float32
        flat = torch.cat(
            [g.reshape(-1) for g in grads]
            + [torch.stack([stats[k].detach().to(dtype).reshape(()) for k in keys])]
        )
        self.ranks.all_reduce_(flat).div_(self.ranks.world_size)
        sizes = [g.numel() for g in grads] + [len(keys)]
        *parts, values = flat.split(sizes)
        for p, part in zip(self.parameters, parts):
            if p.grad is None:
                p.grad = part.view_as(p).clone()
            else:
                p.grad.copy_(part.view_as(p))
        for key, value in zip(keys, values):
            stats[key] = value.to(stats[key].dtype)


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
        local = torch.zeros(1 + 2 * self.mean.numel(), dtype=torch.float64, device=x.device)
        local[0] = n
        if n:
            local[1 : 1 + self.mean.numel()] = x.mean(dim=0).reshape(-1)
            local[1 + self.mean.numel() :] = x.var(dim=0, unbiased=False).reshape(-1)
        moments = self.ranks.all_gather_cat(local.unsqueeze(0), dim=0)  # [R, 1 + 2d]
        count = moments[0, 0]
        mean = moments[0, 1 : 1 + self.mean.numel()]
        m2 = moments[0, 1 + self.mean.numel() :] * count
        for row in moments[1:]:
            c = row[0]
            if c == 0:
                continue
            total = count + c
            delta = row[1 : 1 + self.mean.numel()] - mean
            mean = mean + delta * (c / total)
            m2 = m2 + row[1 + self.mean.numel() :] * c + delta.square() * (count * c / total)
            count = total
        if count == 0:
            return
        batch_mean = mean.reshape(self.mean.shape).to(self.mean.device)
        batch_var = (m2 / count).reshape(self.mean.shape).to(self.mean.device)
        count = count.to(self.count.device)
        # The fold of RunningMeanStd.update, with the merged batch.
        delta = batch_mean - self.mean
        total = self.count + count
        new_mean = self.mean + delta * (count / total)
        new_m2 = (
            self.var * self.count
            + batch_var * count
            + delta.square() * (self.count * count / total)
        )
        self.mean.copy_(new_mean)
        self.var.copy_(new_m2 / total)
        self.count.copy_(total)


def share_normalizers(model: PopulationActorCritic, ranks: RankGroup) -> None:
    """Replace the model's observation and value normalisers by :class:`RankMeanStd` ones."""
    for name in ("obs_norm", "value_norm"):
        norm = getattr(model, name)
        if norm is not None:
            setattr(model, name, RankMeanStd(norm, ranks))


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
