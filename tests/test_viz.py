"""Videos, behaviour plots and the HTML report (myriad.viz), on a tiny nav run and MuJoCo envs.

MuJoCo frames are rendered for real through headless OpenGL (EGL or OSMesa); the test set-up
(.ci/run) installs it, so these tests fail rather than skip where it is missing.
"""

import base64
import io
import json
import os
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import av
import numpy as np
import pytest
import scipy.stats
import torch

from myriad.cli import main
from myriad.envs import make
from myriad.envs.base import FeatureSpec
from myriad.nn.population import PopulationActorCritic
from myriad.viz.behaviour import behaviour_plots, classical_mds, member_energy_distances
from myriad.viz.gl import ensure_headless_gl
from myriad.viz.render import render_population, render_run
from myriad.viz.video import VideoWriter, read_video


@pytest.fixture(scope="module")
def nav_run(tiny_pretrain, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A private copy of the shared tiny pretraining run (four rooms, 4 members)."""
    return tiny_pretrain.copy(tmp_path_factory.mktemp("viz") / "run")


def nav_frame_size(layout_name: str) -> tuple[int, int]:
    """A nav frame's size from the layout: square cells of 320 // longest side pixels."""
    env = make("nav", 1, layout=layout_name)
    px = 320 // max(env.layout.width, env.layout.height)
    h, w = env.layout.height * px, env.layout.width * px
    return h + h % 2, w + w % 2


def test_nav_videos_have_the_expected_frames_and_size(nav_run):
    # max_steps below the time limit: no episode ends, so each has 1 + max_steps frames.
    result = render_run(nav_run, members=[0, 3], episodes=2, max_steps=6, seed=1)
    size = nav_frame_size("four_rooms")
    assert sorted(result.members) == [0, 3]
    for member in (0, 3):
        path = nav_run / "videos" / f"member_{member:02d}.mp4"
        frames = read_video(path)
        assert frames.shape == (2 * 7, *size, 3)
    grid = read_video(result.grid)
    # Two tiles side by side with a 2-pixel separator, one row.
    assert grid.shape == (2 * 7, size[0], 2 * size[1] + 2, 3)
    # The members' points move: the first and last frames differ.
    assert np.abs(grid[0].astype(int) - grid[6].astype(int)).max() > 100


def test_gif_decodes_with_its_frame_count(tmp_path):
    frames = np.zeros((9, 30, 41, 3), dtype=np.uint8)
    for t in range(9):
        frames[t, :, 4 * t : 4 * t + 4] = 255
    with VideoWriter(tmp_path / "bar.gif", fps=10) as writer:
        for f in frames:
            writer.append(f)
    decoded = read_video(tmp_path / "bar.gif")
    assert decoded.shape == (9, 30, 42, 3)  # odd width padded for H.264 and GIF alike
    assert np.abs(decoded[:, :, :41].astype(int) - frames).mean() < 8


def test_mujoco_frames_render_headless(tmp_path):
    platform = ensure_headless_gl()
    assert platform in ("egl", "osmesa") or os.environ.get("MUJOCO_GL") == platform
    env = make("mujoco-halfcheetah", 1, model="fast")
    model = PopulationActorCritic(env.obs_dim, env.action_dim, 2, actor_hidden=(8,))
    env.close()
    cfg = {"name": "mujoco-halfcheetah", "options": {"model": "fast"}}
    result = render_population(model, cfg, tmp_path, max_steps=3, fmt="gif")
    # HalfCheetah never terminates: 1 + 3 frames per member.
    for member in (0, 1):
        frames = read_video(tmp_path / f"member_{member:02d}.gif")
        assert frames.shape == (4, 240, 320, 3)
        assert frames[0].std() > 10  # a rendered scene, not a blank buffer
    grid = read_video(result.grid)
    assert grid.shape == (4, 240, 2 * 320 + 2, 3)


def test_energy_distance_matches_scipy_in_one_dimension():
    rng = np.random.default_rng(0)
    samples = [rng.normal(0, 1, 300), rng.normal(1, 2, 200), rng.uniform(-1, 3, 250)]
    x = np.concatenate(samples)[:, None]
    member = np.repeat([0, 1, 2], [300, 200, 250])
    d, used = member_energy_distances(x, member, 3)
    assert used == 300
    for i in range(3):
        for j in range(3):
            reference = scipy.stats.energy_distance(samples[i], samples[j])
            assert d[i, j] == pytest.approx(reference, abs=1e-9)


def test_energy_distance_in_two_dimensions_matches_projections():
    # |v| = (pi / 2) E_u |u . v| for u uniform on the circle, so the squared 2-D energy distance
    # is pi / 2 times the mean squared 1-D energy distance of the projections (scipy's).
    rng = np.random.default_rng(1)
    a = rng.normal(0, 1, (150, 2))
    b = rng.normal([1.0, 0.5], [1.0, 2.0], (120, 2))
    d, _ = member_energy_distances(np.concatenate([a, b]), np.repeat([0, 1], [150, 120]), 2)
    angles = (np.arange(2000) + 0.5) * np.pi / 2000
    directions = np.stack([np.cos(angles), np.sin(angles)], axis=1)
    projected = [scipy.stats.energy_distance(a @ u, b @ u) ** 2 for u in directions]
    assert d[0, 1] ** 2 == pytest.approx(np.pi / 2 * np.mean(projected), rel=1e-5)


def test_classical_mds_recovers_a_planar_configuration():
    rng = np.random.default_rng(2)
    points = rng.normal(size=(6, 2))
    distances = np.linalg.norm(points[:, None] - points[None], axis=-1)
    coords, share = classical_mds(distances)
    recovered = np.linalg.norm(coords[:, None] - coords[None], axis=-1)
    np.testing.assert_allclose(recovered, distances, atol=1e-9)
    assert share == pytest.approx(1.0)


def test_behaviour_plots_for_cube_orientations(tmp_path):
    # The hand's features: a unit quaternion and a position; member 1 turns the cube 90 degrees.
    spec = FeatureSpec(
        ("qw", "qx", "qy", "qz", "dx", "dy", "dz"),
        (0.0, -1.0, -1.0, -1.0, -0.2, -0.2, -0.2),
        (1.0, 1.0, 1.0, 1.0, 0.2, 0.2, 0.2),
    )
    rng = np.random.default_rng(3)
    upright = np.tile([1.0, 0.0, 0.0, 0.0], (200, 1)) + rng.normal(0, 0.02, (200, 4))
    tilted = np.tile([np.sqrt(0.5), np.sqrt(0.5), 0.0, 0.0], (200, 1)) + rng.normal(
        0, 0.02, (200, 4)
    )
    position = rng.normal(0, 0.01, (400, 3))
    features = np.concatenate([np.concatenate([upright, tilted]), position], axis=1)
    member = np.repeat([0, 1], 200)
    written = behaviour_plots(tmp_path, features, member, spec, 2, "hand")
    names = sorted(p.name for p in written)
    assert names == [
        "behaviour.json",
        "behaviour_embedding.png",
        "behaviour_features.png",
        "behaviour_orientation.png",
    ]
    record = json.loads((tmp_path / "behaviour.json").read_text())
    expected, _ = member_energy_distances(features, member, 2, spec)
    assert record["energy_distance"][0][1] == pytest.approx(expected[0, 1], abs=1e-6)
    assert record["energy_distance"][0][1] > 0.3  # a quarter turn is far apart


class _Media(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.sources: list[tuple[str, str]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        src = dict(attrs).get("src")
        if tag in ("img", "video") and src:
            self.sources.append((tag, src))


def test_report_embeds_plots_videos_summary_and_config(tiny_pretrain, tmp_path):
    nav_run = tiny_pretrain.copy(tmp_path / "run")
    assert main(["report", str(nav_run), "--max-steps", "5"]) == 0
    text = (nav_run / "report.html").read_text()
    parser = _Media()
    parser.feed(text)
    parser.close()
    images = [s for tag, s in parser.sources if tag == "img"]
    videos = [s for tag, s in parser.sources if tag == "video"]
    plots = sorted((nav_run / "plots").glob("*.png"))
    assert len(images) == len(plots) >= 3
    for src in images:
        assert src.startswith("data:image/png;base64,")
        assert base64.b64decode(src.split(",", 1)[1])[:8] == b"\x89PNG\r\n\x1a\n"
    # The population video and one per member, each a playable MP4.
    assert len(videos) == 1 + 4
    for src in videos:
        assert src.startswith("data:video/mp4;base64,")
        data = base64.b64decode(src.split(",", 1)[1])
        with av.open(io.BytesIO(data)) as container:
            assert sum(1 for _ in container.decode(video=0)) > 0
    assert 'src="http' not in text and "<link" not in text  # nothing outside the file
    assert "nav-four-rooms" in text and "population:" in text  # the config
    assert "collective entropy, final population" in text  # the closing summary
    assert (nav_run / "plots" / "behaviour_embedding.png").is_file()


def test_cli_render_and_bad_members(nav_run, tmp_path, capsys):
    out = tmp_path / "videos"
    code = main(
        [
            "render",
            str(nav_run),
            "--members",
            "1",
            "--max-steps",
            "3",
            "--out",
            str(out),
            "--format",
            "gif",
            "--deterministic",
        ]
    )
    assert code == 0
    assert read_video(out / "member_01.gif").shape[0] == 4
    assert read_video(out / "population.gif").shape[0] == 4
    code = main(["render", str(nav_run), "--members", "7", "--out", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1 and "0..3" in err[0]


def test_missing_opengl_names_the_debian_packages():
    code = (
        "from myriad.viz.gl import HeadlessGLError, ensure_headless_gl\n"
        "try:\n    ensure_headless_gl()\nexcept HeadlessGLError as e:\n    print(e)\n"
    )
    env = dict(os.environ, MUJOCO_GL="no-such-platform")
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 1
    assert "apt-get install libegl1 libegl-mesa0 libgl1-mesa-dri (egl)" in lines[0]
    assert "apt-get install libosmesa6 (osmesa)" in lines[0]
    assert "unset MUJOCO_GL=no-such-platform" in lines[0]


def test_recording_is_one_batched_call_per_step(monkeypatch):
    # All members act in one env batch: the population is called once per env step.
    from myriad.viz.rollout import record_episodes

    env = make("nav-empty", 3 * 2)
    model = PopulationActorCritic(env.obs_dim, env.action_dim, 3, actor_hidden=(8,))
    calls = []
    act = model.act
    monkeypatch.setattr(
        model, "act", lambda obs, *a, **k: calls.append(obs.shape) or act(obs, *a, **k)
    )
    rec = record_episodes(model, env, [0, 1, 2], 2, lambda e: e.pos.clone(), max_steps=5)
    assert calls == [torch.Size([6, env.obs_dim])] * 5
    assert rec.states.shape == (6, 6, 2)
    np.testing.assert_array_equal(rec.member, [0, 0, 1, 1, 2, 2])


def test_rendering_after_mujoco_was_imported_without_a_platform():
    # Training imports mujoco (with no MUJOCO_GL) long before a video is recorded; the platform
    # is then switched in the same process.
    code = (
        "import mujoco\n"
        "from myriad.viz.gl import ensure_headless_gl\n"
        "platform = ensure_headless_gl()\n"
        "m = mujoco.MjModel.from_xml_string(\"<mujoco><worldbody><light pos='0 0 2'/>"
        "<geom size='.1'/></worldbody></mujoco>\")\n"
        "d = mujoco.MjData(m)\n"
        "mujoco.mj_forward(m, d)\n"
        "r = mujoco.Renderer(m, 32, 32)\n"
        "r.update_scene(d)\n"
        "print(platform, r.render().max())\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("MUJOCO_GL", "PYOPENGL_PLATFORM")}
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    platform, brightest = done.stdout.split()
    assert platform in ("egl", "osmesa")
    assert int(brightest) > 50  # the lit sphere, not a black buffer


def test_gymnasium_mujoco_envs_render_from_their_qpos(tmp_path):
    env = make("gymnasium", 1, env_id="Ant-v5")
    model = PopulationActorCritic(env.obs_dim, env.action_dim, 1, actor_hidden=(8,))
    env.close()
    cfg = {"name": "gymnasium", "options": {"env_id": "Ant-v5"}}
    result = render_population(model, cfg, tmp_path, max_steps=2, per_member=False)
    frames = read_video(result.grid)
    assert frames.shape == (3, 240, 320, 3)
    assert frames[0].std() > 10


def test_training_records_videos_into_the_run_and_tensorboard(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from myriad.pretrain import pretrain

    run = tmp_path / "run"
    overrides = [
        "env=four_rooms",
        "num_envs=16",
        "num_steps=8",
        "population.size=2",
        "iterations=2",
        "checkpoint_every=0",
        "progress=false",
        "dataset.enabled=false",
        "env.options.max_episode_steps=12",
        "video.every=2",
        "video.max_steps=4",
        "plots=false",
    ]
    pretrain(overrides, run_dir=run, quiet=True)
    assert sorted(p.name for p in (run / "videos" / "train").iterdir()) == ["iter_000002.mp4"]
    assert read_video(run / "videos" / "train" / "iter_000002.mp4").shape[0] == 5
    events = EventAccumulator(str(run), size_guidance={"images": 0}).Reload()
    images = events.Images("videos/population")
    assert [image.step for image in images] == [2 * 16 * 8]  # env steps, as the scalars


def test_finetuning_on_mujoco_writes_behaviour_plots_and_videos(tmp_path):
    from myriad.finetune import finetune

    run = tmp_path / "run"
    overrides = [
        "env=ant",
        "task=native",
        "num_envs=4",
        "num_steps=4",
        "population.size=2",
        "population.actor_hidden=[16]",
        "population.critic_hidden=[16]",
        "algo.discriminator.hidden=[8]",
        "diagnostics.states_per_member=8",
        "iterations=1",
        "checkpoint_every=0",
        "progress=false",
        "env.options.max_episode_steps=6",
        "eval.every=0",
        "eval.episodes=1",
        "eval.final_episodes=2",
        "video.every=1",
        "video.max_steps=2",
        "video.format=gif",
    ]
    finetune("cpo", overrides, run_dir=run, quiet=True)
    assert read_video(run / "videos" / "train" / "iter_000001.gif").shape == (3, 240, 642, 3)
    record = json.loads((run / "plots" / "behaviour.json").read_text())
    assert record["feature_names"] == ["x", "y"]
    assert np.asarray(record["energy_distance"]).shape == (2, 2)
    assert (run / "plots" / "behaviour_features.png").is_file()
    # The finetuned population renders from its run folder and from one checkpoint file.
    checkpoint = next((run / "checkpoints").glob("iter_*.pt"))
    result = render_run(checkpoint, members=[1], max_steps=2, fmt="gif")
    assert result.grid == run / "videos" / "population.gif"
    assert read_video(run / "videos" / "member_01.gif").shape == (3, 240, 320, 3)


@pytest.mark.parametrize(
    ("video", "match"),
    [
        ({"every": 2, "format": "avi"}, "video.format must be one of mp4, gif"),
        ({"every": 2, "episodes": 0}, "video.every and video.episodes must be >= 1"),
        ({"every": -1}, "video.every and video.episodes must be >= 1"),
    ],
)
def test_bad_video_settings_are_config_errors(tmp_path, video, match):
    from myriad.utils.config import ConfigError
    from myriad.viz.runs import TrainingVideos

    cfg = {"env": {"name": "nav-empty", "options": {}}, "video": video}
    with pytest.raises(ConfigError, match=match):
        TrainingVideos.from_config(cfg, tmp_path)
    assert TrainingVideos.from_config({**cfg, "video": {"every": 0}}, tmp_path) is None


def test_goal_marker_has_no_members_colour():
    """The goal is drawn as a dark target, so it is never mistaken for a member's point."""
    import numpy as np

    from myriad.envs import make
    from myriad.utils.plotting import member_colors
    from myriad.viz.painters import NavPainter, to_rgb255

    env = make("nav-four-rooms", 2, task="sparse")
    colors = member_colors(10)
    painter = NavPainter(env, colors[:2])
    gx, gy = env.goal_set.cpu().tolist()[0]
    cy, cx = painter._pixel(np.array([[gx, gy]]))
    centre = painter.background[int(cy[0]), int(cx[0])]
    palette = {tuple(c) for c in to_rgb255(colors).tolist()}
    assert tuple(centre.tolist()) not in palette
    assert int(centre.max()) - int(centre.min()) < 10  # grey: no hue
