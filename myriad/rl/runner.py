"""The runner base: the training loop, the run directory, checkpoints, logging and progress.

A run directory holds::

    config.yaml        the resolved config of the run
    checkpoints/       iter_NNNNNN.pt, written atomically
    events.out.tfevents.*   TensorBoard scalars
    plots/             one PNG per scalar group, written when ``learn`` returns
    summary.json       counters, throughput and the last value of every scalar

Subclasses implement :meth:`RunnerBase.iteration` and list their stateful objects in
:meth:`RunnerBase.state_objects`; the base owns :meth:`RunnerBase.learn`, checkpointing and
exact resumption.
"""

from __future__ import annotations

import abc
import os
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, ClassVar

import torch
from omegaconf import OmegaConf

from myriad.rl.roles import ProcessRole, SingleProcess
from myriad.utils.checkpoint import (
    CheckpointError,
    capture_rng_state,
    check_resume_config,
    checkpoint_path,
    library_versions,
    list_checkpoints,
    load_latest_checkpoint,
    remove_partial_checkpoints,
    restore_rng_state,
    save_checkpoint,
)
from myriad.utils.config import LOCK_NAME, output_folder, release_folder
from myriad.utils.console import ConsoleReport, format_block
from myriad.utils.digest import write_config_file
from myriad.utils.faults import fault_point
from myriad.utils.loggers import LogBackend, make_backends, parse_backends
from myriad.utils.logging import ScalarLogger, to_float
from myriad.utils.optional import require
from myriad.utils.runlock import RunLock


def plain_config(config: Any) -> Any:
    """A config (``DictConfig``, dataclass-free mappings, sequences) as plain Python values.

    Mappings become dicts, sequences lists, and anything that is not a number, string, bool or
    None its ``str``, so the result can go into YAML and into a ``weights_only`` checkpoint.
    """
    if OmegaConf.is_config(config):
        config = OmegaConf.to_container(config, resolve=True)
    if isinstance(config, Mapping):
        return {str(k): plain_config(v) for k, v in config.items()}
    if isinstance(config, (list, tuple)):
        return [plain_config(v) for v in config]
    if config is None or isinstance(config, (bool, int, float, str)):
        return config
    return str(config)


