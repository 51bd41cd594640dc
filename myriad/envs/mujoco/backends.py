"""Physics backends: step E copies of one MuJoCo model and expose their state as torch tensors.

A backend only steps physics. Tasks read the state through :meth:`PhysicsBackend.field` (views
``[E, ...]`` on the env's device) and write it only through :meth:`PhysicsBackend.reset_envs`.

- :class:`CpuBackend` (``backend="mujoco"``): every environment's state is a row of one array in
  shared memory; persistent worker processes, each with one ``MjData``, share out the rows of each
  step in small chunks and write the fields the task reads back to shared memory.
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
from collections.abc import Iterator, Sequence

import mujoco
import numpy as np
import torch

from myriad.utils.tensors import resolve_device

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
        self.device = resolve_device(device)
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


# What an env carries from one step to the next: MuJoCo's full physics state (time, qpos, qvel,
# act, ...), the solver's warm start and the controls. With the inputs a task never writes (applied
# forces, mocap, equality activations) left at their defaults, mj_setState of this state makes the
# next mj_step bit-for-bit the one the env's own MjData would take.
_STATE_SPEC = int(
    mujoco.mjtState.mjSTATE_FULLPHYSICS
    | mujoco.mjtState.mjSTATE_WARMSTART
    | mujoco.mjtState.mjSTATE_CTRL
)
# Envs per claim of a worker: small enough that the workers finish together (a claim of Ant is
# about 2 ms of physics), large enough that the claims' lock costs nothing measurable.
_MAX_CHUNK = 8
# Resets of up to this many envs run in the calling process: an Ant reset is about 20 us of
# physics, while a round of messages to the workers took about 2 ms on the loaded 2-core machine
# (one-off observation, 2026-11-24).
_LOCAL_RESETS = 16


def _state_slice(model: mujoco.MjModel, component: mujoco.mjtState) -> slice:
    """Columns of ``component`` (one bit) in a state vector of :data:`_STATE_SPEC`; components are
    laid out in the order of their bits."""
    bit = int(component)
    start = mujoco.mj_stateSize(model, _STATE_SPEC & (bit - 1))
    return slice(start, start + mujoco.mj_stateSize(model, bit))


def _array_shapes(model: mujoco.MjModel, num_envs: int, fields: Sequence[str]) -> dict:
    """Shapes of the batch arrays a :class:`_Stepper` reads and writes."""
    E = num_envs
    shapes = {name: (E, *_FIELD_SHAPES[name](model)) for name in fields}
    shapes.update(
        state=(E, mujoco.mj_stateSize(model, _STATE_SPEC)),
        time=(E,),
        diverged=(E,),
        reset_ids=(E,),  # env indices, stored as float64 like everything shared
        reset_qpos=(E, model.nq),
        reset_qvel=(E, model.nv),
    )
    return shapes


class _Stepper:
    """Steps any env of the batch on one ``MjData``: an env is a row of the batch state.

    ``arrays`` holds ``[E, ...]`` float64 views shared by the caller and every worker process:
    ``state [E, nstate]`` (see :data:`_STATE_SPEC`; the caller writes the controls into it), the
    fields, ``time``, ``diverged``, and the reset inputs ``reset_ids``, ``reset_qpos``,
    ``reset_qvel``. A step of env ``i`` loads row ``i`` into the stepper's ``MjData``, steps it,
    stores the row back and copies the fields out. The result is the one an ``MjData`` per env
    gives, bit for bit, but the memory the physics touches is one ``MjData``'s instead of one per
    env (for Ant in one process, 0.98-1.01x ``mujoco.rollout``'s rate against 0.88-0.93x with one
    ``MjData`` per env: one-off observation, 2026-11-24, 2-core CPU), and since no env is tied to
    a process, workers claim small chunks of envs from a shared counter until none are left: a
    worker that the OS deschedules, or that draws envs with more contacts, does not hold the
    others up at the end of the step.

    Args:
        counter, lock: the shared claim counter and its lock; ``None`` in the caller's process,
            which then steps all envs in order.
    """

    def __init__(
        self,
        model: mujoco.MjModel,
        frame_skip: int,
        fields: Sequence[str],
        arrays: dict[str, np.ndarray],
        counter=None,
        lock=None,
    ):
        self.model, self.frame_skip = model, frame_skip
        self.post_constraint = "cfrc_ext" in fields
        self.arrays, self.counter, self.lock = arrays, counter, lock
        self.data = d = mujoco.MjData(model)
        # Row views bound once: the step loop below runs per env and per step.
        self.rows = list(arrays["state"])
        # Fields computed by the step, copied out of the MjData per env: (source view in the
        # MjData, the shared array), bound once.
        self.derived = [(getattr(d, name), arrays[name]) for name in fields if name not in _ALWAYS]
        self.published = [
            (arrays[name], _state_slice(model, bit))
            for name, bit in (
                ("qpos", mujoco.mjtState.mjSTATE_QPOS),
                ("qvel", mujoco.mjtState.mjSTATE_QVEL),
            )
        ]
        self.time_column = _state_slice(model, mujoco.mjtState.mjSTATE_TIME).start
        # MuJoCo counts the bad states it reset by itself (then steps on from the reset state).
        self.warnings = d.warning.number
        self.bad = [int(w) for w in _DIVERGENCE_WARNINGS]

    def initialize(self) -> None:
        """Put every env in the state of a new ``MjData`` (the caller resets them before use)."""
        mujoco.mj_getState(self.model, self.data, self.rows[0], _STATE_SPEC)
        self.arrays["state"][1:] = self.rows[0]
        for src, dst in self.derived:
            dst[...] = src
        self.arrays["diverged"][...] = 0.0
        self._publish(slice(None))

    def _claims(self, total: int, chunk: int) -> Iterator[tuple[int, int]]:
        """Ranges ``[lo, hi)`` of ``range(total)`` for this process to do."""
        if self.counter is None:
            yield 0, total
            return
        while True:
            with self.lock:
                lo = self.counter.value
                self.counter.value = lo + chunk
            if lo >= total:
                return
            yield lo, min(lo + chunk, total)

    def _publish(self, rows: slice | list[int]) -> None:
        """Copy time, qpos and qvel of ``rows`` from the state into the shared arrays."""
        state = self.arrays["state"]
        self.arrays["time"][rows] = state[rows, self.time_column]
        for dst, columns in self.published:
            dst[rows] = state[rows, columns]

    def step(self, chunk: int) -> None:
        """Step every env of the batch (with other workers, the share this one claims)."""
        m, d, n, post = self.model, self.data, self.frame_skip, self.post_constraint
        spec = _STATE_SPEC
        derived, diverged, rows = self.derived, self.arrays["diverged"], self.rows
        w, (b0, b1, b2) = self.warnings, self.bad
        set_state, get_state, mj_step = mujoco.mj_setState, mujoco.mj_getState, mujoco.mj_step
        for lo, hi in self._claims(len(rows), chunk):
            diverged[lo:hi] = 0.0
            for i in range(lo, hi):
                row = rows[i]
                set_state(m, d, row, spec)
                mj_step(m, d, n)
                if post:
                    mujoco.mj_rnePostConstraint(m, d)
                get_state(m, d, row, spec)
                for src, dst in derived:
                    dst[i] = src
                if w[b0] or w[b1] or w[b2]:
                    diverged[i] = 1.0
                    w[b0] = w[b1] = w[b2] = 0
            self._publish(slice(lo, hi))

    def reset(self, count: int, chunk: int) -> None:
        """Reset the envs ``reset_ids[:count]`` to ``reset_qpos``/``reset_qvel`` (their rows) as
        Gymnasium does: ``mj_resetData``, write ``qpos``/``qvel``, ``mj_forward``."""
        m, d, a = self.model, self.data, self.arrays
        for lo, hi in self._claims(count, chunk):
            envs = a["reset_ids"][lo:hi].astype(np.int64).tolist()
            for i in envs:
                mujoco.mj_resetData(m, d)
                d.qpos[:] = a["reset_qpos"][i]
                d.qvel[:] = a["reset_qvel"][i]
                mujoco.mj_forward(m, d)
                mujoco.mj_getState(m, d, self.rows[i], _STATE_SPEC)
                for src, dst in self.derived:
                    dst[i] = src
                a["diverged"][i] = 0.0
            self._publish(envs)


def _serve(conn, model, frame_skip, fields, raw, shapes, counter, lock) -> None:  # pragma: no cover
    """Worker process: step its claims of envs on command until told to close."""
    arrays = {k: np.frombuffer(raw[k], dtype=np.float64).reshape(shapes[k]) for k in raw}
    stepper = _Stepper(model, frame_skip, fields, arrays, counter, lock)
    conn.send(("ok", None))
    while True:
        cmd, arg = conn.recv()
        if cmd == "close":
            conn.send(("ok", None))
            return
        try:
            getattr(stepper, cmd)(*arg)
            conn.send(("ok", None))
        except Exception as exc:  # reported to the caller, which raises
            conn.send(("error", f"{type(exc).__name__}: {exc}"))


class CpuBackend(PhysicsBackend):
    """CPU MuJoCo: the batch's states in shared memory, stepped by parallel worker processes.

    MuJoCo's bindings release the GIL inside ``mj_step``, but the per-env Python around it
    (state in, fields out) holds it: a thread pool over ``MjData`` measured 1.45x one thread on
    two cores. Instead worker processes step the envs, each on its own ``MjData``, reading
    states and controls from and writing states and fields into shared memory, so a step costs
    one message per worker, not per env; the workers share out the envs of each step in small
    chunks (see :class:`_Stepper`). Small batches run in the calling process, and so do resets
    of a few envs (up to ``_LOCAL_RESETS``), which cost less than a round of messages.

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
        shapes = _array_shapes(model, E, self.fields)
        self._conns: list = []
        self._procs: list = []
        self._counter = None
        if self.num_workers == 0:
            self._arrays = {k: np.zeros(shape) for k, shape in shapes.items()}
        else:
            methods = mp.get_all_start_methods()
            ctx = mp.get_context("fork") if "fork" in methods else mp.get_context("spawn")
            raw = {k: ctx.RawArray("d", int(np.prod(shape))) for k, shape in shapes.items()}
            self._arrays = {
                k: np.frombuffer(raw[k], dtype=np.float64).reshape(s) for k, s in shapes.items()
            }
        # Steps the envs in this process without workers; with them, sets up the initial state.
        self._local = _Stepper(model, self.frame_skip, self.fields, self._arrays)
        self._local.initialize()
        if self.num_workers:
            self._start_workers(ctx, raw, shapes)
        self._chunk = max(1, min(_MAX_CHUNK, E // (4 * max(1, self.num_workers))))
        ctrl_columns = _state_slice(model, mujoco.mjtState.mjSTATE_CTRL)
        self._ctrl = self._arrays["state"][:, ctrl_columns]
        self._tensors = {
            k: torch.from_numpy(self._arrays[k]) for k in (*self.fields, "time", "diverged")
        }
        self._refresh()
        self._finalizer = weakref.finalize(self, _shutdown, self._conns, self._procs)

    def _start_workers(self, ctx, raw: dict, shapes: dict[str, tuple[int, ...]]) -> None:
        self._counter = ctx.RawValue("q", 0)
        lock = ctx.Lock()
        for w in range(self.num_workers):
            parent, child = ctx.Pipe()
            args = (
                child,
                self.model,
                self.frame_skip,
                self.fields,
                raw,
                shapes,
                self._counter,
                lock,
            )
            proc = ctx.Process(target=_serve, args=args, daemon=True, name=f"myriad-mujoco-{w}")
            proc.start()
            child.close()
            self._conns.append(parent)
            self._procs.append(proc)
        self._wait(self._conns)

    def _wait(self, conns: list) -> None:
        for conn in conns:
            try:
                status, detail = conn.recv()
            except EOFError as exc:
                raise RuntimeError("a MuJoCo worker process died; see its stderr") from exc
            if status != "ok":
                raise RuntimeError(f"MuJoCo worker failed: {detail}")

    def _command(self, cmd: str, *arg) -> None:
        if not self._conns:
            getattr(self._local, cmd)(*arg)
            return
        # No worker runs between commands, so the counter can be rewound without the lock.
        assert self._counter is not None
        self._counter.value = 0
        for conn in self._conns:
            conn.send((cmd, arg))
        self._wait(self._conns)

    def _refresh(self) -> None:
        if self.device.type == "cpu":
            self._views = self._tensors
        else:
            self._views = {k: v.to(self.device) for k, v in self._tensors.items()}

    def diverged(self) -> torch.Tensor:
        return self._views["diverged"] > 0

    def step(self, ctrl: torch.Tensor) -> None:
        self._ctrl[...] = ctrl.detach().to("cpu", torch.float64).numpy()
        self._command("step", self._chunk)
        if self.device.type != "cpu":
            self._refresh()

    def reset_envs(self, mask: torch.Tensor, qpos: torch.Tensor, qvel: torch.Tensor) -> None:
        ids = np.flatnonzero(mask.detach().to("cpu").numpy())
        if ids.size == 0:
            return
        a = self._arrays
        a["reset_ids"][: ids.size] = ids
        a["reset_qpos"][...] = qpos.detach().to("cpu", torch.float64).numpy()
        a["reset_qvel"][...] = qvel.detach().to("cpu", torch.float64).numpy()
        if ids.size <= _LOCAL_RESETS:
            self._local.reset(int(ids.size), int(ids.size))
        else:
            chunk = max(1, min(_MAX_CHUNK, ids.size // (4 * max(1, self.num_workers))))
            self._command("reset", int(ids.size), chunk)
        if self.device.type != "cpu":
            self._refresh()

    def corrupt(self, env: int, qvel_value: float = float("nan")) -> None:
        """Write ``qvel_value`` into env ``env``'s velocities, as a diverging simulation would."""
        columns = _state_slice(self.model, mujoco.mjtState.mjSTATE_QVEL)
        self._arrays["state"][env, columns] = qvel_value

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
