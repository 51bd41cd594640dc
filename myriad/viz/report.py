"""``myriad report RUN``: one self-contained HTML page of a run.

The page embeds everything as base64 data URIs (no file next to it is needed, so it can be
attached to a message): the run's closing summary (``summary.json``), every figure in
``plots/`` (behaviour figures first), the population and member videos in ``videos/`` (and those
recorded during training), and the run's ``config.yaml``. Missing pieces are made first: the
videos (:func:`myriad.viz.render.render_run`) and the behaviour figures
(:mod:`myriad.viz.behaviour`), from one recording of the population.
"""

from __future__ import annotations

import base64
import html
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from myriad.utils.checkpoint import atomic_write_text
from myriad.utils.config import load_run_config, run_folder
from myriad.utils.digest import CONFIG_PREFIX, read_config_text, read_summary
from myriad.utils.ownership import claim_output
from myriad.utils.runlock import RunLock

MIME = {".png": "image/png", ".gif": "image/gif", ".mp4": "video/mp4"}
#: Training videos embedded at most (evenly spaced over the run, the last one included).
MAX_TRAINING_VIDEOS = 6
_PLOT_ORDER = ("behaviour_embedding", "behaviour_features", "behaviour_orientation", "coverage_map")

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2rem auto; max-width: 1400px; color: #222;
       padding: 0 1rem; }
