"""Physics backends: step E copies of one MuJoCo model and expose their state as torch tensors.

A backend only steps physics. Tasks read the state through :meth:`PhysicsBackend.field` (views
``[E, ...]`` on the env's device) and write it only through :meth:`PhysicsBackend.reset_envs`.

- :class:`CpuBackend` (``backend="mujoco"``): one ``MjData`` per environment, stepped by
  persistent worker processes, each owning a contiguous block of environments and exchanging
  controls and state with the caller through shared memory.
- :class:`WarpBackend` (``backend="warp"``): MuJoCo Warp with ``nworld = E`` on a CUDA device or
  on Warp's CPU device; fields are ``wp.to_torch`` views of the simulator's arrays (no copies), and
  on CUDA the physics step is captured once as a CUDA graph.

Both follow Gymnasium's ``MujocoEnv`` sequence, so the derived quantities a task reads mean the
same thing on both: a step is ``frame_skip`` calls of ``mj_step`` followed by
``mj_rnePostConstraint`` (when the task reads ``cfrc_ext``), and a reset is ``mj_resetData``, then
writing ``qpos``/``qvel``, then ``mj_forward``.
"""

from __future__ import annotations

import abc
import multiprocessing as mp
import os
import weakref
from collections.abc import Sequence

import mujoco
import numpy as np
import torch

BACKENDS: tuple[str, ...] = ("mujoco", "warp")

# Per-environment shape of each readable field, from the model's sizes.
_FIELD_SHAPES = {
    "qpos": lambda m: (m.nq,),
    "qvel": lambda m: (m.nv,),
    "xpos": lambda m: (m.nbody, 3),
    "xquat": lambda m: (m.nbody, 4),
    "xipos": lambda m: (m.nbody, 3),
    "cinert": lambda m: (m.nbody, 10),
    "cvel": lambda m: (m.nbody, 6),
    "cfrc_ext": lambda m: (m.nbody, 6),
    "qfrc_actuator": lambda m: (m.nv,),
    "sensordata": lambda m: (m.nsensordata,),
}
_ALWAYS = ("qpos", "qvel")


def _check_fields(fields: Sequence[str]) -> tuple[str, ...]:
    unknown = sorted(set(fields) - set(_FIELD_SHAPES))
    if unknown:
        raise ValueError(f"unknown MuJoCo fields {unknown}; known: {sorted(_FIELD_SHAPES)}")
    return tuple(dict.fromkeys((*_ALWAYS, *fields)))


class PhysicsBackend(abc.ABC):
    """E copies of one MuJoCo model.

    Attributes:
        model: the compiled ``MjModel`` (host).
        num_envs: ``E``.
        frame_skip: ``mj_step`` calls per :meth:`step`.
        device: torch device of every tensor in and out.
        dtype: float dtype of the fields (float64 on CPU MuJoCo, float32 on Warp).
        fields: the fields tasks read (``qpos`` and ``qvel`` always).
    """

    # The fields and ``time`` as tensors ``[E, ...]`` on ``device``, kept current by subclasses.
    _views: dict[str, torch.Tensor]

    def __init__(
        self,
        model: mujoco.MjModel,
        num_envs: int,
        frame_skip: int,
        fields: Sequence[str],
        device: torch.device | str,
        dtype: torch.dtype,
    ) -> None:
        self.model = model
        self.num_envs = int(num_envs)
        self.frame_skip = int(frame_skip)
        self.device = torch.device(device)
        self.dtype = dtype
        self.fields = _check_fields(fields)

    def field(self, name: str) -> torch.Tensor:
        """The current value of ``name`` for every env, ``[E, *shape]`` (e.g. ``xpos [E, nbody,
        3]``). Read-only for callers; valid until the next :meth:`step` or :meth:`reset_envs`."""
        return self._views[name]

    def time(self) -> torch.Tensor:
        """Simulation time of every env, ``[E]``."""
        return self._views["time"]

    def diverged(self) -> torch.Tensor:
        """``[E]`` bool: the engine met a non-finite state during the last :meth:`step` and
        recovered on its own (CPU MuJoCo resets such data and steps on), so the state looks
        finite but is not the one the actions led to. Engines that leave NaN in the state (Warp)
        need no flag: the caller's finiteness check sees them."""
        return torch.zeros(self.num_envs, dtype=torch.bool, device=self.device)

    @abc.abstractmethod
    def step(self, ctrl: torch.Tensor) -> None:
        """Apply ``ctrl [E, nu]`` for ``frame_skip`` physics steps."""

    @abc.abstractmethod
    def reset_envs(self, mask: torch.Tensor, qpos: torch.Tensor, qvel: torch.Tensor) -> None:
        """Reset the envs where ``mask [E]`` is True to ``qpos [E, nq]``, ``qvel [E, nv]`` (rows
        of unmasked envs are ignored) and recompute their derived quantities."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release threads and device memory."""


