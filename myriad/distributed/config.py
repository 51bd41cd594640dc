"""Configuration of remote workers: where Ray runs, how many workers, and APS settings.

Two presets ship in ``myriad/configs/distributed``: ``local`` (Ray started inside the training
process on this machine) and ``cluster`` (connect to a running cluster, ``address: auto``).
:func:`load_config` reads a preset by name, a YAML path, or a mapping (for example the
``distributed`` node of a Hydra config).

The preset files are the commands' ``distributed`` group and hold what the commands read (``ray``
and ``workers``): ``myriad pretrain`` and ``myriad finetune`` run central inference, which has no
APS. The ``aps`` settings of each preset, for :class:`myriad.distributed.APSCollector` in your
own loop, are :data:`APS_PRESETS`; a YAML file or mapping may still carry an ``aps`` section
(run folders of earlier versions do).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from myriad.utils.optional import require


@dataclass
class RayConfig:
    """How to reach Ray.

    Attributes:
        address: ``None`` starts Ray in this process (embedded); ``"auto"`` joins the cluster
            this machine belongs to (``ray start --head`` / ``ray start --address=...``); or an
            explicit ``"host:port"`` / ``"ray://host:10001"``.
        num_cpus, num_gpus: resources of an embedded Ray (``None``: detect); ignored when
            joining a cluster.
        include_dashboard: start the dashboard (embedded Ray only).
        log_to_driver: forward worker stdout/stderr to this process.
        namespace: Ray namespace of the actors.
        runtime_env: Ray runtime environment (for example ``{"pip": [...]}``) for clusters whose
            nodes do not share this Python environment.
    """

    address: str | None = None
    num_cpus: int | None = None
    num_gpus: int | None = None
    include_dashboard: bool = False
    log_to_driver: bool = True
    namespace: str | None = "myriad"
    runtime_env: dict[str, Any] | None = None


@dataclass
class WorkerConfig:
    """The environment workers.

    Attributes:
        num_workers: ``W`` Ray actors; the E envs are split into W contiguous shards.
        cpus_per_worker, gpus_per_worker: resources reserved by each actor.
        device: torch device of the envs (and policy copy) inside each worker.
        max_restarts: restarts Ray grants each actor after it dies; a restarted worker is
            re-seeded and its lost step or batch redone or reported, never double counted.
        timeout_s: bound on every call to a worker; a call past it raises instead of hanging.
    """

    num_workers: int = 2
    cpus_per_worker: float = 1.0
    gpus_per_worker: float = 0.0
    device: str = "cpu"
    max_restarts: int = 3
    timeout_s: float = 120.0


@dataclass
class APSConfig:
    """Adaptive policy synchronisation (docs/algorithms.md §9).

    Attributes:
        delta: KL threshold in nats; 0 syncs after every update.
        horizon: steps ``T`` each worker acts per collected batch.
        max_lag: also sync a worker this many versions behind whatever its drift (``None``:
            KL alone decides). See :class:`myriad.distributed.AdaptiveSync`.
        kl_max_states: evaluate ``D_w`` on at most this many of the worker's states (evenly
            strided); ``None``: all of them.
    """

    delta: float = 0.01
    horizon: int = 64
    max_lag: int | None = None
    kl_max_states: int | None = None


#: The APS settings of each preset (:func:`load_config` adds them to the preset's file).
APS_PRESETS: dict[str, APSConfig] = {
    "local": APSConfig(delta=0.01, horizon=64, max_lag=None, kl_max_states=None),
    "cluster": APSConfig(delta=0.01, horizon=128, max_lag=None, kl_max_states=4096),
}


@dataclass
class DistributedConfig:
    """Everything :class:`myriad.distributed.RemoteVecEnv` and the APS collector need.

    The inference mode is chosen by the API, not by a key: ``RemoteVecEnv.step`` is central
    inference (workers only step, the learner computes the actions; what ``myriad pretrain`` and
    ``myriad finetune`` use), and :class:`myriad.distributed.APSCollector` on top of it is
    worker-side inference (workers hold a policy copy, APS synchronises the weights).
    """

    ray: RayConfig = field(default_factory=RayConfig)
    workers: WorkerConfig = field(default_factory=WorkerConfig)
    aps: APSConfig = field(default_factory=APSConfig)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> DistributedConfig:
        """Build from nested mappings; unknown keys are errors that name the accepted ones."""
        data = dict(data)
        sections = {"ray": RayConfig, "workers": WorkerConfig, "aps": APSConfig}
        if "mode" in data:
            # Saved run configs of earlier versions carry it: resuming them must keep working.
            warnings.warn(
                f"distributed.mode={data.pop('mode')!r} is ignored: myriad pretrain / finetune "
                "always run central inference (the learner computes the actions), and "
                "worker-side inference with APS is the APSCollector API (docs/distributed.md); "
                "remove the key",
                stacklevel=2,
            )
        _check_keys("distributed", data, list(sections))
        kwargs: dict[str, Any] = {}
        for name, cls_ in sections.items():
            section = dict(data.get(name) or {})
            _check_keys(f"distributed.{name}", section, [f.name for f in fields(cls_)])
            kwargs[name] = cls_(**section)
        return cls(**kwargs)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _check_keys(where: str, data: Mapping[str, Any], accepted: list[str]) -> None:
    unknown = sorted(set(data) - set(accepted))
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {unknown}; accepted: {accepted}")


def preset_names() -> list[str]:
    """Names of the shipped presets (``local``, ``cluster``)."""
    folder = resources.files("myriad") / "configs" / "distributed"
    return sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".yaml"))


def load_config(source: str | Path | Mapping[str, Any] = "local") -> DistributedConfig:
    """A :class:`DistributedConfig` from a preset name, a YAML file, or a mapping.

    Hydra / OmegaConf nodes are accepted as mappings (convert them with
    ``OmegaConf.to_container(node, resolve=True)`` first if they hold interpolations).
    """
    if isinstance(source, Mapping):
        return DistributedConfig.from_dict(source)
    path = Path(source)
    if not path.suffix:
        preset = resources.files("myriad") / "configs" / "distributed" / f"{source}.yaml"
        if not preset.is_file():
            raise FileNotFoundError(
                f"no distributed preset {str(source)!r}; presets: {preset_names()} "
                "(or pass a path to a YAML file)"
            )
        data = dict(yaml.safe_load(preset.read_text()) or {})
        data.setdefault("aps", asdict(APS_PRESETS.get(str(source), APSConfig())))
        return DistributedConfig.from_dict(data)
    return DistributedConfig.from_dict(yaml.safe_load(path.read_text()) or {})


def init_ray(config: RayConfig | None = None) -> bool:
    """Connect to Ray as ``config`` says, unless this process is already connected.

    Embedded (``address: null``): ``ray.init(num_cpus=..., include_dashboard=False)`` on this
    machine. Cluster: ``ray.init(address=...)``.

    Returns:
        True when this call started or joined Ray, False when Ray was already initialised (then
        ``config`` is not applied: the caller's own ``ray.init`` wins).
    """
    ray = require("ray", extra="ray")
    if ray.is_initialized():
        return False
    cfg = config or RayConfig()
    kwargs: dict[str, Any] = {
        "namespace": cfg.namespace,
        "log_to_driver": cfg.log_to_driver,
        "runtime_env": cfg.runtime_env,
    }
    if cfg.address is None:
        kwargs.update(
            num_cpus=cfg.num_cpus, num_gpus=cfg.num_gpus, include_dashboard=cfg.include_dashboard
        )
    else:
        kwargs["address"] = cfg.address
    ray.init(**{k: v for k, v in kwargs.items() if v is not None})
    return True
