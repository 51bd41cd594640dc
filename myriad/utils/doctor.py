"""``myriad doctor``: which optional components are installed, and whether faiss is sane.

faiss-cpu and faiss-gpu install the same ``faiss`` module. Having both distributions installed
means one overwrote the other's files, and uninstalling either later breaks the module; the doctor
detects this and prints the repair command.
"""

from __future__ import annotations

from importlib import metadata

from myriad.utils.optional import available

GPU_FAISS_FIX = (
    "pip uninstall -y faiss-cpu faiss-gpu && pip install --no-deps faiss-gpu   "
    "(or: make install-gpu)"
)


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def faiss_status() -> tuple[str, bool]:
    """One line on the faiss install and whether it is consistent."""
    cpu, gpu = _version("faiss-cpu"), _version("faiss-gpu")
    if cpu and gpu:
        return (
            f"faiss: BROKEN - both faiss-cpu {cpu} and faiss-gpu {gpu} are installed and share "
            f"one module; fix: {GPU_FAISS_FIX}",
            False,
        )
    if not (cpu or gpu):
        return "faiss: not installed (pip install faiss-cpu)", False
    try:
        import faiss
    except ImportError as exc:
        return f"faiss: installed but fails to import ({exc}); fix: {GPU_FAISS_FIX}", False
    gpus = faiss.get_num_gpus() if hasattr(faiss, "get_num_gpus") else 0
    kind = f"faiss-gpu {gpu}" if gpu else f"faiss-cpu {cpu}"
    return f"faiss: {kind}, {gpus} GPU(s) visible to faiss", True


def report() -> tuple[str, bool]:
    """The doctor's text and whether everything required is in order."""
    import torch

    from myriad import __version__

    lines = [f"myriad {__version__}", f"torch {torch.__version__}"]
    cuda = torch.cuda.is_available()
    lines.append(
        f"CUDA: {torch.cuda.get_device_name(0)}" if cuda else "CUDA: not available (CPU only)"
    )
    faiss_line, ok = faiss_status()
    lines.append(faiss_line)
    optional = {
        "mujoco": "core",
        "mujoco_warp": "gpu",
        "warp": "gpu",
        "ray": "ray",
        "minari": "offline",
        "d3rlpy": "offline",
        "onnx": "export",
        "onnxscript": "export",
        "onnxruntime": "export",
        "wandb": "wandb",
    }
    for module, extra in optional.items():
        state = "installed" if available(module) else f"missing (pip install 'myriad-rl[{extra}]')"
        lines.append(f"{module}: {state}")
    return "\n".join(lines), ok
