"""The ``myriad`` command: listing, checking, benchmarks, errors."""

import json

from myriad.cli import main


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
    assert row["env"] == "nav-maze" and row["num_envs"] == 256 and row["steps_per_s"] > 0


def test_doctor_reports_faiss(capsys):
    assert main(["doctor"]) == 0  # this environment has a working faiss-cpu
    assert "faiss: faiss-cpu" in capsys.readouterr().out