class RunnerBase(abc.ABC):
    """Owns the loop ``learn(num_iterations)`` and everything around it.

    Args:
        config: the run's resolved config (mapping or ``DictConfig``); written to
            ``config.yaml``, stored in checkpoints and compared on resume.
        run_dir: the run directory (created).
        progress: show a ``rich`` progress bar (only when stdout is a terminal).
        tensorboard: write TensorBoard events (False drops ``tensorboard`` from ``logger``).
        checkpoint_every: save every this many iterations (0: only when ``learn`` ends).
        keep_checkpoints: keep only the newest this many checkpoints (None: keep all).
        plots: write ``plots/`` when ``learn`` returns.
        console_every: iterations between blocks of key figures on stdout (0: by time).
        console_every_s: with ``console_every`` 0, seconds between blocks (0: no blocks). The
            blocks and status lines are printed when ``progress`` is on, on a terminal and
            into a log file alike (:mod:`myriad.utils.console`).
        logger: the log backends, ``tensorboard`` (default), ``wandb``, ``tensorboard+wandb``
            or ``none`` (:mod:`myriad.utils.loggers`); env steps are their x axis.
        wandb: options of the W&B backend (``project``, ``entity``, ``mode``, ``group``,
            ``tags``).
        role: how this process takes part in the run (:mod:`myriad.rl.roles`); a process
            that does not write shows no progress and writes no events, plots, summary or
            checkpoint, but builds every checkpoint with the writer (its collectives).
    """

    #: Dotted config keys (``fnmatch`` patterns) that may differ between a checkpoint and the
    #: config it is resumed with: run length, output, logging and display settings. Every other
    #: difference is an error, since it would silently change the experiment.
    RESUME_IGNORED_KEYS: ClassVar[tuple[str, ...]] = (
        "num_iterations",
        "*.num_iterations",
        "total_iterations",
        "*.total_iterations",
        "max_iterations",
        "*.max_iterations",
        "checkpoint_every",
        "*.checkpoint_every",
        "keep_checkpoints",
        "*.keep_checkpoints",
        "progress",
        "*.progress",
        "plots",
        "*.plots",
        "tensorboard",
        "*.tensorboard",
        "console",
        "console.*",
        "logger",
        "wandb",
        "wandb.*",
        "run_dir",
        "*.run_dir",
        "resume",
        "*.resume",
        "hydra.*",
        # Written by earlier versions, read by no runner (see DistributedConfig).
        "distributed.mode",
    )
    #: Names of earlier runner classes whose checkpoints this runner resumes.
    CHECKPOINT_NAMES: ClassVar[tuple[str, ...]] = ()

    def __init__(
        self,
        config: Mapping[str, Any] | Any,
        run_dir: str | os.PathLike[str],
        *,
        progress: bool = True,
        tensorboard: bool = True,
        checkpoint_every: int = 0,
        keep_checkpoints: int | None = None,
        plots: bool = True,
        console_every: int = 0,
        console_every_s: float = 10.0,
        logger: str = "tensorboard",
        wandb: Mapping[str, Any] | None = None,
        role: ProcessRole | None = None,
        log_backends: Sequence[LogBackend] = (),
    ) -> None:
        self.role: ProcessRole = role if role is not None else SingleProcess()
        #: Backends the writing process's scalars also go to, beyond those ``logger`` names (a
        #: tracker of the caller's own: :class:`~myriad.utils.loggers.LogBackend`).
        self.extra_log_backends: list[LogBackend] = list(log_backends)
        if not self.role.is_writer:
            progress = plots = tensorboard = False
        self.config: dict[str, Any] = plain_config(config if config is not None else {})
        self.run_dir = Path(run_dir)
        self.checkpoint_dir = self.run_dir / "checkpoints"
        self.plots_dir = self.run_dir / "plots"
        if self.role.is_writer:  # the other ranks of a launch never write the folder
            self.checkpoint_dir.mkdir(parents=True, exist_ok=True)
            remove_partial_checkpoints(self.checkpoint_dir)
        self.progress = progress
        self.tensorboard = tensorboard
        self.checkpoint_every = int(checkpoint_every)
        self.keep_checkpoints = keep_checkpoints
        self.plots = plots
        self.console = ConsoleReport(progress, console_every, console_every_s)
        self.log_backends = parse_backends(logger)  # checked here, before anything runs
        self.wandb_options = dict(wandb or {})
        if "wandb" in self.log_backends:
            require("wandb", "wandb")  # missing: one line before the run starts
        self.iteration_count = 0
        #: Processes the run is spread over (torchrun ranks); checkpoints resume with as many.
        self.world_size = self.role.world_size
        self.env_steps = 0
        self.wall_time = 0.0
        self._logger: ScalarLogger | None = None
        self._pending_history: dict[str, Any] | None = None
        # (iteration, env steps, perf_counter) at the last console block and when learn began.
        self._console_mark = self._console_start = (0, 0, time.perf_counter())

    # ---------------------------------------------------------------- for subclasses

    @abc.abstractmethod
    def iteration(self) -> Mapping[str, float | torch.Tensor]:
        """Run one training iteration; return the scalars to log for it."""

    @property
    def steps_per_iteration(self) -> int:
        """Environment steps per iteration (for throughput and ETA; 0 if not meaningful)."""
        return 0

    def state_objects(self) -> dict[str, Any]:
        """Named objects saved in checkpoints: anything with ``state_dict`` /
        ``load_state_dict`` (models, optimisers, algorithms, collectors) or a
        ``torch.Generator``. Python, NumPy and torch global RNG states are saved by the base."""
        return {}

    # ---------------------------------------------------------------- logging

    @property
    def logger(self) -> ScalarLogger:
        if self._logger is None:
            quiet = self.role.logger()
            self._logger = quiet if quiet is not None else self._own_logger()
            if self._pending_history is not None:
                self._logger.load_state_dict(self._pending_history)
                self._pending_history = None
        return self._logger

    def _own_logger(self) -> ScalarLogger:
        """The logger of the process that writes the run folder."""
        # The backends' x axis is env steps: a resumed run hides what the interrupted one
        # logged after its checkpoint.
        purge = self.env_steps + 1 if self.iteration_count else None
        names = [b for b in self.log_backends if b != "tensorboard" or self.tensorboard]
        backends = make_backends(
            names or "none", self.run_dir, purge_step=purge, wandb=self.wandb_options
        )
        return ScalarLogger(backends=[*backends, *self.extra_log_backends])

    def summary(self) -> dict[str, Any]:
        """Counters, throughput and versions, as written to ``summary.json``."""
        return {
            "iterations": self.iteration_count,
            "env_steps": self.env_steps,
            "wall_time_s": round(self.wall_time, 3),
            "steps_per_second": self.env_steps / self.wall_time if self.wall_time > 0 else None,
            "versions": library_versions(),
        }

    def write_summary(self) -> Path:
        if not self.role.is_writer:
            return self.run_dir / "summary.json"
        return self.logger.write_summary(self.run_dir / "summary.json", **self.summary())

    def status(self, text: str) -> None:
        """Say on stdout what the run is doing (a step that may take a while, such as the final
        evaluation or the plots), when ``progress`` is on."""
        self.console.enabled = self.progress
        self.console.status(text)

    def finish(self) -> dict[str, Any]:
        """End of training: write ``summary.json`` and return the summary. Runners with final
        evaluations or plots override it."""
        self.write_summary()
        return self.summary()

    # ---------------------------------------------------------------- the loop

    def learn(self, num_iterations: int) -> dict[str, float]:
        """Train until ``num_iterations`` iterations are complete in total.

        A resumed runner continues from its checkpoint's iteration count, so re-running the same
        command after an interruption finishes the planned run. Checkpoints are written every
        ``checkpoint_every`` iterations and at the end; ``summary.json`` and ``plots/`` are
        written when the loop ends (also on an error); ``config.yaml`` when it starts. Returns
        the last logged scalars.
        """
        # Written here rather than at construction, so a resume refused for a config mismatch
        # leaves the run's config.yaml describing its checkpoints.
        self.write_config()
        logger = self.logger
        logger.log_config(self.config)
        self.console.enabled = self.progress
        if self.iteration_count < num_iterations:
            self.status(
                f"training {self.run_dir}: iterations {self.iteration_count + 1}-{num_iterations}"
                f" of {self.steps_per_iteration:,} env steps each"
            )
        bar = _ProgressBar(self.progress, self.iteration_count, num_iterations)
        self.console.rich = bar.console
        reported = self.iteration_count
        # Speed over the iterations since the last block; time and ETA by the wall clock.
        self._console_mark = (self.iteration_count, self.env_steps, time.perf_counter())
        self._console_start = self._console_mark
        saved_at = -1
        failed = True
        try:
            while self.iteration_count < num_iterations:
                start = time.perf_counter()
                scalars = {k: to_float(v) for k, v in self.iteration().items()}
                elapsed = time.perf_counter() - start
                self.iteration_count += 1
                self.env_steps += self.steps_per_iteration
                self.wall_time += elapsed
                sps = self.steps_per_iteration / elapsed if elapsed > 0 else 0.0
                scalars["perf/iteration_time_s"] = elapsed
                scalars["perf/steps_per_second"] = sps
                scalars["perf/env_steps"] = float(self.env_steps)
                logger.log(self.iteration_count, scalars, env_steps=self.env_steps)
                bar.advance(sps)
                if self.console.due(self.iteration_count) or (
                    self.iteration_count == num_iterations and reported != num_iterations
                ):
                    self._console_block(logger.latest(), num_iterations)
                    reported = self.iteration_count
                if self.checkpoint_every and self.iteration_count % self.checkpoint_every == 0:
                    self.save_checkpoint()
                    saved_at = self.iteration_count
            if saved_at != self.iteration_count and self.iteration_count > 0:
                self.save_checkpoint()
            failed = False
        finally:
            bar.close()
            self.console.rich = None
            try:
                logger.flush()
                self.write_summary()
                if self.plots and logger.history:
                    self.status(f"writing the scalar plots into {self.plots_dir}")
                    logger.plot(self.plots_dir)
            except Exception:
                # After a failure (a full disk, say) the summary and plots may fail for the same
                # reason; the first error is the one to report.
                if not failed:
                    raise
        return logger.latest()

    def write_config(self) -> Path:
        """Write ``config.yaml`` (with its digest, see :mod:`myriad.utils.digest`); the writer
        of a launch alone does."""
        if not self.role.is_writer:
            return self.run_dir / "config.yaml"
        return write_config_file(self.run_dir / "config.yaml", self.config)

    def _console_block(self, scalars: Mapping[str, float], total: int) -> None:
        now = time.perf_counter()
        _, steps0, t0 = self._console_mark
        start_it, _, start_t = self._console_start
        sps = (self.env_steps - steps0) / (now - t0) if now > t0 else 0.0
        done = self.iteration_count - start_it
        eta = (now - start_t) / done * (total - self.iteration_count) if done else 0.0
        self.console.block(
            format_block(
                scalars, self.iteration_count, total, self.env_steps, now - start_t, sps, eta
            )
        )
        self._console_mark = (self.iteration_count, self.env_steps, now)

    def close(self) -> None:
        if self._logger is not None:
            self._logger.close()

    def __enter__(self) -> RunnerBase:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---------------------------------------------------------------- checkpoints

    def checkpoint(self) -> dict[str, Any]:
        """Everything needed to continue this run exactly."""
        state = {}
        for name, obj in self.state_objects().items():
            state[name] = obj.get_state() if isinstance(obj, torch.Generator) else obj.state_dict()
        return {
            "runner": type(self).__qualname__,
            "world_size": self.world_size,
            "iteration": self.iteration_count,
            "env_steps": self.env_steps,
            "wall_time": self.wall_time,
            "config": self.config,
            "rng": capture_rng_state(),
            "state": state,
            "logger": self.logger.state_dict(),
        }

    def save_checkpoint(self, path: str | os.PathLike[str] | None = None) -> Path:
        """Atomically write a checkpoint (default ``checkpoints/iter_NNNNNN.pt``) and prune."""
        target = Path(path) if path else checkpoint_path(self.checkpoint_dir, self.iteration_count)
        payload = self.checkpoint()  # on every process: it may hold collectives
        if not self.role.is_writer:
            return target
        save_checkpoint(target, payload)
        fault_point("checkpoint.saved")
        if self.keep_checkpoints:
            for old in list_checkpoints(self.checkpoint_dir)[: -self.keep_checkpoints]:
                old.unlink(missing_ok=True)
        return target

    def resume(self, path: str | os.PathLike[str]) -> Path:
        """Restore the state saved at ``path`` (a checkpoint, a run or a checkpoints directory).

        Raises:
            ConfigMismatchError: the config differs from the checkpoint's outside
                :attr:`RESUME_IGNORED_KEYS` (the message lists each differing key).
            CheckpointError: the checkpoint is unreadable, of another runner, or lacks state
                for one of :meth:`state_objects`. An unreadable newest checkpoint of a run
                folder is skipped (with a warning) for the newest readable one.
        """
        source, payload = load_latest_checkpoint(path)
        saved_world = int(payload.get("world_size", 1))
        if saved_world != self.world_size:
            launch = f"torchrun --nproc_per_node={saved_world} -m " if saved_world > 1 else ""
            raise CheckpointError(
                f"{source} was written by {saved_world} process(es), this run has "
                f"{self.world_size}: resume it with as many ({launch}myriad ... --resume RUN)"
            )
        written_by = payload.get("runner")
        if written_by is not None and written_by not in (
            type(self).__qualname__,
            *self.CHECKPOINT_NAMES,
        ):
            raise CheckpointError(
                f"{source} was written by {written_by}, not {type(self).__qualname__}: resume it "
                "with the command that created it (myriad pretrain / myriad finetune --resume)"
            )
        check_resume_config(payload["config"], self.config, self.RESUME_IGNORED_KEYS, source)
        objects = self.state_objects()
        missing = sorted(set(objects) - set(payload["state"]))
        if missing:
            raise CheckpointError(
                f"{source} holds no state for {missing}; it was written by "
                f"{written_by or 'another runner'} with another config"
            )
        # Counters first: some state (the dataset) depends on the iteration it was saved at.
        self.iteration_count = int(payload["iteration"])
        self.env_steps = int(payload["env_steps"])
        self.wall_time = float(payload["wall_time"])
        for name, obj in objects.items():
            if isinstance(obj, torch.Generator):
                obj.set_state(payload["state"][name])
            else:
                obj.load_state_dict(payload["state"][name])
        if self._logger is not None:
            self._logger.close()
            self._logger = None
        self._pending_history = payload["logger"]
        restore_rng_state(payload["rng"])
        self.role.after_resume()
        return source


