"""The population actor-critic: M Gaussian policies and M critics in one module.

Shapes: ``N`` rows (observations), ``O`` observation dimension, ``A`` action dimension, ``M``
members. Every public method takes ``obs [N, O]`` and a ``member`` argument saying which member
acts on each row, in one of three forms:

- ``member: Tensor [N]`` (long), any assignment: the general path. For the ``independent``
  parameterisation it groups rows by member into a padded ``[M, n_max, O]`` batch, which costs one
  device-to-host sync for ``n_max``; the other parameterisations need no sync.
- ``member: Tensor [N]`` with ``blocked=True``: the caller guarantees the member-major layout with
  equal counts, ``member == arange(M).repeat_interleave(N // M)`` (how environments and PPO
  minibatches are laid out). The batch is reshaped to ``[M, N // M, O]``; no gather, no sync. The
  member tensor is not inspected (that would need a sync); :func:`is_blocked` checks a layout.
- ``member: Tensor [N]`` with ``blocked=slice(a, b)``: the same over members ``a..b-1`` only,
  ``member == arange(a, b).repeat_interleave(N // (b - a))``: the envs of a rank that owns some
  of the members (:func:`member_blocks` finds the layout).
- ``member: int``: every row uses that member (for example the leader evaluated on follower data).

Parameterisations (``PopulationConfig.parameterization``):

- ``"shared_trunk"``: one MLP trunk shared by all members, one linear output head per member.
- ``"embedding"``: one MLP shared by all members whose input is the observation concatenated with a
  learned per-member embedding (as in SAPG and CPO).
- ``"independent"``: M separate MLPs, evaluated together with batched weights ``[M, in, out]``.

The actor and the critic are separate networks of the same parameterisation: they share no
parameters. The policy of member i is a diagonal Gaussian with a state-independent log standard
deviation ``log_std[i] [A]``.
"""

from __future__ import annotations

import abc
import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields, replace
from typing import Any, NamedTuple, cast

import torch
from torch import nn

from myriad.nn.activations import ELU
from myriad.nn.distributions import (
    gaussian_entropy,
    gaussian_log_prob,
    gaussian_sample,
    pairwise_gaussian_kl,
)
from myriad.nn.linear import Linear, batched_linear, linear
from myriad.nn.mlp import MLP
from myriad.utils.config import ConfigError
from myriad.utils.running_stats import GroupMeanStd, RunningMeanStd
from myriad.utils.settings import at_least, field_names, from_config, one_of, positive, setting
from myriad.utils.tensors import member_rows

PARAMETERIZATIONS = ("shared_trunk", "embedding", "independent")
#: Scopes of the return statistics of value normalisation (``PopulationConfig.value_stats``).
VALUE_STATS = ("member", "shared")
#: Config fields that may differ between two populations whose members are loaded into each
#: other (besides ``size``): the value statistics are mapped, not copied.
LOADABLE_DIFFERENCES = ("size", "value_stats")

ACTIVATIONS: dict[str, type[nn.Module]] = {
    "elu": ELU,  # nn.ELU through exp on the CPU (myriad.nn.activations)
    "relu": nn.ReLU,
    "tanh": nn.Tanh,
    "silu": nn.SiLU,
    "gelu": nn.GELU,
    "leaky_relu": nn.LeakyReLU,
}

HIDDEN_GAIN = math.sqrt(2.0)
ACTOR_OUTPUT_GAIN = 0.01
CRITIC_OUTPUT_GAIN = 1.0

Member = torch.Tensor | int
#: The layout of the rows of a ``member`` tensor: ``False`` (any), ``True`` (member-major with
#: equal counts over all M members) or ``slice(a, b)`` (the same over members ``a..b-1``).
Blocked = bool | slice


