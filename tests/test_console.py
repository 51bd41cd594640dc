"""The console block of a run: what it shows, when, and where (terminal or log file)."""

from __future__ import annotations

import io

import pytest

from myriad.cli import main
from myriad.utils.config import ConfigError
from myriad.utils.console import ConsoleReport, format_block


def test_block_shows_the_key_figures_of_each_kind_of_run():
    scalars = {
        "episode/return": 1.5,
        "episode/success": 0.25,
        "entropy/collective": 3.25,
        "coverage/union": 0.5,
        "cpo/kl/follower_1": 0.1,
        "cpo/kl/follower_10": 0.3,
        "cpo/kl/follower_2": 0.2,
        "train/value_loss": 0.125,
    }
    lines = format_block(scalars, 5, 20, 10_240, 65.0, 2048.4, eta_s=195.0)
    assert lines[0] == (
        "iteration 5/20 | 10,240 env steps | 2,048 steps/s | 1:05 elapsed, ETA 3:15"
    )
    text = "\n".join(lines)
    assert "return 1.500" in text and "success 25.0%" in text
    assert "collective 3.250" in text and "union 50.0%" in text
    # Followers in index order (2 before 10), each once.
    assert "followers 0.1 0.2 0.3" in text
    assert "value 0.125" in text
    # Figures a run does not log leave no empty line and no placeholder.
    assert not any(line.strip().endswith(("losses", "update", "evaluation")) for line in lines)
    assert "ETA" not in format_block(scalars, 20, 20, 1, 1.0, 1.0)[0]


def test_blocks_follow_the_clock_or_the_iteration_count():
    now = [0.0]
    out = io.StringIO()
    report = ConsoleReport(every_s=10.0, stream=out, clock=lambda: now[0])
    now[0] = 9.9
    assert not report.due(1)
    now[0] = 10.0
    assert report.due(2)
    report.block(format_block({"episode/return": 1.0}, 2, 4, 8, 10.0, 0.8))
    assert not report.due(3)  # the interval restarts at each block
    now[0] = 20.5
    assert report.due(3)
    assert out.getvalue().startswith("iteration 2/4 | 8 env steps")

    counted = ConsoleReport(every=3, every_s=0.0, stream=io.StringIO())
    assert [i for i in range(1, 10) if counted.due(i)] == [3, 6, 9]
    assert not ConsoleReport(every_s=0.0).due(100)  # 0 seconds: no blocks by time
    assert not ConsoleReport(enabled=False, every=1).due(1)
    with pytest.raises(ConfigError, match=r"console\.every"):
        ConsoleReport(every=-1)


def test_pretrain_writes_blocks_and_status_lines_into_a_log_file(tmp_path, capsys):
    """With stdout not a terminal (captured here, like a SLURM log), the blocks come as plain
    lines during training and every step after it says what it is doing."""
    code = main(
        [
            "pretrain",
            "env=empty",
            "iterations=3",
            "num_envs=32",
            "population.size=2",
            "console.every=2",
            "--run-dir",
            str(tmp_path / "run"),
        ]
    )
    assert code == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    blocks = [line for line in lines if line.startswith("iteration ")]
    # Every 2 iterations, and the last one always.
    assert [b.split(" | ")[0] for b in blocks] == ["iteration 2/3", "iteration 3/3"]
    assert "entropy" in out and "coverage" in out and "union" in out
    assert "\x1b[" not in out  # plain text in a file
    status = [line for line in lines if line.startswith("myriad: ")]
    assert status[0].startswith("myriad: training")
    assert any("final evaluation" in line for line in status)
    assert any("closing the dataset" in line for line in status)
    # The closing report comes after the last status line.
    assert out.index("K-Myriad pretraining finished") > out.index(status[-1])


def test_progress_false_prints_no_block(tmp_path, capsys):
    code = main(
        [
            "pretrain",
            "env=empty",
            "iterations=2",
            "num_envs=32",
            "population.size=2",
            "console.every=1",
            "progress=false",
            "plots=false",
            "--run-dir",
            str(tmp_path / "run"),
        ]
    )
    assert code == 0
    out = capsys.readouterr().out
    assert "iteration 1/2" not in out and "myriad: training" not in out
    assert "K-Myriad pretraining finished" in out
