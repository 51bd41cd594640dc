"""Log backends: TensorBoard and Weights & Biases (offline, the real package), env steps as the
x axis, the config at the start, exact resume of both."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from myriad.cli import main
from myriad.utils.config import ConfigError
from myriad.utils.loggers import parse_backends

TINY = [
    "env=empty",
    "num_envs=32",
    "num_steps=8",
    "population.size=2",
    "population.actor_hidden=[16]",
    "population.critic_hidden=[16]",
    "plots=false",
    "progress=false",
    "checkpoint_every=1",
    "env.options.max_episode_steps=10",
]
STEPS_PER_ITERATION = 32 * 8


def tensorboard_scalars(run: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run)).Reload()
    return {
        tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]
    }


def wandb_records(run: Path) -> tuple[list[dict], dict]:
    """History rows and config of the offline W&B run in ``run/wandb``, read from its
    ``.wandb`` file (a LevelDB-style log of protobuf records: 32 KiB blocks, 7-byte record
    headers of checksum, length and type: 1 full, 2 first, 3 middle, 4 last)."""
    from wandb.proto import wandb_internal_pb2 as pb

    (path,) = run.glob("wandb/offline-run-*/run-*.wandb")
    raw = path.read_bytes()
    assert raw[:4] == b":W&B"
    block, pos, parts, datas = 32768, 7, b"", []
    while pos + 7 <= len(raw):
        if block - pos % block < 7:
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", raw[pos : pos + 7])
        data, pos = raw[pos + 7 : pos + 7 + length], pos + 7 + length
        if kind == 1:
            datas.append(data)
        elif kind == 2:
            parts = data
        elif kind == 3:
            parts += data
        elif kind == 4:
            datas.append(parts + data)
    history, config = [], {}
    for data in datas:
        record = pb.Record()
        record.ParseFromString(data)
        kind = record.WhichOneof("record_type")
        if kind == "history":
            items = record.history.item
            history.append(
                {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in items}
            )
        elif kind == "config":
            updates = record.config.update
            config.update(
                {u.key or "/".join(u.nested_key): json.loads(u.value_json) for u in updates}
            )
    return history, config


def test_parse_backends():
    assert parse_backends("tensorboard") == ["tensorboard"]
    assert parse_backends("tensorboard+wandb") == ["tensorboard", "wandb"]
    assert parse_backends("none") == []
    with pytest.raises(ConfigError, match="choose tensorboard, wandb"):
        parse_backends("mlflow")


def test_tensorboard_and_wandb_at_once_with_env_steps_and_config(tmp_path):
    pytest.importorskip("wandb", reason="needs the wandb extra")
    run = tmp_path / "run"
    argv = ["pretrain", *TINY, "iterations=3", "logger=tensorboard+wandb", "--run-dir", str(run)]
    assert main(argv) == 0
    summary = json.loads((run / "summary.json").read_text())
    env_steps = [STEPS_PER_ITERATION * i for i in (1, 2, 3)]

    tb = tensorboard_scalars(run)
    assert [s for s, _ in tb["entropy/collective"]] == env_steps
    assert tb["entropy/collective"][-1][1] == pytest.approx(
        summary["scalars"]["entropy/collective"], rel=1e-6
    )
    assert [v for _, v in tb["perf/iteration"]] == [1.0, 2.0, 3.0]

    history, config = wandb_records(run)
    assert [h["env_steps"] for h in history] == env_steps
    assert [h["iteration"] for h in history] == [1, 2, 3]
    # The same values in both backends.
    for h, (_, v) in zip(history, tb["entropy/collective"]):
        assert h["entropy/collective"] == pytest.approx(v, rel=1e-6)
    assert config["objective"]["beta"] == 1.0 and config["num_envs"] == 32

    # The config as text and the per-member overlay layout in the TensorBoard events.
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run)).Reload()
    assert "config/text_summary" in events.Tags()["tensors"]
    raw = b"".join(p.read_bytes() for p in run.glob("events.out.tfevents.*"))
    assert b"custom_scalars__config__" in raw and b"entropy/(member|follower)" in raw


def test_resume_continues_the_wandb_run_and_the_curves(tmp_path):
    pytest.importorskip("wandb", reason="needs the wandb extra")
    run = tmp_path / "run"
    assert main(["pretrain", *TINY, "iterations=2", "logger=wandb", "--run-dir", str(run)]) == 0
    run_id = (run / "wandb_run_id").read_text()
    assert not list(run.glob("events.out.tfevents.*"))  # wandb only
    assert main(["pretrain", "--resume", str(run), "iterations=3", "logger=tensorboard+wandb"]) == 0
    assert (run / "wandb_run_id").read_text() == run_id
    assert len(list(run.glob("wandb/offline-run-*"))) == 2  # one folder per process, one id
    assert all(run_id.strip() in p.name for p in run.glob("wandb/offline-run-*"))
    # TensorBoard, added on resume, starts at the resumed iteration's env steps.
    tb = tensorboard_scalars(run)
    assert [s for s, _ in tb["entropy/collective"]] == [3 * STEPS_PER_ITERATION]


def test_training_videos_go_to_wandb_as_videos(tmp_path):
    pytest.importorskip("wandb", reason="needs the wandb extra")
    pytest.importorskip("av", reason="needs the viz extra")
    run = tmp_path / "run"
    argv = ["pretrain", *TINY, "iterations=2", "logger=wandb", "video.every=2"]
    assert main([*argv, "video.format=gif", "video.max_steps=4", "--run-dir", str(run)]) == 0
    history, _ = wandb_records(run)
    (row,) = [h for h in history if "videos/population/_type" in h]  # nested keys, flattened
    assert row["videos/population/_type"] == "video-file"
    assert row["env_steps"] == 2 * STEPS_PER_ITERATION
    assert list(run.glob("wandb/offline-run-*/files/media/videos/**/*.gif"))
    assert (run / "videos" / "train" / "iter_000002.gif").is_file()


def test_logger_none_and_bad_value(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["pretrain", *TINY, "iterations=1", "logger=none", "--run-dir", str(run)]) == 0
    assert not list(run.glob("events.out.tfevents.*")) and not (run / "wandb").exists()
    code = main(
        ["pretrain", *TINY, "iterations=1", "logger=mlflow", "--run-dir", str(tmp_path / "b")]
    )
    err = capsys.readouterr().err
    assert code == 2 and "logger='mlflow'" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "b").exists()


def test_plots_leave_out_scalars_that_were_always_zero(tmp_path):
    """A pretraining run on an env without a task reward logs returns that are 0 throughout:
    they get no panel (the title names them), and a group of such scalars no file."""
    from myriad.utils.logging import ScalarLogger

    logger = ScalarLogger(None)
    for it in range(1, 4):
        logger.log(it, {"episode/return": 0.0, "episode/length": 10.0 * it, "task/success": 0.0})
    written = {p.name for p in logger.plot(tmp_path)}
    assert written == {"episode.png"}
    assert not (tmp_path / "task.png").exists()