def build_runner(factory: Callable[[Path], RunnerBase], folder: Path, new_run: bool) -> RunnerBase:
    """``factory(folder)``; if a new run's runner cannot be built (a bad config found late),
    its folder is removed again when it holds no file, so refused runs leave nothing behind."""
    try:
        return factory(folder)
    except BaseException:
        if new_run:
            release_folder(folder)
        raise


def train_in_folder(
    kind: str,
    name: str,
    cfg: Mapping[str, Any],
    factory: Callable[[Mapping[str, Any], Path], RunnerBase],
    *,
    resume: str | os.PathLike[str] | None = None,
    run_dir: str | os.PathLike[str] | None = None,
    overwrite: bool = False,
    start: Callable[[Any], Any] | None = None,
) -> tuple[dict[str, Any], Path]:
    """A whole run of one process: claim its folder (:func:`output_folder`) and its lock
    (:class:`~myriad.utils.runlock.RunLock`), build the runner with ``factory(cfg, folder)``,
    train until ``cfg["iterations"]`` and finish. Returns the summary and the folder.

    A new run writes ``config.yaml`` as soon as its runner is built, so a run killed at any
    moment after that (during ``--init``'s ranking, before its first checkpoint) is continued
    by ``--resume RUN``. A failed write (a full disk, a permission) is reported naming the file
    and that command."""
    folder = output_folder(kind, name, cfg, resume, run_dir, overwrite)
    lock = lock_run(folder, kind, new_run=resume is None)
    try:
        set_torch_threads(cfg)
        runner = build_runner(lambda f: factory(cfg, f), folder, new_run=resume is None)
        with reported_failures(folder, f"myriad {kind} --resume {folder}", resume is None):
            if resume is None:
                runner.write_config()
            return run_to_completion(runner, int(cfg["iterations"]), resume, start), folder
    finally:
        lock.release()