_DIVERGENCE_WARNINGS = (
    mujoco.mjtWarning.mjWARN_BADQPOS,
    mujoco.mjtWarning.mjWARN_BADQVEL,
    mujoco.mjtWarning.mjWARN_BADQACC,
)


class _Block:
    """``MjData`` for envs ``[lo, hi)`` of the batch, reading and writing shared batch arrays.

    Runs in a worker process (or in the caller's process for small batches). ``arrays`` holds
    ``[E, ...]`` float64 views: the fields, ``time``, ``ctrl``, and the reset inputs
    ``reset_mask``, ``reset_qpos``, ``reset_qvel``.
    """

    def __init__(
        self,
        model: mujoco.MjModel,
        lo: int,
        hi: int,
        frame_skip: int,
        fields: Sequence[str],
        arrays: dict[str, np.ndarray],
    ):
        self.model, self.lo, self.hi, self.frame_skip = model, lo, hi, frame_skip
        self.post_constraint = "cfrc_ext" in fields
        self.arrays = arrays
        self.datas = [mujoco.MjData(model) for _ in range(lo, hi)]
        # (source view in MjData, destination row) pairs bound once, so the per-env loops below
        # do no attribute look-ups.
        self.copies = [
            [(getattr(d, name), arrays[name][lo + k]) for name in fields]
            for k, d in enumerate(self.datas)
        ]
        for k in range(hi - lo):
            self._gather(k)

    def _gather(self, k: int) -> None:
        for src, dst in self.copies[k]:
            dst[...] = src
        self.arrays["time"][self.lo + k] = self.datas[k].time
        # MuJoCo counts the bad states it reset by itself; the counts are cleared once read.
        warnings = self.datas[k].warning
        bad = sum(warnings[w].number for w in _DIVERGENCE_WARNINGS)
        self.arrays["diverged"][self.lo + k] = float(bad > 0)
        if bad:
            for w in _DIVERGENCE_WARNINGS:
                warnings[w].number = 0

    def step(self) -> None:
        m, n, post = self.model, self.frame_skip, self.post_constraint
        ctrl = self.arrays["ctrl"]
        for k, d in enumerate(self.datas):
            d.ctrl[:] = ctrl[self.lo + k]
            mujoco.mj_step(m, d, n)
            if post:
                mujoco.mj_rnePostConstraint(m, d)
            self._gather(k)

    def reset(self) -> None:
        m, a = self.model, self.arrays
        for k in np.flatnonzero(a["reset_mask"][self.lo : self.hi]).tolist():
            d, i = self.datas[k], self.lo + k
            mujoco.mj_resetData(m, d)
            d.qpos[:] = a["reset_qpos"][i]
            d.qvel[:] = a["reset_qvel"][i]
            mujoco.mj_forward(m, d)
            self._gather(k)

    def corrupt(self, env: int, value: float) -> None:
        self.datas[env - self.lo].qvel[:] = value


