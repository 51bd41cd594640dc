"""The ranks of a ``torchrun`` launch: which members and envs each rank owns, and the collectives
a sharded population needs.

``torchrun --nproc_per_node=R -m myriad pretrain ...`` starts R processes with ``RANK``,
``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT`` set. :meth:`RankGroup.launch`
joins the process group they describe: NCCL when the run's device is CUDA (rank ``r`` on
``cuda:LOCAL_RANK``), gloo on CPU. Without ``WORLD_SIZE > 1`` nothing here is used and myriad runs
its single-process code path.

Layout: the run's ``E`` envs form ``M`` contiguous member blocks (``block_members``); rank ``r`` of
``R`` owns members ``[r M/R, (r+1) M/R)`` and therefore the contiguous envs
``[r E/R, (r+1) E/R)``. Concatenating per-env tensors of the ranks in rank order gives the
single-process layout exactly.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from myriad.distributed.shards import shard_seed
from myriad.utils.config import ConfigError
from myriad.utils.launch import CollectiveFailed

#: The variables ``torchrun`` sets for each process; all must be present under a launch.
LAUNCH_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")

#: The most elements times ``R - 1`` (what a rank receives) that :meth:`RankGroup.all_reduce_`
#: sums from a gloo all-gather rather than all-reduces: the all-gather's bytes grow with the
#: ranks, and at 100,000 floats on two ranks its median call was already no faster
#: (benchmarks/results/gloo_collectives.json).
GATHERED_SUM_LIMIT = 1 << 16


def launched_world_size(environ: Mapping[str, str] | None = None) -> int:
    """``WORLD_SIZE`` of a ``torchrun`` launch, 1 when the process was not launched by one.

    Raises:
        ConfigError: ``WORLD_SIZE`` is set but is not a positive integer.
    """
    text = (os.environ if environ is None else environ).get("WORLD_SIZE")
    if text is None or text == "":
        return 1
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise ConfigError(f"WORLD_SIZE={text!r} must be a positive integer (torchrun sets it)")
    return value


def check_no_env_workers(cfg: Mapping[str, Any]) -> None:
    """Refuse envs on Ray workers under torchrun ranks (each rank steps its envs itself).

    Raises:
        ConfigError: ``cfg`` has a ``distributed`` preset.
    """
    if cfg.get("distributed"):
        raise ConfigError(
            "distributed=local|cluster (envs on Ray workers) and torchrun ranks do not combine: "
            "drop distributed= or launch without torchrun"
        )


def check_sharding(num_members: int, world_size: int) -> None:
    """Refuse a population that does not split into equal member shards over the ranks.

    Raises:
        ConfigError: ``num_members`` is not a multiple of ``world_size``.
    """
    if num_members % world_size:
        lower = num_members - num_members % world_size
        choices = f"population.size={lower + world_size}" + (f" or {lower}" if lower else "")
        raise ConfigError(
            f"population.size={num_members} does not split over {world_size} torchrun ranks "
            f"(each rank owns population.size / nproc members): use {choices}, or a "
            f"--nproc_per_node that divides {num_members}"
        )


@dataclass(frozen=True)
class RankGroup:
    """This process's place in a launch, and the collectives over all ranks.

    Attributes:
        rank: ``RANK`` (0 writes the run's files).
        world_size: ``R``.
        local_rank: ``LOCAL_RANK``, the GPU index on this node for NCCL.
        device: the device this rank's tensors and collectives use.
        backend: ``"nccl"`` or ``"gloo"``.
    """

    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    backend: str

    @classmethod
    def launch(cls, device: str, environ: Mapping[str, str] | None = None) -> RankGroup:
        """Join the process group of a ``torchrun`` launch for a run on ``device``.

        Raises:
            ConfigError: a launch variable is missing, or ``device`` names a GPU index (each
                rank takes ``cuda:LOCAL_RANK``; write ``device=cuda``).
        """
        env = os.environ if environ is None else environ
        missing = [name for name in LAUNCH_VARIABLES if not env.get(name)]
        if missing:
            raise ConfigError(
                f"WORLD_SIZE is set but {', '.join(missing)} are not: start the ranks with "
                "torchrun (torchrun --nproc_per_node=N -m myriad pretrain|finetune ...)"
            )
        rank, world, local = int(env["RANK"]), int(env["WORLD_SIZE"]), int(env["LOCAL_RANK"])
        target = torch.device(device)
        if target.type == "cuda":
            if target.index is not None:
                raise ConfigError(
                    f"device={device} under torchrun: every rank takes cuda:LOCAL_RANK, so give "
                    "device=cuda"
                )
            target = torch.device("cuda", local)
            torch.cuda.set_device(target)  # "cuda" tensors of this process land on its GPU
            backend = "nccl"
        elif target.type == "cpu":
            backend = "gloo"
        else:
            raise ConfigError(f"device={device} under torchrun: use cpu (gloo) or cuda (NCCL)")
        if not dist.is_initialized():
            dist.init_process_group(backend, rank=rank, world_size=world)
        return cls(rank, world, local, target, backend)

    def close(self) -> None:
        """Leave the process group (every rank, at the end of the run, together)."""
        if dist.is_initialized():
            # A rank that tore its gloo connections down while a peer was still using them
            # aborted now and then (std::terminate at exit, about 1 run in 10 on 2 ranks).
            # On gloo the monitored barrier (send/receive through rank 0): gloo's own barrier
            # keeps the works in flight before it alive (our last broadcasts, whose tensors are
            # Python objects), and a worker thread freeing them needs the GIL, which the group's
            # destructor holds while it joins that thread: torch 2.4.1 deadlocked there in 3 of 16
            # finetuning runs on 2 ranks, none of 40 with the monitored barrier.
            if self.backend == "gloo":
                dist.monitored_barrier()
            else:
                dist.barrier()
            dist.destroy_process_group()
            # An object in a reference cycle can keep the gloo group alive until the interpreter
            # shuts down, where its worker threads abort the process (std::terminate; 3 of 20
            # finetuning runs on 2 ranks without this collection, none of 20 with it): collect it
            # while the interpreter still runs.
            gc.collect()

    # ---------------------------------------------------------------- layout

    @property
    def is_writer(self) -> bool:
        """Rank 0 writes the run folder: config, checkpoints, dataset, logs, plots."""
        return self.rank == 0

    def member_shard(self, num_members: int) -> slice:
        """The members this rank owns (see :func:`check_sharding`)."""
        check_sharding(num_members, self.world_size)
        per_rank = num_members // self.world_size
        return slice(self.rank * per_rank, (self.rank + 1) * per_rank)

    def env_shard(self, num_envs: int, num_members: int) -> slice:
        """The envs of this rank's members in the run's member-major layout of ``num_envs``."""
        members = self.member_shard(num_members)
        per_member = num_envs // num_members
        return slice(members.start * per_member, members.stop * per_member)

    def env_block(self, num_envs: int) -> slice:
        """The ``r``-th of ``R`` equal contiguous blocks of the run's envs: this rank's members'
        envs when ``R`` divides the population (:meth:`env_shard`), else a share of a member's
        envs (one policy over all envs: ``population.size=1``).

        Raises:
            ConfigError: ``num_envs`` is not a multiple of ``world_size``.
        """
        if num_envs % self.world_size:
            raise ConfigError(
                f"num_envs={num_envs} does not split over {self.world_size} torchrun ranks: use "
                f"a multiple of {self.world_size}"
            )
        per_rank = num_envs // self.world_size
        return slice(self.rank * per_rank, (self.rank + 1) * per_rank)

    def stream_seed(self, seed: int) -> int:
        """The seed of this rank's env resets and action sampling: shard ``rank`` of ``seed`` as
        for Ray env shards (:func:`~myriad.distributed.shards.shard_seed`), so ranks draw
        independent streams."""
        return shard_seed(seed, self.rank)

    # ---------------------------------------------------------------- collectives

    def all_gather_cat(self, local: torch.Tensor, dim: int = 0) -> torch.Tensor:
        """Every rank's ``local`` (same shape on all ranks) concatenated along ``dim`` in rank
        order, on every rank."""
        return self.start_all_gather_cat(local, dim)()

    def start_all_gather_cat(self, local: torch.Tensor, dim: int = 0) -> Callable[[], torch.Tensor]:
        """:meth:`all_gather_cat` started without waiting: returns the call that waits for it
        and returns the concatenation."""
        wire = _to_wire(local)
        parts = [torch.empty_like(wire) for _ in range(self.world_size)]
        gathering = dist.all_gather(parts, wire, async_op=True)

        def gathered() -> torch.Tensor:
            _wait(gathering)
            return _from_wire(torch.cat(parts, dim=dim), local.dtype)

        return gathered

    def gather_cat(self, local: torch.Tensor, dim: int = 0) -> torch.Tensor | None:
        """:meth:`all_gather_cat` delivered to rank 0 only (None on the other ranks)."""
        wire = _to_wire(local)
        parts = [torch.empty_like(wire) for _ in range(self.world_size)] if self.is_writer else None
        dist.gather(wire, parts, dst=0)
        if parts is None:
            return None
        return _from_wire(torch.cat(parts, dim=dim), local.dtype)

    def all_reduce_(self, tensor: torch.Tensor, op: str = "sum") -> torch.Tensor:
        """Reduce ``tensor`` in place over the ranks (``"sum"`` or ``"max"``); returns it.

        On gloo, a small tensor (:data:`GATHERED_SUM_LIMIT`) is summed from an all-gather
        instead (rank order, the same sum on every rank): the split update's
        per-minibatch gradient average is such a tensor, and gloo's all-reduce of it, several
        exchanges between the processes, waits longer than one all-gather
        (docs/distributed.md, "Collectives on gloo").
        """
        return self.start_all_reduce_(tensor, op)()

    def start_all_reduce_(
        self, tensor: torch.Tensor, op: str = "sum"
    ) -> Callable[[], torch.Tensor]:
        """:meth:`all_reduce_` started without waiting: returns the call that waits for it and
        returns ``tensor``, reduced. Work that neither reads nor writes ``tensor`` can run in
        between."""
        if (
            op == "sum"
            and self.backend == "gloo"
            and tensor.dtype != torch.bool
            and tensor.numel() * (self.world_size - 1) <= GATHERED_SUM_LIMIT
        ):
            gathered = self.start_all_gather_cat(tensor.unsqueeze(0), 0)  # [R, ...]

            def summed() -> torch.Tensor:
                with torch.no_grad():
                    return torch.sum(gathered(), dim=0, out=tensor)

            return summed
        ops = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX}
        reducing = dist.all_reduce(tensor, op=ops[op], async_op=True)

        def reduced() -> torch.Tensor:
            _wait(reducing)
            return tensor

        return reduced

    def broadcast_(self, tensor: torch.Tensor) -> torch.Tensor:
        """Overwrite ``tensor`` with rank 0's, in place; returns it."""
        dist.broadcast(tensor, src=0)
        return tensor

    def broadcast_object(self, value: Any) -> Any:
        """Rank 0's ``value`` (any picklable object) on every rank."""
        box = [value]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def gather_objects(self, value: Any) -> list[Any] | None:
        """Every rank's ``value`` in rank order on rank 0; None on the other ranks."""
        out: list[Any] | None = [None] * self.world_size if self.is_writer else None
        dist.gather_object(value, out, dst=0)
        return out


def _wait(work: Any) -> None:
    """Wait for a collective started with ``async_op=True``; its failure (a peer that ended)
    raised as :class:`~myriad.utils.launch.CollectiveFailed`, which the command line reports
    as a collective's, in one line from rank 0."""
    try:
        work.wait()
    except RuntimeError as exc:
        raise CollectiveFailed(str(exc)) from exc


def _to_wire(x: torch.Tensor) -> torch.Tensor:
    """gloo has no bool collectives: send bools as bytes."""
    x = x.contiguous()
    return x.view(torch.uint8) if x.dtype == torch.bool else x


def _from_wire(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return x.view(torch.bool) if dtype == torch.bool else x