def lock_run(folder: Path, kind: str, new_run: bool) -> RunLock:
    """Take the lock of the run folder ``folder`` for ``kind`` (one process of a run does: the
    writer), saying so on stderr when it takes over the lock of a process that has ended. A
    new run's folder is removed again when the lock is refused.

    Raises:
        RunInUseError: another live process holds it (the message names its PID).
    """
    try:
        lock = RunLock(folder, kind).acquire()
    except BaseException:
        if new_run:
            release_folder(folder)
        raise
    if lock.took_over is not None:
        print(
            f"myriad: note: took over the lock of {folder} from process {lock.took_over}, "
            "which has ended",
            file=sys.stderr,
        )
    return lock


@contextmanager
def reported_failures(folder: Path, next_command: str, new_run: bool) -> Iterator[None]:
    """Around the training of the run in ``folder``: a failed write (a full disk, a permission)
    becomes a :class:`RunWriteError` naming the file and ``next_command``; a new run refused
    before it wrote anything but its config (an ``--init`` that does not fit, say) leaves no
    folder, so the corrected command can use it again."""
    try:
        yield
    except OSError as exc:
        message = write_failure(exc, next_command)
        if message is None:
            raise
        raise RunWriteError(message) from exc
    except Exception:
        if new_run and not _has_checkpoint(folder):
            _forget_config(folder)
        raise