def check_population(
    num_envs: int,
    size: int,
    num_steps: int | None = None,
    k: int | None = None,
    minibatches: int | None = None,
) -> None:
    """Check the population layout of a run before anything is built: ``num_envs`` envs form
    ``size`` contiguous equal member blocks and, with ``num_steps``, every member collects more
    than ``k`` states per rollout (its k-th neighbour exists) and at least one row for each of
    the update's ``minibatches``.

    Raises:
        ConfigError: the first rule broken, with the values that would work.
    """
    if size < 1:
        raise ConfigError(f"population.size must be >= 1, got {size}")
    if size > num_envs:
        raise ConfigError(
            f"population.size={size} is larger than num_envs={num_envs}: every member needs at "
            f"least one env; raise num_envs or lower population.size"
        )
    if num_envs % size:
        lower = num_envs - num_envs % size
        raise ConfigError(
            f"num_envs={num_envs} does not split into population.size={size} equal blocks; use "
            f"num_envs={lower} or {lower + size}, or a population.size that divides {num_envs}"
        )
    if num_steps is None:
        return
    per_member = num_envs // size * num_steps
    if minibatches is not None and minibatches > per_member:
        raise ConfigError(
            f"ppo.minibatches={minibatches} needs at least as many rows per member, but each "
            f"member collects {per_member} per rollout (num_envs / population.size * "
            f"num_steps); lower ppo.minibatches or raise num_envs / num_steps"
        )
    if k is not None and k >= per_member:
        raise ConfigError(
            f"objective.k={k} needs more than k states per member, but each member collects "
            f"{per_member} per rollout (num_envs / population.size * num_steps); lower "
            f"objective.k or raise num_envs / num_steps"
        )