def _serve(conn, model, lo, hi, frame_skip, fields, raw, shapes) -> None:  # pragma: no cover
    """Worker process: step its block of envs on command until told to close."""
    arrays = {k: np.frombuffer(raw[k], dtype=np.float64).reshape(shapes[k]) for k in raw}
    block = _Block(model, lo, hi, frame_skip, fields, arrays)
    conn.send(("ok", None))
    while True:
        cmd, arg = conn.recv()
        if cmd == "close":
            conn.send(("ok", None))
            return
        try:
            getattr(block, cmd)(*arg)
            conn.send(("ok", None))
        except Exception as exc:  # reported to the caller, which raises
            conn.send(("error", f"{type(exc).__name__}: {exc}"))


class CpuBackend(PhysicsBackend):
    """CPU MuJoCo: one ``MjData`` per env; blocks of envs stepped in parallel worker processes.

    MuJoCo's bindings release the GIL inside ``mj_step``, but the per-env Python around it
    (controls in, fields out) holds it: a thread pool over ``MjData`` measured 1.45x one
    thread on two cores. Instead each worker process owns a contiguous block of envs, and all
    of them read controls from and write state into shared memory, so a step costs one message
    per worker, not per env. Small batches run in the calling process.

    Args:
        model: compiled model.
        num_envs: ``E``.
        frame_skip: ``mj_step`` calls per step.
        fields: the fields tasks read (``qpos`` and ``qvel`` always).
        device: torch device of the returned tensors; state lives on the host, so a CUDA device
            costs one host-to-device copy per field and step.
        num_workers: worker processes; ``0`` steps in the calling process. Default: one per CPU
            core when ``E >= 64``, else 0.
    """

    def __init__(
        self,
        model: mujoco.MjModel,
        num_envs: int,
        frame_skip: int,
        fields: Sequence[str],
        device: torch.device | str = "cpu",
        num_workers: int | None = None,
    ):
        super().__init__(model, num_envs, frame_skip, fields, device, torch.float64)
        E = self.num_envs
        if num_workers is None:
            num_workers = (os.cpu_count() or 1) if E >= 64 else 0
        self.num_workers = max(0, min(int(num_workers), E))
        shapes = {name: (E, *_FIELD_SHAPES[name](model)) for name in self.fields}
        shapes.update(
            time=(E,),
            diverged=(E,),
            ctrl=(E, model.nu),
            reset_mask=(E,),
            reset_qpos=(E, model.nq),
            reset_qvel=(E, model.nv),
        )
        self._conns: list = []
        self._procs: list = []
        # The block of all envs when they step in this process; None with worker processes.
        self._block: _Block | None
        if self.num_workers == 0:
            self._arrays = {k: np.zeros(shape) for k, shape in shapes.items()}
            self._block = _Block(model, 0, E, self.frame_skip, self.fields, self._arrays)
        else:
            self._block = None
            self._arrays = self._start_workers(shapes)
        self._tensors = {
            k: torch.from_numpy(self._arrays[k]) for k in (*self.fields, "time", "diverged")
        }
        self._refresh()
        self._finalizer = weakref.finalize(self, _shutdown, self._conns, self._procs)

    def _start_workers(self, shapes: dict[str, tuple[int, ...]]) -> dict[str, np.ndarray]:
        methods = mp.get_all_start_methods()
        ctx = mp.get_context("fork") if "fork" in methods else mp.get_context("spawn")
        raw = {k: ctx.RawArray("d", int(np.prod(shape))) for k, shape in shapes.items()}
        arrays = {k: np.frombuffer(raw[k], dtype=np.float64).reshape(s) for k, s in shapes.items()}
        self._bounds = [
            (int(b[0]), int(b[-1]) + 1)
            for b in np.array_split(np.arange(self.num_envs), self.num_workers)
        ]
        for lo, hi in self._bounds:
            parent, child = ctx.Pipe()
            proc = ctx.Process(
                target=_serve,
                args=(child, self.model, lo, hi, self.frame_skip, self.fields, raw, shapes),
                daemon=True,
                name=f"myriad-mujoco-{lo}-{hi}",
            )
            proc.start()
            child.close()
            self._conns.append(parent)
            self._procs.append(proc)
        self._wait(self._conns)
        return arrays

    def _wait(self, conns: list) -> None:
        for conn in conns:
            try:
                status, detail = conn.recv()
            except EOFError as exc:
                raise RuntimeError("a MuJoCo worker process died; see its stderr") from exc
            if status != "ok":
                raise RuntimeError(f"MuJoCo worker failed: {detail}")

    def _command(self, cmd: str, *arg, only: list[int] | None = None) -> None:
        if self._block is not None:
            getattr(self._block, cmd)(*arg)
            return
        targets = [self._conns[i] for i in (only if only is not None else range(len(self._conns)))]
        for conn in targets:
            conn.send((cmd, arg))
        self._wait(targets)

    def _refresh(self) -> None:
        if self.device.type == "cpu":
            self._views = self._tensors
        else:
            self._views = {k: v.to(self.device) for k, v in self._tensors.items()}

    def diverged(self) -> torch.Tensor:
        return self._views["diverged"] > 0

    def step(self, ctrl: torch.Tensor) -> None:
        self._arrays["ctrl"][...] = ctrl.detach().to("cpu", torch.float64).numpy()
        self._command("step")
        if self.device.type != "cpu":
            self._refresh()

    def reset_envs(self, mask: torch.Tensor, qpos: torch.Tensor, qvel: torch.Tensor) -> None:
        m = mask.detach().to("cpu").numpy().astype(bool)
        if not m.any():
            return
        a = self._arrays
        a["reset_mask"][...] = m
        a["reset_qpos"][...] = qpos.detach().to("cpu", torch.float64).numpy()
        a["reset_qvel"][...] = qvel.detach().to("cpu", torch.float64).numpy()
        only = None
        if self._block is None:
            only = [i for i, (lo, hi) in enumerate(self._bounds) if m[lo:hi].any()]
        self._command("reset", only=only)
        if self.device.type != "cpu":
            self._refresh()

    def corrupt(self, env: int, qvel_value: float = float("nan")) -> None:
        """Write ``qvel_value`` into env ``env``'s velocities, as a diverging simulation would."""
        only = None
        if self._block is None:
            only = [i for i, (lo, hi) in enumerate(self._bounds) if lo <= env < hi]
        self._command("corrupt", env, qvel_value, only=only)

    def close(self) -> None:
        self._finalizer()


