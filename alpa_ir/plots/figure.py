"""The one place that creates and saves matplotlib figures (headless)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from alpa_ir.errors import AlpaError

FORMATS = (".png", ".svg")

STAGE_COLOURS = (
    "#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3", "#937860", "#DA8BC3", "#8C8C8C",
)  # fmt: skip


def stage_colour(stage: int) -> str:
    return STAGE_COLOURS[stage % len(STAGE_COLOURS)]


def new_figure(width: float, height: float) -> tuple[Any, Any]:
    """A figure and its axes, drawn without a display (the Agg canvas)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(figure)
    return figure, figure.add_subplot()


def save(figure: Any, path: str | os.PathLike[str]) -> Path:
    """Write ``figure`` to ``path`` (PNG or SVG, by its suffix)."""
    target = Path(path)
    if target.suffix.lower() not in FORMATS:
        raise AlpaError(f"picture {target}: the name must end in .png or .svg")
    if not target.parent.is_dir():
        raise AlpaError(f"picture {target}: folder {target.parent} does not exist")
    figure.savefig(target, dpi=120)
    return target
