"""Video files (MP4 / GIF through PyAV) and the labelled grid of a population's members.

Frames are ``uint8`` arrays ``[H, W, 3]`` (RGB). MP4 is H.264 in ``yuv420p`` with the index at
the front of the file, so browsers play it from a data URI; GIF uses FFmpeg's fixed 8-bit
palette. Both are written one frame at a time, so a video never has to fit in memory.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np

from myriad.utils.config import ConfigError
from myriad.utils.optional import require

FORMATS: tuple[str, ...] = ("mp4", "gif")
_LABEL_BACKGROUND = np.array([20, 20, 20], dtype=np.float32)
_LABEL_ALPHA = 0.6
_SEPARATOR = np.array([40, 40, 40], dtype=np.uint8)


def check_format(fmt: str) -> str:
    """``fmt`` if it is one of :data:`FORMATS`, else a :class:`ConfigError` naming them."""
    if fmt not in FORMATS:
        raise ConfigError(f"video format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    return fmt


class VideoWriter:
    """Writes frames to an MP4 or GIF file (the format is the file's suffix).

    Args:
        path: output file, ``.mp4`` or ``.gif``.
        fps: frames per second.

    Frames must all have one size; odd sizes are padded by one pixel (H.264 needs even sizes).
    """

    def __init__(self, path: str | os.PathLike[str], fps: float) -> None:
        av = require("av", "viz")
        self.path = Path(path)
        fmt = check_format(self.path.suffix.lstrip(".").lower())
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.frames = 0
        self.size: tuple[int, int] | None = None
        options = {"movflags": "faststart"} if fmt == "mp4" else {}
        self._container = av.open(str(self.path), "w", options=options)
        rate = max(1, round(fps))
        if fmt == "mp4":
            codec = "libx264" if "libx264" in av.codecs_available else "mpeg4"
            self._stream = self._container.add_stream(codec, rate=rate)
            self._stream.pix_fmt = "yuv420p"
            if codec == "libx264":
                self._stream.options = {"crf": "23", "preset": "veryfast"}
        else:
            self._stream = self._container.add_stream("gif", rate=rate)
            self._stream.pix_fmt = "rgb8"
        self._av = av

    def append(self, frame: np.ndarray) -> None:
        """Add one frame ``[H, W, 3]`` uint8."""
        if frame.dtype != np.uint8 or frame.ndim != 3 or frame.shape[2] != 3:
            raise ValueError(f"frames must be uint8 [H, W, 3], got {frame.dtype} {frame.shape}")
        h, w = frame.shape[:2]
        if h % 2 or w % 2:
            frame = np.pad(frame, ((0, h % 2), (0, w % 2), (0, 0)), mode="edge")
        if self.size is None:
            self.size = (frame.shape[0], frame.shape[1])
            self._stream.height, self._stream.width = self.size
        elif frame.shape[:2] != self.size:
            raise ValueError(f"frame size {frame.shape[:2]} differs from the first {self.size}")
        video_frame = self._av.VideoFrame.from_ndarray(np.ascontiguousarray(frame), format="rgb24")
        for packet in self._stream.encode(video_frame):
            self._container.mux(packet)
        self.frames += 1

    def close(self) -> Path:
        """Flush the encoder and close the file; returns its path."""
        if self._container is not None:
            if self.frames:
                for packet in self._stream.encode(None):
                    self._container.mux(packet)
            self._container.close()
            self._container = None
        return self.path

    def __enter__(self) -> VideoWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def read_video(path: str | os.PathLike[str]) -> np.ndarray:
    """Every frame of a video file, ``[T, H, W, 3]`` uint8 (decoded with PyAV)."""
    av = require("av", "viz")
    with av.open(str(path)) as container:
        frames = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
    if not frames:
        raise ValueError(f"{path} holds no video frames")
    return np.stack(frames)


def grid_shape(count: int) -> tuple[int, int]:
    """``(rows, cols)`` of a grid for ``count`` tiles: ``floor(sqrt(count))`` rows, as many
    columns as needed (8 tiles: 2 x 4, wider than tall like a screen)."""
    rows = max(1, math.isqrt(count))
    return rows, math.ceil(count / rows)


def _label_patch(text: str, color: Sequence[float] | None, height: int) -> tuple[Any, Any]:
    """A text label ``[h, w, 3]`` and its opacity ``[h, w, 1]``: white text on a dark box,
    with a square of the member's colour in front when ``color`` is given."""
    from PIL import Image, ImageDraw, ImageFont

    try:
        font = ImageFont.load_default(size=height)
    except TypeError:  # Pillow without FreeType sizes
        font = ImageFont.load_default()
    probe = ImageDraw.Draw(Image.new("L", (1, 1)))
    # Pillow types the box as floats; FreeType and bitmap fonts measure whole pixels.
    left, top, right, bottom = (int(v) for v in probe.textbbox((0, 0), text, font=font))
    pad = max(2, height // 4)
    swatch = height if color is not None else 0
    w = right - left + 2 * pad + (swatch + pad if swatch else 0)
    h = max(bottom - top, swatch) + 2 * pad
    image = Image.new("RGB", (w, h), tuple(int(c) for c in _LABEL_BACKGROUND))
    alpha = Image.new("L", (w, h), int(255 * _LABEL_ALPHA))
    draw = ImageDraw.Draw(image)
    x = pad
    if swatch and color is not None:
        rgb = tuple(round(255 * float(c)) for c in color[:3])
        draw.rectangle((x, pad, x + swatch - 1, pad + swatch - 1), fill=rgb)
        x += swatch + pad
    draw.text((x - left, pad - top), text, fill=(255, 255, 255), font=font)
    text_mask = Image.new("L", (w, h), 0)
    ImageDraw.Draw(text_mask).text((x - left, pad - top), text, fill=255, font=font)
    if swatch:
        ImageDraw.Draw(text_mask).rectangle((pad, pad, pad + swatch - 1, pad + swatch - 1), 255)
    opacity = np.maximum(np.asarray(alpha, np.float32), np.asarray(text_mask, np.float32)) / 255
    return np.asarray(image, np.float32), opacity[..., None]


class GridComposer:
    """Tiles ``n`` equally sized frames into one labelled frame, row by row.

    Args:
        count: number of tiles ``n``.
        tile_size: ``(H, W)`` of one tile as painted.
        labels: one text per tile (e.g. ``"member 3"``), drawn in its top-left corner.
        colors: optional RGB(A) colour in ``[0, 1]`` per tile, shown as a swatch in the label.
        max_width: tiles are shrunk by an integer factor so that the grid is at most this wide.
    """

    def __init__(
        self,
        count: int,
        tile_size: tuple[int, int],
        labels: Sequence[str],
        colors: Sequence[Sequence[float]] | None = None,
        max_width: int = 1920,
    ) -> None:
        if len(labels) != count:
            raise ValueError(f"{count} tiles need {count} labels, got {len(labels)}")
        self.count = count
        self.rows, self.cols = grid_shape(count)
        h, w = tile_size
        self.factor = max(1, math.ceil(self.cols * (w + 2) / max_width))
        self.tile_h, self.tile_w = h // self.factor, w // self.factor
        gap = 2
        self.gap = gap
        height = self.rows * self.tile_h + (self.rows - 1) * gap
        width = self.cols * self.tile_w + (self.cols - 1) * gap
        self.size = (height + height % 2, width + width % 2)
        self._base = np.empty((*self.size, 3), dtype=np.uint8)
        self._base[...] = _SEPARATOR
        self._origins = [
            (r * (self.tile_h + gap), c * (self.tile_w + gap))
            for r in range(self.rows)
            for c in range(self.cols)
        ][:count]
        text_height = max(9, min(16, self.tile_h // 12))
        self._labels = [
            _label_patch(text, colors[i] if colors is not None else None, text_height)
            for i, text in enumerate(labels)
        ]

    def _shrink(self, tiles: np.ndarray) -> np.ndarray:
        """``[n, H, W, 3] -> [n, H / f, W / f, 3]`` by averaging ``f x f`` blocks."""
        f = self.factor
        tiles = tiles[:, : self.tile_h * f, : self.tile_w * f]
        if f == 1:
            return tiles
        n = tiles.shape[0]
        blocks = tiles.reshape(n, self.tile_h, f, self.tile_w, f, 3).astype(np.float32)
        return blocks.mean(axis=(2, 4)).round().astype(np.uint8)

    def compose(self, tiles: np.ndarray) -> np.ndarray:
        """One grid frame ``[GH, GW, 3]`` from ``tiles [n, H, W, 3]`` (uint8)."""
        if tiles.shape[0] != self.count:
            raise ValueError(f"expected {self.count} tiles, got {tiles.shape[0]}")
        small = self._shrink(tiles)
        out = self._base.copy()
        for (y, x), tile, (patch, opacity) in zip(self._origins, small, self._labels):
            out[y : y + self.tile_h, x : x + self.tile_w] = tile
            ph, pw = min(patch.shape[0], self.tile_h), min(patch.shape[1], self.tile_w)
            region = out[y : y + ph, x : x + pw].astype(np.float32)
            a = opacity[:ph, :pw]
            out[y : y + ph, x : x + pw] = (region * (1 - a) + patch[:ph, :pw] * a).round()
        return out
