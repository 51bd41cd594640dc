"""The ``myriad`` command: listing, checking, benchmarks, errors."""

import json
import time
from importlib import metadata

import pytest
import torch

from myriad.cli import main
from myriad.envs import make


def test_envs_lists_every_env(capsys):
    assert main(["envs"]) == 0
    out = capsys.readouterr().out
    for name in ("nav-maze", "nav-empty", "nav-two-rooms", "nav-four-rooms", "gymnasium"):
        assert name in out


def test_envs_check_ok_and_unknown(capsys):
    assert main(["envs", "check", "nav-u-maze", "--num-envs", "4"]) == 0
    assert "ok" in capsys.readouterr().out
    assert main(["envs", "check", "nav-mazee"]) == 2
    assert "Did you mean nav-maze" in capsys.readouterr().err


def test_a_negative_value_gets_told_to_follow_an_equals_sign(tmp_path, capsys):
    """``--goal -4,4`` reads as an option to argparse: the one line says how to pass it."""
    with pytest.raises(SystemExit):
        main(["dataset", "info", str(tmp_path / "d.hdf5"), "--goal", "-4,4"])
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--goal=-4,4" in err


def test_bench_envs_writes_json(tmp_path):
    out = tmp_path / "envs.json"
    code = main(
        [
            "bench",
            "envs",
            "--envs",
            "nav-maze",
            "--num-envs",
            "256",
            "--seconds",
            "0.05",
            "--out",
            str(out),
        ]
    )
    assert code == 0
    payload = json.loads(out.read_text())
    assert payload["machine"]["device"] == "cpu"
    (row,) = payload["results"]
    assert row["env"] == "nav-maze" and row["num_envs"] == 256
    assert row["step_ms"] == pytest.approx(1e3 * 256 / row["steps_per_s"])
    # Against a timing taken here of the same env, actions and size. The benchmark reports the
    # best of its repeats, so it may be faster than this one timing, but not by orders of
    # magnitude (a factor 20 leaves room for a busy machine; a unit slip is 1000).
    env = make("nav-maze", 256)
    env.reset(seed=0)
    actions = torch.rand(256, 2) * 2 - 1
    env.step(actions)
    steps, start = 50, time.perf_counter()
    for _ in range(steps):
        env.step(actions)
    reference = 256 * steps / (time.perf_counter() - start)
    assert reference / 20 < row["steps_per_s"] < reference * 20


def _installed(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def test_doctor_reports_faiss(capsys):
    """The doctor names the faiss distribution installed here (faiss-cpu by default, faiss-gpu
    after `make install-gpu`) and its version."""
    cpu, gpu = _installed("faiss-cpu"), _installed("faiss-gpu")
    if not (cpu or gpu) or (cpu and gpu):
        pytest.skip("needs exactly one of faiss-cpu and faiss-gpu installed")
    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert (f"faiss: faiss-gpu {gpu}," if gpu else f"faiss: faiss-cpu {cpu},") in out


@pytest.mark.parametrize(
    ("code", "preset", "expected"),
    [
        # Every command, a torchrun rank (python -m myriad) and a program importing myriad
        # first: idle OpenMP threads that spin briefly, then sleep, set before torch loads its
        # runtime.
        ("sys.argv = ['myriad', 'pretrain']; import myriad.cli", {}, ("PASSIVE", "10000")),
        (
            "sys.argv = ['myriad', 'finetune', '--algo', 'ppo']; import myriad.cli",
            {},
            ("PASSIVE", "10000"),
        ),
        ("sys.argv = ['myriad', 'render', 'runs/x']; import myriad.cli", {}, ("PASSIVE", "10000")),
        ("import myriad.finetune", {}, ("PASSIVE", "10000")),
        # The user's own policy and spin count stand.
        (
            "sys.argv = ['myriad', 'finetune']; import myriad.cli",
            {"OMP_WAIT_POLICY": "ACTIVE"},
            ("ACTIVE", None),
        ),
        ("import myriad.finetune", {"GOMP_SPINCOUNT": "0"}, ("PASSIVE", "0")),
        # torch first: its runtime kept libgomp's default, and the variables keep saying so.
        ("import torch; import myriad.finetune", {}, (None, None)),
    ],
)
def test_openmp_settings_are_set_once_for_every_entry_point(code, preset, expected):
    import os
    import subprocess
    import sys

    names = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")
    env = {k: v for k, v in os.environ.items() if k not in names} | preset
    probe = (
        f"import os, sys; {code}; from myriad.utils.process import apply_process_settings; "
        "s = apply_process_settings(); "
        "print(s.torch_loaded_first, os.environ.get('OMP_WAIT_POLICY'), "
        "os.environ.get('GOMP_SPINCOUNT'), s.openmp_wait_policy, s.openmp_spin_count)"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True
    ).stdout.split()
    shown = [str(v) for v in expected]
    assert out == [str(code.startswith("import torch")), *shown, *shown]
