"""Memory per device over the schedule: for each stage, the bytes one of its
devices holds (persistent state plus the activations of the micro-batches in
flight) at every moment of the simulated timeline, with the device's
capacity and each stage's peak marked."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from alpa_ir.backends.simulate import SimPlan, SimResult
from alpa_ir.plots.figure import new_figure, save, stage_colour

GiB = 1024**3


@dataclass(frozen=True)
class MemoryDrawing:
    path: Path
    peaks: tuple[float, ...]
    """Per stage, the highest point of its curve (bytes per device)."""


def memory_curves(plan: SimPlan, result: SimResult) -> list[list[tuple[float, float]]]:
    """Per stage, (time, bytes per device) steps: a forward run's activations are
    held from its start until its micro-batch's backward run ends (for a
    forward-only stage, until the forward ends)."""
    curves: list[list[tuple[float, float]]] = []
    for s, stage in enumerate(plan.stages):
        tasks = [t for t in result.timeline if t.stage == s]
        backward_end = {t.micro_batch: t.end for t in tasks if t.phase == "backward"}
        events: list[tuple[float, int]] = []
        for t in tasks:
            if t.phase == "forward":
                events.append((t.start, +1))
                events.append((backward_end.get(t.micro_batch, t.end), -1))
        events.sort()
        base = stage.persistent_memory + stage.transient_memory
        held, curve = 0, [(0.0, base)]
        for k, (time, delta) in enumerate(events):
            held += delta
            if k + 1 < len(events) and events[k + 1][0] == time:
                continue  # one point per moment: what is held after all its events
            curve.append((time, base + held * stage.activation_memory))
        curve.append((result.iteration_time, base))
        curves.append(curve)
    return curves


def _unit(nbytes: float) -> tuple[str, float]:
    for name, size in (("GiB", GiB), ("MiB", 1024**2), ("KiB", 1024)):
        if nbytes >= size:
            return name, size
    return "bytes", 1


def draw_memory(
    plan: SimPlan, result: SimResult, path: str | os.PathLike[str], *, title: str = "memory"
) -> MemoryDrawing:
    curves = memory_curves(plan, result)
    figure, ax = new_figure(9, 3.5)
    peaks = [max(v for _, v in curve) for curve in curves]
    unit, size = _unit(max(peaks, default=0.0))
    for s, curve in enumerate(curves):
        times, values = zip(*curve, strict=True)
        colour = stage_colour(s)
        ax.step(times, [v / size for v in values], where="post", color=colour,
                label=f"stage {s}", gid=f"memory-{s}")  # fmt: skip
        at = times[values.index(peaks[s])]
        ax.plot([at], [peaks[s] / size], marker="v", color=colour, gid=f"peak-{s}")
        ax.annotate(f"peak {peaks[s] / size:.3g} {unit}", (at, peaks[s] / size),
                    textcoords="offset points", xytext=(6, -12 - 9 * s), fontsize=7,
                    color=colour)  # fmt: skip
    capacity = min(st.device_memory for st in plan.stages)
    if capacity <= 3 * max(peaks, default=0.0):
        ax.axhline(capacity / size, color="red", linestyle="--", label="device capacity",
                   gid="capacity")  # fmt: skip
    elif capacity < float("inf"):
        title += f" (capacity {capacity / GiB:.3g} GiB per device, off the scale)"
    ax.set_ylim(0, max(peaks, default=1.0) / size * 1.25)
    ax.set_xlabel("seconds")
    ax.set_ylabel(f"{unit} per device")
    ax.set_title(title)
    ax.legend(fontsize=7)
    return MemoryDrawing(save(figure, path), tuple(peaks))
