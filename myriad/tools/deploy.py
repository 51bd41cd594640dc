"""``myriad export-policy``: a run's policies as deployable ONNX or TorchScript files.

Each exported file maps observations ``obs [batch, O]`` (float32) to actions ``[batch, A]``
(float32): the member's deterministic action (its Gaussian's mean) clamped to [-1, 1], as
myriad's envs clamp what they are given, with the observation normaliser (mean, standard
deviation, clip) folded into the graph. The batch dimension is dynamic. A ``policy.json`` beside
the files records the spaces, the member ids, the normaliser and the versions that wrote them.

The networks of :mod:`myriad.nn` trace through plain torch ops while a graph is exported
(:mod:`myriad.nn.tracing`), so the files hold standard operators only: ONNX files run in
onnxruntime, TorchScript files in ``torch.jit.load`` without myriad installed.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from myriad.nn.population import PopulationActorCritic

#: Export formats and their file suffixes.
FORMATS = {"onnx": ".onnx", "torchscript": ".pt"}
#: Name of the metadata file written beside the policies.
METADATA = "policy.json"
#: ONNX opset of exported graphs.
ONNX_OPSET = 18


class DeployedPolicy(nn.Module):
    """One member's deterministic policy as a self-contained module: ``obs [N, O] -> actions
    [N, A]`` in [-1, 1], normaliser included.

    Args:
        model: the population.
        member: the member to deploy.
    """

    obs_mean: torch.Tensor
    obs_std: torch.Tensor

    def __init__(self, model: PopulationActorCritic, member: int) -> None:
        super().__init__()
        single = model.extract_members([member]).eval()  # a population of one: one head
        self.actor = single.actor
        norm = single.obs_norm
        self.normalize = norm is not None
        # The normaliser's float64 statistics cast as the model casts them for float32 rows.
        mean = norm.mean if norm is not None else torch.zeros(model.obs_dim, dtype=torch.float64)
        std = norm.std if norm is not None else torch.ones(model.obs_dim, dtype=torch.float64)
        self.register_buffer("obs_mean", mean.to(torch.float32).clone())
        self.register_buffer("obs_std", std.to(torch.float32).clone())
        self.clip = float(norm.clip) if norm is not None and norm.clip is not None else None
        self.obs_dim, self.action_dim = model.obs_dim, model.action_dim

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        x = obs
        if self.normalize:
            x = (obs - self.obs_mean) / self.obs_std
            if self.clip is not None:
                x = x.clamp(-self.clip, self.clip)
        return self.actor.single(x, 0).clamp(-1.0, 1.0)


def reference_actions(model: PopulationActorCritic, obs: torch.Tensor, member: int) -> torch.Tensor:
    """What :class:`DeployedPolicy` computes, through myriad's own policy:
    ``model.act(obs, member, deterministic=True).actions`` clamped to [-1, 1]."""
    with torch.no_grad():
        return model.act(obs, member, deterministic=True).actions.clamp(-1.0, 1.0)


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Silence the ONNX exporter's progress prints and its log lines about operators of other
    libraries (torchvision's) it does not need."""
    logger = logging.getLogger("torch.onnx")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            yield
    finally:
        logger.setLevel(level)


def export_module(policy: DeployedPolicy, fmt: str, path: Path, batch: int = 8) -> Path:
    """Write ``policy`` to ``path`` as ``fmt`` (``"onnx"`` or ``"torchscript"``).

    Raises:
        MissingDependencyError: ONNX export without onnx / onnxscript installed.
    """
    import warnings

    from myriad.utils.checkpoint import atomic_write_bytes

    example = torch.zeros(batch, policy.obs_dim)
    policy = policy.eval()
    if fmt == "torchscript":
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # jit's deprecation notice
            traced = torch.jit.trace(policy, example)
        # Through memory: torch's file writer aborts the process (a C++ exception in a
        # destructor) when a write fails; Python's write raises an OSError naming the file.
        buffer = io.BytesIO()
        torch.jit.save(traced, buffer)
        atomic_write_bytes(path, buffer.getvalue())
        return path
    from myriad.utils.optional import require

    require("onnx", "export")
    # Under a temporary name, then renamed: a failed write leaves no half file, and its error
    # names the file (onnx's writer raises one without a file name).
    staging = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        if has_dynamo_onnx_export():
            require("onnxscript", "export")
            _export_onnx_dynamo(policy, example, staging)
        else:
            _export_onnx_torchscript(policy, example, staging)
        os.replace(staging, path)
    except OSError as exc:
        staging.unlink(missing_ok=True)
        if exc.filename:
            raise
        raise OSError(exc.errno, exc.strerror or str(exc), str(path)) from exc
    return path


def has_dynamo_onnx_export() -> bool:
    """Whether this torch's ``torch.onnx.export`` exports through ``torch.export`` with
    ``dynamic_shapes`` (torch >= 2.5; 2.4 has ``dynamo`` without them)."""
    import inspect

    return "dynamic_shapes" in inspect.signature(torch.onnx.export).parameters