def block_members(
    num_envs: int, num_members: int, device: torch.device | str = "cpu"
) -> torch.Tensor:
    """The member of each env when E envs form M contiguous equal blocks, ``[E]`` long.

    ``member[e] = e // (E // M)``.

    Raises:
        ConfigError: ``num_envs`` is not a positive multiple of ``num_members`` (see
            :func:`check_population`).
    """
    check_population(num_envs, num_members)
    return torch.arange(num_members, device=device).repeat_interleave(num_envs // num_members)


def is_blocked(member: torch.Tensor, num_members: int) -> bool:
    """Whether ``member [N]`` is member-major with equal counts (syncs with the device)."""
    return member_blocks(member, num_members) is True


def member_blocks(member: torch.Tensor, num_members: int) -> Blocked:
    """The ``blocked`` argument that fits ``member [N]``: ``True`` for the member-major layout
    of all ``num_members`` members, ``slice(a, b)`` for that of members ``a..b-1`` alone (a
    rank's share of the envs), ``False`` otherwise (syncs with the device a few times)."""
    n = member.shape[0]
    if n == 0:
        return False
    low, high = int(member.min()), int(member.max()) + 1
    count = high - low
    if low < 0 or high > num_members or n % count:
        return False
    expected = torch.arange(low, high, device=member.device).repeat_interleave(n // count)
    if not torch.equal(member.long(), expected):
        return False
    return True if count == num_members else slice(low, high)


def _orthogonal_(weight: torch.Tensor, gain: float) -> None:
    """Orthogonal init of a weight stored as ``[in, out]`` (the transpose of ``nn.Linear``)."""
    tmp = torch.empty(weight.shape[1], weight.shape[0], dtype=weight.dtype)
    nn.init.orthogonal_(tmp, gain=gain)
    with torch.no_grad():
        weight.copy_(tmp.t())


class PopulationLinear(nn.Module):
    """M linear maps applied in one batched matmul; weights ``[M, in, out]``, biases ``[M, out]``.

    Args:
        num_members: M.
        in_features, out_features: sizes of one member's map.
        gain: orthogonal-init gain, applied to each member's matrix separately.
    """

    def __init__(self, num_members: int, in_features: int, out_features: int, gain: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_members, in_features, out_features))
        self.bias = nn.Parameter(torch.zeros(num_members, out_features))
        for m in range(num_members):  # init only; the forward passes are batched
            _orthogonal_(self.weight.data[m], gain)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Member-major batch ``[M, n, in] -> [M, n, out]``: member m's map on ``x[m]``."""
        return batched_linear(x, self.weight, self.bias)

    def forward_all(self, x: torch.Tensor) -> torch.Tensor:
        """Every member on the same rows, ``[N, in] -> [M, N, out]``."""
        return torch.matmul(x.unsqueeze(0), self.weight) + self.bias.unsqueeze(1)

    def forward_member(self, x: torch.Tensor, m: int) -> torch.Tensor:
        """Member ``m`` on every row, ``[N, in] -> [N, out]``."""
        return linear(x, self.weight[m], self.bias[m])

    def extra_repr(self) -> str:
        m, i, o = self.weight.shape
        return f"members={m}, in_features={i}, out_features={o}"


def _linear(in_features: int, out_features: int, gain: float) -> nn.Linear:
    layer = Linear(in_features, out_features)
    nn.init.orthogonal_(layer.weight, gain=gain)
    nn.init.zeros_(layer.bias)
    return layer


def _mlp(sizes: Sequence[int], activation: str, out_gain: float | None) -> MLP:
    """``Linear -> act`` for each consecutive pair; the last layer has no activation when
    ``out_gain`` is given (it is then initialised with that gain)."""
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(itertools.pairwise(sizes)):
        last = i == len(sizes) - 2
        if last and out_gain is not None:
            layers.append(_linear(a, b, out_gain))
        else:
            layers += [_linear(a, b, HIDDEN_GAIN), ACTIVATIONS[activation]()]
    return MLP(*layers)


def _group_rows(member: torch.Tensor, num_members: int) -> tuple[torch.Tensor, int]:
    """Position of each row within its member's group, ``[N]``, and the largest group size.

    Rows keep their relative order inside a group. Reading the largest size is one host sync.
    """
    n = member.shape[0]
    counts = torch.bincount(member, minlength=num_members)
    order = torch.argsort(member, stable=True)
    starts = torch.cumsum(counts, 0) - counts
    pos_sorted = torch.arange(n, device=member.device) - starts[member[order]]
    pos = torch.empty_like(pos_sorted)
    pos[order] = pos_sorted
    width = int(counts.max()) if n else 0
    return pos, width


class PopulationNet(nn.Module, abc.ABC):
    """A population of M functions ``R^in -> R^out`` evaluated together.

    Subclasses implement the four evaluation modes; :meth:`member_parameters` lists the
    parameters whose leading dimension is the member (the rest are shared by all members). They
    are built from ``sizes = [in, *hidden, out]``, the widths of their layers.
    """

    def __init__(self, num_members: int, out_features: int) -> None:
        super().__init__()
        self.num_members = num_members
        self.out_features = out_features

    @abc.abstractmethod
    def blocked(self, x: torch.Tensor, members: slice | None = None) -> torch.Tensor:
        """Member-major rows with equal counts, ``[M * n, in] -> [M * n, out]``; with
        ``members=slice(a, b)``, rows of members ``a..b-1`` only, ``[(b - a) * n, in]``."""

    @abc.abstractmethod
    def rows(self, x: torch.Tensor, member: torch.Tensor) -> torch.Tensor:
        """Arbitrary assignment ``member [N]``, ``[N, in] -> [N, out]``."""

    @abc.abstractmethod
    def single(self, x: torch.Tensor, m: int) -> torch.Tensor:
        """Member ``m`` on every row, ``[N, in] -> [N, out]``."""

    @abc.abstractmethod
    def all_members(self, x: torch.Tensor) -> torch.Tensor:
        """Every member on the same rows, ``[N, in] -> [M, N, out]``."""

    @abc.abstractmethod
    def member_parameters(self) -> list[nn.Parameter]:
        """Parameters with a leading member dimension ``[M, ...]``."""


class SharedTrunkNet(PopulationNet):
    """Shared MLP trunk, then one linear head per member."""

    def __init__(
        self, num_members: int, sizes: Sequence[int], activation: str, out_gain: float
    ) -> None:
        super().__init__(num_members, sizes[-1])
        self.trunk = _mlp(sizes[:-1], activation, out_gain=None)
        self.head = PopulationLinear(num_members, sizes[-2], sizes[-1], out_gain)

    def blocked(self, x: torch.Tensor, members: slice | None = None) -> torch.Tensor:
        if members is None:
            return self.trunk.forward_member_heads(x, self.head.weight, self.head.bias)
        return self.trunk.forward_member_heads(
            x, self.head.weight[members], self.head.bias[members]
        )

    def rows(self, x: torch.Tensor, member: torch.Tensor) -> torch.Tensor:
        # Heads are small, so computing all of them and gathering is cheaper than grouping rows
        # (which needs a host sync) for any realistic M.
        y = self.head.forward_all(self.trunk(x))
        return y[member, torch.arange(x.shape[0], device=x.device)]

    def single(self, x: torch.Tensor, m: int) -> torch.Tensor:
        return self.head.forward_member(self.trunk(x), m)

    def all_members(self, x: torch.Tensor) -> torch.Tensor:
        return self.head.forward_all(self.trunk(x))

    def member_parameters(self) -> list[nn.Parameter]:
        return [self.head.weight, self.head.bias]


class EmbeddingNet(PopulationNet):
    """One MLP for all members, conditioned on a learned member embedding ``[M, D]``."""

    def __init__(
        self,
        num_members: int,
        sizes: Sequence[int],
        activation: str,
        out_gain: float,
        embedding_dim: int,
    ) -> None:
        super().__init__(num_members, sizes[-1])
        self.embedding = nn.Parameter(torch.randn(num_members, embedding_dim))
        self.net = _mlp([sizes[0] + embedding_dim, *sizes[1:]], activation, out_gain)

    def _run(self, x: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:
        return self.net(torch.cat([x, emb], dim=-1))

    def blocked(self, x: torch.Tensor, members: slice | None = None) -> torch.Tensor:
        embedding = self.embedding if members is None else self.embedding[members]
        n = x.shape[0] // embedding.shape[0]
        emb = embedding.unsqueeze(1).expand(-1, n, -1).reshape(x.shape[0], -1)
        return self._run(x, emb)

    def rows(self, x: torch.Tensor, member: torch.Tensor) -> torch.Tensor:
        return self._run(x, self.embedding[member])

    def single(self, x: torch.Tensor, m: int) -> torch.Tensor:
        return self._run(x, self.embedding[m].expand(x.shape[0], -1))

    def all_members(self, x: torch.Tensor) -> torch.Tensor:
        m, n = self.num_members, x.shape[0]
        xs = x.unsqueeze(0).expand(m, n, -1)
        emb = self.embedding.unsqueeze(1).expand(m, n, -1)
        return self._run(xs, emb)

    def member_parameters(self) -> list[nn.Parameter]:
        return [self.embedding]


class IndependentNet(PopulationNet):
    """M independent MLPs with batched weights ``[M, in, out]`` per layer."""

    def __init__(
        self, num_members: int, sizes: Sequence[int], activation: str, out_gain: float
    ) -> None:
        super().__init__(num_members, sizes[-1])
        self.layers = nn.ModuleList(
            PopulationLinear(num_members, a, b, out_gain if i == len(sizes) - 2 else HIDDEN_GAIN)
            for i, (a, b) in enumerate(itertools.pairwise(sizes))
        )
        self.act = ACTIVATIONS[activation]()

    def _stack(self, h: torch.Tensor, start: int = 0, members: slice | None = None) -> torch.Tensor:
        """Layers ``start..`` on a member-major ``[M, n, in]`` batch (``[b - a, n, in]`` of
        members ``a..b-1`` with ``members=slice(a, b)``)."""
        for i, layer in enumerate(self._linears()[start:], start):
            if i > 0:
                h = self.act(h)
            if members is None:
                h = layer(h)
            else:
                h = batched_linear(h, layer.weight[members], layer.bias[members])
        return h

    def blocked(self, x: torch.Tensor, members: slice | None = None) -> torch.Tensor:
        count = self.num_members if members is None else members.stop - members.start
        y = self._stack(x.view(count, -1, x.shape[-1]), members=members)
        return y.reshape(-1, self.out_features)

    def rows(self, x: torch.Tensor, member: torch.Tensor) -> torch.Tensor:
        pos, width = _group_rows(member, self.num_members)
        padded = x.new_zeros(self.num_members, width, x.shape[-1])
        padded[member, pos] = x
        return self._stack(padded)[member, pos]

    def _linears(self) -> list[PopulationLinear]:
        # nn.ModuleList types its items as plain modules; __init__ fills it with these.
        return cast("list[PopulationLinear]", list(self.layers))

    def single(self, x: torch.Tensor, m: int) -> torch.Tensor:
        h = x
        for i, layer in enumerate(self._linears()):
            if i > 0:
                h = self.act(h)
            h = layer.forward_member(h, m)
        return h

    def all_members(self, x: torch.Tensor) -> torch.Tensor:
        return self._stack(self._linears()[0].forward_all(x), start=1)

    def member_parameters(self) -> list[nn.Parameter]:
        return [p for layer in self._linears() for p in (layer.weight, layer.bias)]


@dataclass(frozen=True)
class PopulationConfig:
    """Hyperparameters of a :class:`PopulationActorCritic`.

    The ``population`` config group holds these fields (all but ``obs_dim`` and ``action_dim``,
    which come from the env) under the same names; :func:`build_population` builds from it.

    Attributes:
        obs_dim, action_dim: ``O`` and ``A``.
        size: ``M``, the number of members.
        parameterization: ``"shared_trunk"`` | ``"embedding"`` | ``"independent"``.
        actor_hidden, critic_hidden: hidden layer sizes of the two networks.
        activation: one of :data:`ACTIVATIONS`.
        embedding_dim: size of the member embedding (``"embedding"`` only).
        init_log_std: initial log standard deviation of every member's policy.
        log_std_bounds: the log std used by the policy is clamped into this range.
        normalize_obs: normalise observations with running statistics (updated by the caller
            through :meth:`PopulationActorCritic.update_obs_norm`).
        obs_clip: normalised observations are clamped to ``[-obs_clip, obs_clip]``.
        normalize_value: the critics predict returns normalised by running statistics of the
            returns; public methods give values in return units.
        value_stats: ``"member"``: each member's returns have their own statistics, so members
            paid different rewards do not rescale each other's value targets; ``"shared"``: one
            statistic for the whole population. Not part of the architecture: ``--init`` and
            :meth:`PopulationActorCritic.load_members` map either onto the other.
    """

    obs_dim: int
    action_dim: int
    size: int = setting(8, help="M members; 1 is the single-policy baseline", check=at_least(1))
    parameterization: str = setting(
        "shared_trunk",
        help="shared_trunk | embedding | independent (every parameter belongs to one member)",
        check=one_of(*PARAMETERIZATIONS),
    )
    actor_hidden: tuple[int, ...] = setting((64, 64), help="hidden layer sizes of the actors")
    critic_hidden: tuple[int, ...] = setting((64, 64), help="hidden layer sizes of the critics")
    activation: str = setting("elu", help="hidden activation", check=one_of(*ACTIVATIONS))
    embedding_dim: int = setting(
        32, help="member embedding (parameterization=embedding only)", check=at_least(1)
    )
    init_log_std: float = setting(-0.5, help="initial log std of every member's policy")
    log_std_bounds: tuple[float, float] = setting(
        (-5.0, 2.0), help="the policies' log std is clamped into this range"
    )
    normalize_obs: bool = setting(True, help="running mean / std of the observations")
    obs_clip: float = setting(
        10.0, help="normalised observations are clamped to +-obs_clip", check=positive()
    )
    normalize_value: bool = setting(
        True, help="critics predict returns normalised by running statistics"
    )
    value_stats: str = setting(
        "member",
        help="member: return statistics per member (members paid different rewards do not "
        "rescale each other) | shared",
        check=one_of(*VALUE_STATS),
    )

    def __post_init__(self) -> None:
        # Configs often arrive as lists (YAML); tuples keep the dataclass hashable and comparable.
        object.__setattr__(self, "actor_hidden", tuple(int(h) for h in self.actor_hidden))
        object.__setattr__(self, "critic_hidden", tuple(int(h) for h in self.critic_hidden))
        object.__setattr__(self, "log_std_bounds", tuple(float(b) for b in self.log_std_bounds))
        if self.parameterization not in PARAMETERIZATIONS:
            raise ValueError(
                f"unknown parameterization {self.parameterization!r}; "
                f"choose one of {', '.join(PARAMETERIZATIONS)}"
            )
        if self.value_stats not in VALUE_STATS:
            raise ValueError(
                f"unknown value_stats {self.value_stats!r}; choose one of {', '.join(VALUE_STATS)}"
            )
        if self.activation not in ACTIVATIONS:
            raise ValueError(
                f"unknown activation {self.activation!r}; choose one of {', '.join(ACTIVATIONS)}"
            )
        if self.size < 1 or self.obs_dim < 1 or self.action_dim < 1:
            raise ValueError(
                f"size, obs_dim and action_dim must be >= 1, got {self.size}, "
                f"{self.obs_dim}, {self.action_dim}"
            )

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["actor_hidden"] = list(self.actor_hidden)
        d["critic_hidden"] = list(self.critic_hidden)
        d["log_std_bounds"] = list(self.log_std_bounds)
        return d


class ActResult(NamedTuple):
    """Output of :meth:`PopulationActorCritic.act`; every field is ``[N]`` or ``[N, A]``."""

    actions: torch.Tensor
    log_prob: torch.Tensor
    value: torch.Tensor
    mean: torch.Tensor
    log_std: torch.Tensor


class Evaluation(NamedTuple):
    """Output of :meth:`PopulationActorCritic.evaluate`; ``[N]`` or ``[N, A]``."""

    log_prob: torch.Tensor
    entropy: torch.Tensor
    value: torch.Tensor
    mean: torch.Tensor
    log_std: torch.Tensor


def _build_net(
    cfg: PopulationConfig, hidden: tuple[int, ...], out: int, gain: float
) -> PopulationNet:
    m, sizes, act = cfg.size, (cfg.obs_dim, *hidden, out), cfg.activation
    if cfg.parameterization == "shared_trunk":
        return SharedTrunkNet(m, sizes, act, gain)
    if cfg.parameterization == "embedding":
        return EmbeddingNet(m, sizes, act, gain, cfg.embedding_dim)
    return IndependentNet(m, sizes, act, gain)


class PopulationActorCritic(nn.Module):
    """M diagonal-Gaussian policies and M critics evaluated in single batched passes.

    Args:
        obs_dim, action_dim: ``O`` and ``A``.
        num_members: ``M``.
        parameterization: ``"shared_trunk"`` (default), ``"embedding"`` or ``"independent"``.
        **options: the remaining fields of :class:`PopulationConfig`.

    See the module docstring for the three forms of the ``member`` argument.
    """

    log_std: nn.Parameter

    def __init__(
        self,
        obs_dim: int,
        action_dim: int,
        num_members: int = 1,
        parameterization: str = "shared_trunk",
        **options: Any,
    ) -> None:
        super().__init__()
        cfg = PopulationConfig(obs_dim, action_dim, num_members, parameterization, **options)
        self.config = cfg
        self.num_members = cfg.size
        self.obs_dim = cfg.obs_dim
        self.action_dim = cfg.action_dim
        self.actor = _build_net(cfg, cfg.actor_hidden, cfg.action_dim, ACTOR_OUTPUT_GAIN)
        self.critic = _build_net(cfg, cfg.critic_hidden, 1, CRITIC_OUTPUT_GAIN)
        self.log_std = nn.Parameter(torch.full((cfg.size, cfg.action_dim), float(cfg.init_log_std)))
        self.obs_norm = (
            RunningMeanStd(cfg.obs_dim, clip=cfg.obs_clip) if cfg.normalize_obs else None
        )
        value_groups = cfg.size if cfg.value_stats == "member" else 1
        self.value_norm = GroupMeanStd(value_groups) if cfg.normalize_value else None

    @classmethod
    def from_config(cls, config: PopulationConfig) -> PopulationActorCritic:
        values = {f.name: getattr(config, f.name) for f in fields(config)}
        return cls(num_members=values.pop("size"), **values)

    # ---------------------------------------------------------------- internals

    def _normalize_obs(self, obs: torch.Tensor) -> torch.Tensor:
        return obs if self.obs_norm is None else self.obs_norm.normalize(obs)

    def _run_net(
        self, net: PopulationNet, x: torch.Tensor, member: Member, blocked: Blocked
    ) -> torch.Tensor:
        if not isinstance(member, torch.Tensor):
            return net.single(x, int(member))
        if blocked is not False:
            members = None if blocked is True else blocked
            count = net.num_members if members is None else members.stop - members.start
            if x.shape[0] % count:
                raise ValueError(
                    f"blocked={blocked} needs the row count ({x.shape[0]}) to be a multiple of "
                    f"its number of members ({count})"
                )
            return net.blocked(x, members)
        if member.shape != x.shape[:1]:
            raise ValueError(f"member must have shape [{x.shape[0]}], got {list(member.shape)}")
        return net.rows(x, member)

    def _log_std_rows(self, n: int, member: Member, blocked: Blocked) -> torch.Tensor:
        log_std = self.log_std.clamp(*self.config.log_std_bounds)
        if not isinstance(member, torch.Tensor):
            return log_std[int(member)].expand(n, -1)
        if blocked is not False:
            if blocked is not True:
                log_std = log_std[blocked]
            m = log_std.shape[0]
            return log_std.unsqueeze(1).expand(m, n // m, -1).reshape(n, -1)
        return member_rows(log_std, member)

    def _denormalize_value(self, v: torch.Tensor, member: Member) -> torch.Tensor:
        return v if self.value_norm is None else self.value_norm.denormalize(v, member)

    def _policy(
        self, x: torch.Tensor, member: Member, blocked: Blocked
    ) -> tuple[torch.Tensor, torch.Tensor]:
        mean = self._run_net(self.actor, x, member, blocked)
        return mean, self._log_std_rows(x.shape[0], member, blocked)

    def _value(self, x: torch.Tensor, member: Member, blocked: Blocked) -> torch.Tensor:
        value = self._run_net(self.critic, x, member, blocked).squeeze(-1)
        return self._denormalize_value(value, member)

    # ---------------------------------------------------------------- public API

    def action_params(
        self, obs: torch.Tensor, member: Member, blocked: Blocked = False
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The Gaussian of each row's member: ``(mean [N, A], log_std [N, A])``."""
        return self._policy(self._normalize_obs(obs), member, blocked)

    def log_prob(
        self, obs: torch.Tensor, member: Member, actions: torch.Tensor, blocked: Blocked = False
    ) -> torch.Tensor:
        """Log-probabilities of ``actions [N, A]`` under each row's member, ``[N]`` (the actor
        alone, differentiable: :meth:`evaluate` without the critic)."""
        return gaussian_log_prob(actions, *self.action_params(obs, member, blocked))

    def value(self, obs: torch.Tensor, member: Member, blocked: Blocked = False) -> torch.Tensor:
        """Each row's member's value estimate in return units, ``[N]``."""
        return self._value(self._normalize_obs(obs), member, blocked)

    @torch.no_grad()
    def act(
        self,
        obs: torch.Tensor,
        member: Member,
        generator: torch.Generator | None = None,
        deterministic: bool = False,
        blocked: Blocked = False,
    ) -> ActResult:
        """Sample actions (or take the mean when ``deterministic``) for ``obs [N, O]``.

        Returns:
            ``ActResult(actions [N, A], log_prob [N], value [N], mean [N, A], log_std [N, A])``;
            ``log_prob`` is that of the returned actions under the sampling distribution.
        """
        x = self._normalize_obs(obs)
        mean, log_std = self._policy(x, member, blocked)
        actions = mean if deterministic else gaussian_sample(mean, log_std, generator)
        log_prob = gaussian_log_prob(actions, mean, log_std)
        return ActResult(actions, log_prob, self._value(x, member, blocked), mean, log_std)

    def evaluate(
        self, obs: torch.Tensor, member: Member, actions: torch.Tensor, blocked: Blocked = False
    ) -> Evaluation:
        """Log-probabilities, entropies and values of ``actions [N, A]`` (differentiable).

        Returns:
            ``Evaluation(log_prob [N], entropy [N], value [N], mean [N, A], log_std [N, A])``.
        """
        x = self._normalize_obs(obs)
        mean, log_std = self._policy(x, member, blocked)
        return Evaluation(
            gaussian_log_prob(actions, mean, log_std),
            gaussian_entropy(log_std),
            self._value(x, member, blocked),
            mean,
            log_std,
        )

    def member_action_means(self, obs: torch.Tensor) -> torch.Tensor:
        """Every member's action mean on the same states, ``obs [N, O] -> [M, N, A]``."""
        return self.actor.all_members(self._normalize_obs(obs))

    def member_log_std(self) -> torch.Tensor:
        """The clamped log std of every member, ``[M, A]``."""
        return self.log_std.clamp(*self.config.log_std_bounds)

    def pairwise_kl(self, obs: torch.Tensor) -> torch.Tensor:
        """Pairwise policy KL on shared states ``obs [N, O]``, ``[M, M]``.

        Entry (i, j) is ``mean_n KL(pi_i(.|s_n) || pi_j(.|s_n))``; the diagonal is zero.
        """
        return pairwise_gaussian_kl(
            self.member_action_means(obs), self.member_log_std().unsqueeze(1)
        )

    @torch.no_grad()
    def update_obs_norm(self, obs: torch.Tensor) -> None:
        """Fold ``obs [..., O]`` into the observation statistics (no-op without normalisation)."""
        if self.obs_norm is not None:
            self.obs_norm.update(obs.reshape(-1, self.obs_dim))

    # ---------------------------------------------------------------- members

    def member_parameters(self) -> list[nn.Parameter]:
        """Parameters whose leading dimension indexes members (the rest are shared)."""
        return [*self.actor.member_parameters(), *self.critic.member_parameters(), self.log_std]

    def _member_state_keys(self) -> set[str]:
        ids = {id(p) for p in self.member_parameters()}
        return {name for name, p in self.named_parameters() if id(p) in ids}

    @torch.no_grad()
    def copy_member(
        self,
        src: int | Sequence[int] | torch.Tensor,
        dst: int | Sequence[int] | torch.Tensor,
        optimizer: torch.optim.Optimizer | None = None,
    ) -> None:
        """Copy the parameters (log std included) of members ``src`` into members ``dst``.

        Shared parameters are untouched (they are already common); per-member value statistics
        are copied with the critic. With ``optimizer``, the per-parameter optimiser state rows
        (for example Adam's moments) are copied as well, so a replaced member continues exactly
        like its source. ``src`` and ``dst`` may be lists of
        equal length for several copies at once (the PBT exploit step).
        """
        src_t = torch.as_tensor(src, dtype=torch.long, device=self.log_std.device)
        dst_t = torch.as_tensor(dst, dtype=torch.long, device=self.log_std.device)
        if src_t.shape != dst_t.shape:
            raise ValueError(f"src and dst differ in length: {src_t.tolist()} vs {dst_t.tolist()}")
        for p in self.member_parameters():
            p[dst_t] = p[src_t].clone()
            if optimizer is None:
                continue
            for value in optimizer.state.get(p, {}).values():
                if isinstance(value, torch.Tensor) and value.shape == p.shape:
                    value[dst_t] = value[src_t].clone()
        if self.value_norm is not None:
            self.value_norm.copy_groups(src_t, dst_t)

    def compatibility(self, other: PopulationActorCritic) -> list[str]:
        """Config fields, other than :data:`LOADABLE_DIFFERENCES`, in which ``other`` differs
        from this one."""
        a, b = self.config.to_dict(), other.config.to_dict()
        return [
            f"{k}: {b[k]!r} (source) vs {a[k]!r} (target)"
            for k in a
            if k not in LOADABLE_DIFFERENCES and a[k] != b[k]
        ]

    @torch.no_grad()
    def load_members(
        self,
        source: PopulationActorCritic,
        indices: Sequence[int],
        into: Sequence[int] | None = None,
    ) -> None:
        """Load members ``indices`` of ``source`` into members ``into`` (default ``0..k-1``).

        Shared parameters and normalisers are copied from ``source`` too, because the loaded
        members' heads are only meaningful on top of them. Per-member value statistics follow
        their members; shared ones are given to every loaded member (and the reverse: a
        shared target takes the first loaded member's).

        Raises:
            ValueError: the two populations differ in architecture (message lists the fields),
                or an index is out of range.
        """
        diff = self.compatibility(source)
        if diff:
            raise ValueError("cannot load members across architectures: " + "; ".join(diff))
        into = list(range(len(indices))) if into is None else list(into)
        if len(into) != len(indices):
            raise ValueError(f"indices and into differ in length: {indices} vs {into}")
        checks = (("indices", indices, source.num_members), ("into", into, self.num_members))
        for name, idx, size in checks:
            bad = [i for i in idx if not 0 <= i < size]
            if bad:
                raise ValueError(f"{name} {bad} out of range for a population of {size}")
        member_keys = self._member_state_keys()
        src_state = source.state_dict()
        device = self.log_std.device
        src_idx = torch.as_tensor(list(indices), dtype=torch.long)
        dst_idx = torch.as_tensor(into, dtype=torch.long, device=device)
        src_value_groups = source.value_norm.groups if source.value_norm is not None else 1
        for key, tensor in self.state_dict().items():
            value = src_state[key]
            if key.startswith("value_norm."):
                rows = src_idx if src_value_groups > 1 else torch.zeros_like(src_idx)
                if tensor.numel() > 1:
                    tensor[dst_idx] = value[rows.to(value.device)].to(tensor)
                else:
                    tensor.copy_(value[rows[:1].to(value.device)].to(tensor))
            elif key in member_keys:
                tensor[dst_idx] = value[src_idx.to(value.device)].to(tensor)
            else:
                tensor.copy_(value)

    def extract_members(self, indices: Sequence[int]) -> PopulationActorCritic:
        """A new population made of members ``indices`` of this one, in that order."""
        new = type(self).from_config(replace(self.config, size=len(indices)))
        new.to(self.log_std.device)
        new.load_members(self, indices)
        return new


#: The fields of :class:`PopulationConfig` that come from the env, not from the config.
ENV_SIZE_FIELDS: tuple[str, ...] = ("obs_dim", "action_dim")

#: The fields of a population config that define its architecture: everything but the size and
#: the env's sizes. ``--init`` takes them from the pretrained population.
ARCHITECTURE_FIELDS: tuple[str, ...] = tuple(
    name
    for name in field_names(PopulationConfig)
    if name not in (*ENV_SIZE_FIELDS, *LOADABLE_DIFFERENCES)
)


def population_config(
    population: Mapping[str, Any], obs_dim: int, action_dim: int
) -> PopulationConfig:
    """The :class:`PopulationConfig` of a ``population`` config group for an env's sizes.

    Raises:
        ConfigError: a key that is not a field (the message lists the keys), or a bad value.
    """
    return from_config(
        PopulationConfig,
        population,
        "population",
        obs_dim=int(obs_dim),
        action_dim=int(action_dim),
    )


def build_population(
    population: Mapping[str, Any], obs_dim: int, action_dim: int
) -> PopulationActorCritic:
    """The population described by a ``population`` config group (pretraining and finetuning).

    Raises:
        ConfigError: see :func:`population_config`.
    """
    return PopulationActorCritic.from_config(population_config(population, obs_dim, action_dim))