h1 { font-size: 1.5rem; margin-bottom: 0.2rem; }
h2 { font-size: 1.15rem; border-bottom: 1px solid #ddd; padding-bottom: 0.2rem; margin-top: 2rem; }
.meta { color: #666; }
table { border-collapse: collapse; font-size: 0.9rem; }
td { padding: 0.15rem 0.8rem 0.15rem 0; vertical-align: top; }
td.key { color: #555; }
.gallery { display: flex; flex-wrap: wrap; gap: 1rem; align-items: flex-start; }
figure { margin: 0; }
figure img, figure video { max-width: 100%; border: 1px solid #ddd; }
figcaption { font-size: 0.85rem; color: #555; }
pre { background: #f6f6f6; padding: 0.8rem; overflow-x: auto; font-size: 0.8rem; }
""".strip()


def data_uri(path: str | os.PathLike[str]) -> str:
    """``data:<mime>;base64,...`` of a PNG, GIF or MP4 file."""
    path = Path(path)
    mime = MIME[path.suffix.lower()]
    return f"data:{mime};base64,{base64.b64encode(path.read_bytes()).decode('ascii')}"


def _media(path: Path, caption: str, width: int | None = None) -> str:
    size = f' style="max-width:{width}px"' if width else ""
    if path.suffix.lower() == ".mp4":
        element = (
            f'<video src="{data_uri(path)}" controls autoplay loop muted playsinline{size}></video>'
        )
    else:
        element = f'<img src="{data_uri(path)}" alt="{html.escape(caption)}"{size}>'
    return f"<figure>{element}<figcaption>{html.escape(caption)}</figcaption></figure>"


def _value(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, (Mapping, list)):
        return json.dumps(value, default=str)
    return str(value)


#: The closing report's headline rows: (label, summary key, nested key or None, format).
HEADLINE: tuple[tuple[str, str, str | None, str], ...] = (
    ("env steps", "env_steps", None, "{:,.0f}"),
    ("wall time", "wall_time_s", None, "{:.1f} s"),
    ("union coverage, all states visited", "coverage/cumulative_union", None, "{:.1%}"),
    ("union coverage, final population", "eval_coverage_union", None, "{:.1%}"),
    ("collective entropy, final population", "eval_entropy_collective", None, "{:.3f} nats"),
    ("diversity, final population", "eval_entropy_diversity", None, "{:.3f} nats"),
    ("leader success (deterministic)", "final_eval", "eval/leader_success", "{:.1%}"),
    ("leader return (deterministic)", "final_eval", "eval/leader_return", "{:.3f}"),
    ("initialised from", "init", "source", "{}"),
    ("pretrained member per member", "init", "mapping", "{}"),
)


def _row(key: str, value: str) -> str:
    return f'<tr><td class="key">{html.escape(key)}</td><td>{html.escape(value)}</td></tr>'


def _summary_table(summary: Mapping[str, Any]) -> str:
    """The closing summary: the headline numbers of the run, then the whole ``summary.json``
    folded away."""
    rows = []
    for label, key, nested, fmt in HEADLINE:
        value = summary.get(key)
        if nested is not None:
            value = value.get(nested) if isinstance(value, Mapping) else None
        if value is None:
            continue
        try:
            text = fmt.format(value)
        except (TypeError, ValueError):
            text = _value(value)
        rows.append(_row(label, text))
    parts = [f"<table>{''.join(rows)}</table>"] if rows else []
    full = json.dumps(summary, indent=2, sort_keys=True, default=str)
    parts.append(
        f"<details><summary>summary.json</summary><pre>{html.escape(full)}</pre></details>"
    )
    return "\n".join(parts)


def _plot_key(path: Path) -> tuple[int, str]:
    stem = path.stem
    return (_PLOT_ORDER.index(stem) if stem in _PLOT_ORDER else len(_PLOT_ORDER), stem)


def _videos(folder: Path) -> tuple[list[Path], list[Path], list[Path]]:
    """``(population videos, member videos, training videos)`` in a run's ``videos/``."""

    def media(d: Path) -> list[Path]:
        return sorted(p for p in d.glob("*") if p.suffix.lower() in (".mp4", ".gif"))

    found = media(folder) if folder.is_dir() else []
    grid = [p for p in found if p.stem == "population"]
    members = [p for p in found if p.stem.startswith("member_")]
    train = media(folder / "train") if (folder / "train").is_dir() else []
    if len(train) > MAX_TRAINING_VIDEOS:
        step = (len(train) - 1) / (MAX_TRAINING_VIDEOS - 1)
        train = [train[round(i * step)] for i in range(MAX_TRAINING_VIDEOS)]
    return grid, members, train


def _describe(config: Mapping[str, Any], summary: Mapping[str, Any]) -> str:
    env = config.get("env") or {}
    population = config.get("population") or {}
    if "objective" in config:
        kind = f"K-Myriad pretraining ({(config.get('objective') or {}).get('name', 'k-NN')})"
    else:
        kind = f"finetuning ({(config.get('algo') or {}).get('name', '?')})"
    parts = [
        kind,
        f"env {env.get('name', '?')}",
        f"{population.get('size', '?')} members",
        f"{summary.get('iterations', '?')} iterations",
    ]
    steps = summary.get("env_steps")
    if isinstance(steps, (int, float)):
        parts.append(f"{int(steps):,} env steps")
    return " · ".join(html.escape(str(p)) for p in parts)


#: Marks a page as written by ``myriad report``: only such a page is replaced without
#: ``--overwrite``.
GENERATOR = '<meta name="generator" content="myriad report">'


def is_report(path: Path) -> bool:
    """Whether ``path`` is a page written by ``myriad report``."""
    try:
        with open(path, "rb") as f:
            return GENERATOR.encode() in f.read(4096)
    except OSError:
        return False


def build_html(run_dir: Path) -> str:
    """The report page of ``run_dir`` from what the folder holds now."""
    config = load_run_config(run_dir)
    summary_file = run_dir / "summary.json"
    summary = read_summary(summary_file) if summary_file.is_file() else {}
    plots_dir = run_dir / "plots"
    plots = sorted(plots_dir.glob("*.png"), key=_plot_key) if plots_dir.is_dir() else []
    grid, members, train = _videos(run_dir / "videos")
    sections = [
        f"<h1>{html.escape(run_dir.name)}</h1>",
        f'<p class="meta">{_describe(config, summary)}</p>',
    ]
    if grid or members:
        sections.append("<h2>Population</h2>")
        sections.append(
            '<div class="gallery">'
            + "".join(_media(p, "all members, side by side") for p in grid)
            + "</div>"
        )
        if members:
            sections.append("<h2>Members</h2>")
            sections.append(
                '<div class="gallery">'
                + "".join(_media(p, f"member {int(p.stem.split('_')[1])}", 330) for p in members)
                + "</div>"
            )
    else:
        sections.append(
            "<h2>Population</h2><p>No videos: <code>myriad render RUN</code> records them.</p>"
        )
    if train:
        sections.append("<h2>During training</h2>")
        sections.append(
            '<div class="gallery">'
            + "".join(_media(p, p.stem.replace("_", " "), 480) for p in train)
            + "</div>"
        )
    sections.append("<h2>Summary</h2>")
    sections.append(_summary_table(summary) if summary else "<p>No summary.json.</p>")
    if plots:
        sections.append("<h2>Plots</h2>")
        sections.append(
            '<div class="gallery">' + "".join(_media(p, p.stem) for p in plots) + "</div>"
        )
    config_text = read_config_text(run_dir / "config.yaml")
    if config_text.startswith(CONFIG_PREFIX):
        config_text = config_text.partition("\n")[2]
    sections.append(f"<h2>Config</h2><pre>{html.escape(config_text)}</pre>")
    body = "\n".join(sections)
    return (
        "<!DOCTYPE html>\n"
        f'<html lang="en"><head><meta charset="utf-8">{GENERATOR}'
        f"<title>{html.escape(run_dir.name)}</title><style>{_STYLE}</style></head>\n<body>\n{body}\n</body></html>\n"
    )


def write_report(
    run: str | os.PathLike[str],
    out: str | os.PathLike[str] | None = None,
    *,
    render: bool = True,
    behaviour: bool = True,
    episodes: int = 1,
    fmt: str = "mp4",
    max_steps: int | None = None,
    device: str = "cpu",
    overwrite: bool = False,
) -> Path:
    """Write the report of ``run`` (a run folder or one of its checkpoints) to ``out`` (default
    ``<run>/report.html``); returns its path.

    Args:
        render: record the videos first when the run has no population video.
        behaviour: write the behaviour figures first when ``plots/`` has none.
        episodes, fmt, max_steps, device: of the recording made for the missing pieces.
        overwrite: replace an existing ``out`` that is not a report of myriad (never a run's
            own files).

    Raises:
        FileNotFoundError: ``run`` holds no run (``config.yaml``).
        OwnershipError: ``out`` is a file of a run, or exists and is not a report.
        ConfigError: the run's config or summary is unreadable or fails its check.
    """
    run_dir = run_folder(run)
    if not (run_dir / "config.yaml").is_file():
        raise FileNotFoundError(f"no run at {run}: expected a run folder holding config.yaml")
    target = Path(out) if out is not None else run_dir / "report.html"
    # Everything that can refuse is checked before anything is written into the run.
    claim_output(target, "report", overwrite=overwrite, made_by_command=is_report)
    load_run_config(run_dir)
    if (run_dir / "summary.json").is_file():
        read_summary(run_dir / "summary.json")
    grid, _, _ = _videos(run_dir / "videos")
    needs_videos = render and not grid
    needs_plots = behaviour and not (run_dir / "plots" / "behaviour_embedding.png").is_file()
    # Videos and plots go into the run: never while another process trains it.
    with RunLock(run_dir, "report"):
        if needs_videos or needs_plots:
            _make_missing(run_dir, needs_videos, needs_plots, episodes, fmt, max_steps, device)
        atomic_write_text(target, build_html(run_dir))
    return target


def _make_missing(
    run_dir: Path,
    videos: bool,
    plots: bool,
    episodes: int,
    fmt: str,
    max_steps: int | None,
    device: str,
) -> None:
    from myriad.rl.saved_population import load_population
    from myriad.viz.behaviour import behaviour_plots
    from myriad.viz.render import render_run
    from myriad.viz.runs import model_behaviour_plots

    title = f"{run_dir.name}"
    if videos:
        result = render_run(run_dir, episodes=episodes, fmt=fmt, max_steps=max_steps, device=device)
        if plots:
            from myriad.envs import make_from_config

            pre = load_population(run_dir)
            env = make_from_config(pre.env, 1, "cpu")
            spec = env.features
            env.close()
            features, member = result.recording.member_features()
            behaviour_plots(run_dir / "plots", features, member, spec, pre.model.num_members, title)
        return
    pre = load_population(run_dir)
    model_behaviour_plots(
        pre.model,
        pre.env,
        run_dir / "plots",
        seed=int(pre.config.get("seed", 0)),
        episodes=episodes,
        title=title,
        device=device,
        families=None,
    )