def _export_onnx_dynamo(policy: nn.Module, example: torch.Tensor, path: Path) -> None:
    """ONNX export through ``torch.export`` (torch >= 2.5), the batch dimension dynamic."""
    import warnings

    dims = {"obs": {0: torch.export.Dim("batch")}}
    with _quiet(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(
            policy,
            (example,),
            input_names=["obs"],
            output_names=["actions"],
            dynamic_shapes=dims,
            opset_version=ONNX_OPSET,
            dynamo=True,
            verbose=False,
        )
    assert program is not None
    program.save(str(path))


def _export_onnx_torchscript(policy: nn.Module, example: torch.Tensor, path: Path) -> None:
    """ONNX export through torch's TorchScript-based exporter, for torch releases before 2.5
    (no ``dynamic_shapes``): the same graph, inputs and dynamic batch dimension."""
    import warnings

    with _quiet(), warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            policy,
            (example,),
            str(path),
            input_names=["obs"],
            output_names=["actions"],
            dynamic_axes={"obs": {0: "batch"}, "actions": {0: "batch"}},
            opset_version=ONNX_OPSET,
        )


def export_policy(
    source: str | os.PathLike[str],
    fmt: str,
    *,
    members: Sequence[int] | str = "leader",
    out: str | os.PathLike[str] | None = None,
    overwrite: bool = False,
) -> dict[str, Any]:
    """Export members of a run's (or checkpoint's) population; returns the metadata written to
    ``<out>/policy.json``.

    Args:
        source: a run folder, its ``checkpoints/`` folder or a checkpoint file.
        fmt: ``"onnx"`` or ``"torchscript"``.
        members: member indices, ``"all"`` or ``"leader"`` (the default: a finetuning run's
            leader, member 0 of a pretraining run).
        out: output folder (default ``RUN/policy/<fmt>``).
        overwrite: replace files of an earlier export.

    Raises:
        ConfigError: an unknown format or member.
        FileExistsError: an output file exists and ``overwrite`` is not set.
    """
    import myriad
    from myriad.rl.saved_population import load_population
    from myriad.tools.evaluate import default_output, member_indices, saved_leader
    from myriad.utils.checkpoint import atomic_write_text, load_checkpoint
    from myriad.utils.config import ConfigError
    from myriad.utils.runlock import lock_if_inside_a_run

    if fmt not in FORMATS:
        raise ConfigError(f"--format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    saved = load_population(source)
    model = saved.model.eval()
    leader = saved_leader(saved.config, load_checkpoint(saved.path).get("state") or {})
    size = model.num_members
    if members == "all":
        chosen = list(range(size))
    elif members == "leader":
        chosen = [leader if leader is not None else 0]
    else:
        chosen = member_indices(
            members, size, "--member", "pass an index in that range, leader or all"
        )
    folder = Path(out) if out is not None else default_output(source).parent / "policy" / fmt
    files = {m: folder / f"member_{m}{FORMATS[fmt]}" for m in chosen}
    targets = [*files.values(), folder / METADATA]
    existing = [str(p) for p in targets if p.exists()]
    if existing and not overwrite:
        raise FileExistsError(
            f"{existing[0]} exists: pass --overwrite to replace it, or --out for another folder"
        )
    # The files go into the run (RUN/policy/): never while another process trains it.
    with lock_if_inside_a_run(folder, "export-policy"):
        folder.mkdir(parents=True, exist_ok=True)
        for m, path in files.items():
            export_module(DeployedPolicy(model, m), fmt, path)
        norm = model.obs_norm
        metadata = {
            "format": fmt,
            "files": {str(m): p.name for m, p in files.items()},
            "members": chosen,
            "leader": leader,
            "population_size": size,
            "checkpoint": str(saved.path),
            "env": saved.env,
            "observation_space": {"shape": [model.obs_dim], "dtype": "float32"},
            "action_space": {
                "shape": [model.action_dim],
                "dtype": "float32",
                "low": -1.0,
                "high": 1.0,
            },
            "input": {"name": "obs", "shape": ["batch", model.obs_dim]},
            "output": {
                "name": "actions",
                "shape": ["batch", model.action_dim],
                "meaning": "the member's deterministic action (policy mean) clamped to [-1, 1]",
            },
            "observation_normalizer": (
                None
                if norm is None
                else {
                    "folded_in": True,
                    "mean": norm.mean.tolist(),
                    "std": norm.std.tolist(),
                    "clip": norm.clip,
                }
            ),
            "myriad_version": myriad.__version__,
            "torch_version": torch.__version__,
        }
        if fmt == "onnx":
            metadata["onnx_opset"] = ONNX_OPSET
        atomic_write_text(folder / METADATA, json.dumps(metadata, indent=2) + "\n")
    metadata["folder"] = str(folder)
    return metadata
