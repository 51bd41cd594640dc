"""``myriad export-policy``: ONNX and TorchScript files that act as myriad's own policy."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest
import torch

from myriad.cli import main
from myriad.nn import PopulationActorCritic
from myriad.nn.activations import elu
from myriad.rl.saved_population import load_population
from myriad.tools.deploy import (
    DeployedPolicy,
    export_module,
    has_dynamo_onnx_export,
    reference_actions,
)
from myriad.utils.optional import MissingDependencyError

ort = pytest.importorskip("onnxruntime", reason="needs the export extra")

TOLERANCE = 1e-5
# TorchScript is what rsl_rl / Isaac Lab users deploy; torch 2.13 marks torch.jit deprecated.
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit:DeprecationWarning")


def _population(parameterization: str) -> PopulationActorCritic:
    torch.manual_seed(0)
    model = PopulationActorCritic(
        6, 3, 4, parameterization, actor_hidden=(32, 32), critic_hidden=(16,)
    )
    # Observation statistics far from (0, 1), so a normaliser left out would show.
    model.update_obs_norm(torch.randn(4096, 6) * torch.arange(1.0, 7.0) + 5.0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.3 * torch.randn_like(p))  # away from the small initial output layer
    return model


def _run_file(path, fmt: str, obs: torch.Tensor) -> torch.Tensor:
    if fmt == "onnx":
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        return torch.from_numpy(session.run(None, {"obs": obs.numpy()})[0])
    loaded = torch.jit.load(str(path))
    with torch.no_grad():
        return loaded(obs)


@pytest.mark.parametrize("fmt", ["onnx", "torchscript"])
@pytest.mark.parametrize("parameterization", ["shared_trunk", "embedding", "independent"])
def test_exported_policy_matches_myriad_policy(tmp_path, fmt, parameterization):
    model = _population(parameterization)
    member = 2
    path = export_module(DeployedPolicy(model, member), fmt, tmp_path / f"p.{fmt}")
    # Batch sizes other than the traced one (8), including one large enough for the chunked
    # MLP of myriad's own forward pass (more than 4,096 rows).
    for rows in (1, 37, 5000):
        obs = torch.randn(rows, 6) * 4.0 + 3.0
        got = _run_file(path, fmt, obs)
        expected = reference_actions(model, obs, member)
        assert got.shape == (rows, 3)
        assert torch.allclose(got, expected, atol=TOLERANCE, rtol=0), (got - expected).abs().max()
    # Some actions reach the clamp: the [-1, 1] bound is part of the exported graph.
    assert (expected.abs() == 1.0).any() and (expected.abs() < 1.0).any()


def test_fast_paths_stay_in_training_and_leave_traced_graphs():
    """Training runs the custom ELU; a traced graph holds torch's own ELU and no Python op."""
    x = torch.randn(64, 8, requires_grad=True)
    assert type(elu(x).grad_fn).__name__ == "_ELUBackward"
    model = _population("shared_trunk")
    traced = torch.jit.trace(DeployedPolicy(model, 0), torch.zeros(8, 6))
    graph = str(traced.inlined_graph)
    assert "aten::elu" in graph and "PythonOp" not in graph


def test_cli_exports_every_member_of_a_finetuning_run(tiny_cpo, tmp_path, capsys):
    saved = load_population(tiny_cpo)
    obs = torch.randn(50, saved.model.obs_dim) * 2.0
    for fmt, suffix in (("onnx", ".onnx"), ("torchscript", ".pt")):
        out = tmp_path / fmt
        argv = ["export-policy", str(tiny_cpo), "--format", fmt, "--member", "all"]
        assert main([*argv, "--out", str(out)]) == 0
        assert "member 0 (leader)" in capsys.readouterr().out
        meta = json.loads((out / "policy.json").read_text())
        assert meta["members"] == [0, 1, 2, 3] and meta["leader"] == 0
        assert meta["observation_space"]["shape"] == [saved.model.obs_dim]
        assert meta["action_space"] == {
            "shape": [saved.model.action_dim],
            "dtype": "float32",
            "low": -1.0,
            "high": 1.0,
        }
        assert meta["observation_normalizer"]["folded_in"] is True
        assert meta["myriad_version"]
        for m in meta["members"]:
            path = out / meta["files"][str(m)]
            assert path.suffix == suffix
            got = _run_file(path, fmt, obs)
            expected = reference_actions(saved.model, obs, m)
            np.testing.assert_allclose(got.numpy(), expected.numpy(), atol=TOLERANCE, rtol=0)
    # A second export into the same folder is refused without --overwrite (TorchScript: the
    # quicker export).
    assert main([*argv, "--out", str(out)]) == 2
    assert "--overwrite" in capsys.readouterr().err
    assert main([*argv, "--out", str(out), "--overwrite"]) == 0


def test_default_folder_and_leader(tiny_cpo, capsys):
    assert main(["export-policy", str(tiny_cpo), "--format", "torchscript"]) == 0
    meta = json.loads((tiny_cpo / "policy" / "torchscript" / "policy.json").read_text())
    assert meta["members"] == [0] and meta["files"] == {"0": "member_0.pt"}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--format", "onnx", "--member", "9"], "out of range: the population has 4 members"),
        (["--format", "onnx", "--member", "two"], "--member takes a member index"),
        (["--format", "tflite"], "invalid choice: 'tflite'"),
    ],
)
def test_bad_input_is_one_line(tiny_pretrain, tmp_path, capsys, args, message):
    try:
        code = main(["export-policy", str(tiny_pretrain.path), "--out", str(tmp_path), *args])
    except SystemExit as exc:  # argparse's own errors
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2 and message in err
    assert len(err.strip().splitlines()) == 1
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("package", ["onnx", "onnxscript"])
def test_missing_onnx_names_the_extra(monkeypatch, tmp_path, package):
    if package == "onnxscript" and not has_dynamo_onnx_export():
        pytest.skip("torch < 2.5 exports ONNX through its TorchScript exporter, without onnxscript")
    monkeypatch.setitem(sys.modules, package, None)  # as if not installed
    model = _population("shared_trunk")
    with pytest.raises(MissingDependencyError, match=r"myriad-rl\[export\]"):
        export_module(DeployedPolicy(model, 0), "onnx", tmp_path / "p.onnx")