def _forget_config(folder: Path) -> None:
    """Remove ``config.yaml`` and then the folder, when they are all a refused run wrote."""
    ours = (folder / "config.yaml", folder / LOCK_NAME)
    if not any(p.is_file() and p not in ours for p in folder.rglob("*")):
        (folder / "config.yaml").unlink(missing_ok=True)
        release_folder(folder)


class RunWriteError(OSError):
    """A run could not write a file; the message names the file and the command to continue."""


def write_failure(exc: OSError, next_command: str) -> str | None:
    """A failed write (a full disk, a write limit, a permission) in one sentence: the file, the
    reason, what to do and the command to run next; None for other errors."""
    import errno

    if isinstance(exc, RunWriteError):
        return str(exc)
    cause = exc.__cause__ if isinstance(exc.__cause__, OSError) else None
    code = exc.errno if exc.errno is not None else (cause.errno if cause else None)
    if code in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        fix = "free disk space (or raise the limit)"
    elif code in (errno.EACCES, errno.EPERM, errno.EROFS):
        fix = "make it writable"
    else:
        return None
    filename = exc.filename or (cause.filename if cause else None)
    if exc.strerror and filename:
        what = f"writing {filename} failed: {exc.strerror}"
    else:
        what = str(exc).strip().splitlines()[0]
        if filename and str(filename) not in what:
            what += f" ({filename})"
    return f"{what}; {fix}, then run: {next_command}"