def _shutdown(conns: list, procs: list) -> None:
    for conn in conns:
        try:
            conn.send(("close", ()))
            conn.recv()
        except (OSError, EOFError):
            pass
        conn.close()
    for proc in procs:
        proc.join(timeout=5)
        if proc.is_alive():
            proc.terminate()
    conns.clear()
    procs.clear()


class WarpBackend(PhysicsBackend):
    """MuJoCo Warp with one world per env; fields are zero-copy torch views of Warp arrays.

    Args:
        model: compiled model (uploaded once with ``put_model``).
        num_envs: ``E`` worlds.
        frame_skip: ``step`` calls per env step.
        fields: the fields tasks read.
        device: ``"cpu"`` (Warp's CPU device, compiled kernels, no GPU needed) or a CUDA device.
        nconmax: contacts per world to allocate; ``njmax``: constraint rows per world.
        graph: capture the physics step as a CUDA graph (CUDA only).
    """

    def __init__(
        self,
        model: mujoco.MjModel,
        num_envs: int,
        frame_skip: int,
        fields: Sequence[str],
        device: torch.device | str = "cpu",
        nconmax: int = 64,
        njmax: int = 256,
        graph: bool = True,
    ):
        from myriad.envs.mujoco._warp import import_warp

        self.wp, self.mjw = import_warp()
        wp, mjw = self.wp, self.mjw
        super().__init__(model, num_envs, frame_skip, fields, device, torch.float32)
        if self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.post_constraint = "cfrc_ext" in self.fields
        self.wp_device = "cpu" if self.device.type == "cpu" else f"cuda:{self.device.index}"
        self.use_graph = graph and self.device.type == "cuda"
        with wp.ScopedDevice(self.wp_device):
            self.m = mjw.put_model(model)
            # Stopping at the iteration limit is the point of small iteration counts; contact
            # and constraint overflow warnings stay on.
            if hasattr(mjw, "OverflowType"):
                self.m.opt.warn_overflow &= ~int(mjw.OverflowType.ITERATIONS)
            self.d = mjw.make_data(model, nworld=self.num_envs, nconmax=nconmax, njmax=njmax)
            self._mask_wp = wp.zeros(self.num_envs, dtype=bool)
        self._views = {name: wp.to_torch(getattr(self.d, name)) for name in self.fields}
        self._views["time"] = wp.to_torch(self.d.time)
        self._ctrl = wp.to_torch(self.d.ctrl)
        self._mask = wp.to_torch(self._mask_wp)
        # Fields that mj_forward recomputes; envs that are not reset keep their post-step values.
        self._derived = [n for n in self.fields if n not in ("qpos", "qvel")]
        self._graphs: dict[str, object] = {}
        self._stream = None
        if self.device.type == "cuda":
            self._stream = wp.stream_from_torch(torch.cuda.current_stream(self.device))
        self._launch("forward", self._forward_impl)

    def _step_impl(self) -> None:
        for _ in range(self.frame_skip):
            self.mjw.step(self.m, self.d)
        if self.post_constraint:
            self.mjw.rne_postconstraint(self.m, self.d)

    def _reset_impl(self) -> None:
        self.mjw.reset_data(self.m, self.d, reset=self._mask_wp)

    def _forward_impl(self) -> None:
        self.mjw.forward(self.m, self.d)

    def _launch(self, name: str, fn) -> None:
        wp = self.wp
        with wp.ScopedDevice(self.wp_device):
            if self._stream is not None:
                with wp.ScopedStream(self._stream):
                    if not self.use_graph:
                        fn()
                        return
                    if name not in self._graphs:
                        # The first call compiles and loads kernels, which cannot be captured.
                        fn()
                        with wp.ScopedCapture() as capture:
                            fn()
                        self._graphs[name] = capture.graph
                        return
                    wp.capture_launch(self._graphs[name])
                    return
            fn()

    def step(self, ctrl: torch.Tensor) -> None:
        self._ctrl.copy_(ctrl)
        self._launch("step", self._step_impl)

    def reset_envs(self, mask: torch.Tensor, qpos: torch.Tensor, qvel: torch.Tensor) -> None:
        if self.device.type == "cpu" and not bool(mask.any()):
            return
        saved = {name: self._views[name].clone() for name in self._derived}
        self._mask.copy_(mask)
        self._launch("reset", self._reset_impl)
        m = mask.view(-1, 1)
        q, v = self._views["qpos"], self._views["qvel"]
        q.copy_(torch.where(m, qpos.to(q.dtype), q))
        v.copy_(torch.where(m, qvel.to(v.dtype), v))
        self._launch("forward", self._forward_impl)
        for name, old in saved.items():
            view = self._views[name]
            keep = mask.view(-1, *([1] * (view.dim() - 1)))
            view.copy_(torch.where(keep, view, old))
        if "cfrc_ext" in self._views:
            # mj_forward leaves cfrc_ext at zero after mj_resetData (it is computed by
            # mj_rnePostConstraint only), as in Gymnasium's reset.
            self._views["cfrc_ext"].masked_fill_(mask.view(-1, 1, 1), 0.0)

    def corrupt(self, env: int, qvel_value: float = float("nan")) -> None:
        """Write ``qvel_value`` into env ``env``'s velocities, as a diverging simulation would."""
        self._views["qvel"][env] = qvel_value


def make_backend(
    backend: str,
    model: mujoco.MjModel,
    num_envs: int,
    frame_skip: int,
    fields: Sequence[str],
    device: torch.device | str,
    num_workers: int | None = None,
    nconmax: int = 64,
    njmax: int = 256,
) -> PhysicsBackend:
    """Build the backend named ``backend`` (``"mujoco"`` or ``"warp"``)."""
    if backend == "mujoco":
        return CpuBackend(model, num_envs, frame_skip, fields, device, num_workers)
    if backend == "warp":
        return WarpBackend(model, num_envs, frame_skip, fields, device, nconmax, njmax)
    raise ValueError(f"backend must be one of {list(BACKENDS)}, got {backend!r}")
