"""`make gpu-bundle` and `scripts/gpu-check.sh`: the offline GPU check's wheels install into an
empty folder with no package index, and the check runs from them on a Python that has only
PyTorch and the usual scientific stack (the state of a typical CUDA node)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: What a CUDA node is assumed to have (scripts/gpu-bundle.sh): torch at the version CI uses.
BASELINE = ["torch==2.13.0", "numpy", "scipy", "h5py", "matplotlib", "pyyaml"]


def run(cmd: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, **kwargs)  # type: ignore[call-overload,no-any-return]


@pytest.mark.slow
def test_bundle_runs_the_check_without_network_on_a_bare_python(tmp_path: Path) -> None:
    bundle = tmp_path / "bundle"
    made = run(["bash", str(ROOT / "scripts/gpu-bundle.sh"), str(bundle)], cwd=ROOT)
    assert made.returncode == 0, made.stderr[-2000:]
    wheels = sorted(p.name for p in bundle.glob("*.whl"))
    assert any(w.startswith("hydra_core") for w in wheels)
    assert not any("faiss" in w or "warp" in w for w in wheels)  # built for one CUDA: not here
    total = sum(p.stat().st_size for p in bundle.glob("*.whl"))
    assert total < 40 * 2**20, f"bundle is {total / 2**20:.1f} MiB"
    assert "total" in (bundle / "MANIFEST.txt").read_text()

    venv = tmp_path / "node"
    assert run([sys.executable, "-m", "venv", str(venv)]).returncode == 0
    python = str(venv / "bin" / "python")
    base = run([python, "-m", "pip", "install", "-q", *BASELINE])
    assert base.returncode == 0, base.stderr[-2000:]
    # The bare node cannot run myriad: a dependency is missing.
    bare = run(
        [python, "-c", "import myriad.pretrain"],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert bare.returncode != 0 and "ModuleNotFoundError" in bare.stderr

    out = tmp_path / "gpu.json"
    env = {
        **os.environ,
        "GPU_BUNDLE": str(bundle),
        "GPU_TARGET": str(tmp_path / "target"),
        "PYTHON": python,
        "PIP_NO_INDEX": "1",  # no package index: everything comes from the bundle
    }
    env.pop("PYTHONPATH", None)
    check = run(
        [
            "bash",
            str(ROOT / "scripts/gpu-check.sh"),
            "--device",
            "cpu",
            "--small",
            "--out",
            str(out),
        ],
        cwd=ROOT,
        env=env,
    )
    assert check.returncode == 0, (check.stdout + check.stderr)[-3000:]
    payload = json.loads(out.read_text())
    assert payload["ok"] and payload["offline"]
    stages = payload["stages"]
    for name in ("nav_envs", "pretrain", "knn", "cpo_finetune"):
        assert stages[name]["status"] == "ok", (name, stages[name]["error"])
    assert stages["install_gpu"]["status"] == "skipped"
    assert stages["mujoco_warp"]["status"] == "skipped"
    assert (
        "mujoco_warp" in stages["mujoco_warp"]["error"] or "warp" in stages["mujoco_warp"]["error"]
    )
    assert stages["knn"]["figures"]["device_backend"] == "torch"  # no faiss in the bundle


def test_check_without_a_bundle_says_how_to_make_one(tmp_path: Path) -> None:
    proc = run(
        ["bash", str(ROOT / "scripts/gpu-check.sh")],
        env={**os.environ, "GPU_BUNDLE": str(tmp_path / "none")},
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"gpu-check: no wheels in {tmp_path / 'none'}/: run 'make gpu-bundle' on a machine with "
        "network and copy the folder here (or set GPU_BUNDLE)"
    ]