def run_to_completion(
    runner: RunnerBase,
    iterations: int,
    resume: str | os.PathLike[str] | None = None,
    start: Callable[[Any], Any] | None = None,
) -> dict[str, Any]:
    """Resume ``runner`` from ``resume`` (or call ``start(runner)``, e.g. an initialisation),
    train until ``iterations`` and return :meth:`RunnerBase.finish`'s summary; the runner is
    closed whatever happens.

    A run folder given as ``resume`` that holds no checkpoint yet (the run was stopped before
    its first one) starts again from its saved config: ``start`` runs, and the run trains from
    iteration 0, as the interrupted start would have."""
    try:
        if resume is not None and not _has_checkpoint(Path(resume)):
            print(
                f"myriad: note: {runner.run_dir} was stopped before its first checkpoint; "
                "starting it again from its saved config",
                file=sys.stderr,
            )
            resume = None
        if resume is not None:
            runner.resume(resume)
        elif start is not None:
            start(runner)
        runner.learn(iterations)
        return runner.finish()
    finally:
        runner.close()


def _has_checkpoint(resume: Path) -> bool:
    """Whether ``resume`` is a checkpoint file or a folder holding one."""
    if resume.is_file():
        return True
    return bool(list_checkpoints(resume / "checkpoints") or list_checkpoints(resume))


def set_torch_threads(config: Mapping[str, Any]) -> None:
    """Apply ``torch_threads`` from a run config (0 or missing: torch's default)."""
    threads = int(config.get("torch_threads") or 0)
    if threads > 0:
        torch.set_num_threads(threads)


class _ProgressBar:
    """A ``rich`` bar with iterations, steps/s, elapsed time and ETA; inert when disabled or
    when stdout is not a terminal."""

    def __init__(self, enabled: bool, done: int, total: int) -> None:
        self._progress = None
        if not enabled or total <= done:
            return
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        console = Console()
        if not console.is_terminal:
            return
        self._progress = Progress(
            TextColumn("[bold]iterations"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[sps]:>10,.0f} steps/s"),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            console=console,
        )
        self._task = self._progress.add_task("train", total=total, completed=done, sps=0.0)
        self._progress.start()

    @property
    def console(self) -> Any:
        """The bar's rich console while the bar is shown (lines printed through it appear
        above the bar), else None."""
        return self._progress.console if self._progress is not None else None

    def advance(self, steps_per_second: float) -> None:
        if self._progress is not None:
            self._progress.update(self._task, advance=1, sps=steps_per_second)

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
