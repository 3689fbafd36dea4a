"""The pipeline timeline: a Gantt chart with one row per stage (its mesh), a
bar per forward, backward and apply-grad run of each micro-batch, and a bar
per transfer between meshes; a measured run, if given, in a second lane of
each row on the same time axis."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from alpa_ir.backends.simulate import SimResult
from alpa_ir.plots.figure import new_figure, save, stage_colour

PHASE_SHADE = {"forward": 1.0, "backward": 0.6, "apply_grad": 0.3}
LANE = 0.38  # height of a lane; a row holds the simulated and the measured lane


@dataclass(frozen=True)
class TimelineDrawing:
    """What was drawn: the file, bars per kind, and the time axis's end."""

    path: Path
    runs: int
    transfers: int
    measured_runs: int
    end: float


def _shade(colour: str, factor: float) -> tuple[float, float, float]:
    from matplotlib.colors import to_rgb

    r, g, b = to_rgb(colour)
    return (1 - factor * (1 - r), 1 - factor * (1 - g), 1 - factor * (1 - b))


def _lane(ax: Any, result: SimResult, base: float, prefix: str) -> tuple[int, int]:
    runs = transfers = 0
    for task in result.timeline:
        colour = _shade(stage_colour(task.stage), PHASE_SHADE.get(task.phase, 0.5))
        mb = "" if task.micro_batch is None else str(task.micro_batch)
        y = task.stage + base
        ax.broken_barh(
            [(task.start, task.end - task.start)], (y, LANE), facecolors=colour,
            edgecolor="black", linewidth=0.5, gid=f"{prefix}run-{task.stage}-{task.phase}-{mb}",
        )  # fmt: skip
        if mb and task.end > task.start:
            ax.text((task.start + task.end) / 2, y + LANE / 2, mb, ha="center", va="center",
                    fontsize=7)  # fmt: skip
        runs += 1
    for t in result.transfers:
        y = (t.src + t.dst) / 2 + base + LANE / 2 - 0.05
        mb = "" if t.micro_batch is None else str(t.micro_batch)
        ax.broken_barh(
            [(t.start, max(t.end - t.start, 0.0))], (y, 0.1), facecolors="black",
            gid=f"{prefix}transfer-{t.src}-{t.dst}-{mb}",
        )  # fmt: skip
        transfers += 1
    return runs, transfers


def draw_timeline(
    result: SimResult,
    path: str | os.PathLike[str],
    *,
    stage_labels: Sequence[str] = (),
    measured: SimResult | None = None,
    title: str = "pipeline timeline",
) -> TimelineDrawing:
    """Write the Gantt chart of ``result`` (simulated) and ``measured`` to ``path``."""
    from matplotlib.patches import Patch

    num = max((t.stage for t in result.timeline), default=-1) + 1
    figure, ax = new_figure(10, 1.0 + 0.9 * num)
    runs, transfers = _lane(ax, result, 0.0, "")
    measured_runs = 0
    end = result.iteration_time
    if measured is not None:
        measured_runs, _ = _lane(ax, measured, LANE + 0.04, "measured-")
        end = max(end, measured.iteration_time)
    labels = list(stage_labels) or [f"stage {s}" for s in range(num)]
    ax.set_yticks([s + LANE for s in range(num)], labels)
    ax.set_ylim(num, -0.2)
    ax.set_xlim(0, end * 1.02 if end > 0 else 1)
    ax.set_xlabel(
        "seconds" + ("" if measured is None else " (upper lane: simulated, lower: measured)")
    )
    ax.set_title(f"{title}: {end:.3g} s per step", loc="left", fontsize=9)
    ax.legend(
        handles=[Patch(facecolor=_shade("#4C72B0", f), label=p) for p, f in PHASE_SHADE.items()]
        + [Patch(facecolor="black", label="transfer")],
        loc="lower right", bbox_to_anchor=(1.0, 1.0), fontsize=7, ncols=4, frameon=False,
    )  # fmt: skip
    return TimelineDrawing(save(figure, path), runs, transfers, measured_runs, end)
