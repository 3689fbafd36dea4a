"""The cluster's hosts and devices, each device coloured by the stage that
owns it and labelled with its coordinate in that stage's logical mesh."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from alpa_ir.plots.figure import new_figure, save, stage_colour


@dataclass(frozen=True)
class StageMesh:
    """A stage's logical mesh: its shape and device ids (row-major)."""

    name: str
    shape: tuple[int, ...]
    devices: tuple[int, ...]


@dataclass(frozen=True)
class DevicesDrawing:
    path: Path
    devices: int
    hosts: int


def draw_devices(
    num_hosts: int,
    devices_per_host: int,
    stages: Sequence[StageMesh],
    path: str | os.PathLike[str],
    *,
    title: str = "devices",
) -> DevicesDrawing:
    from matplotlib.patches import Patch, Rectangle

    owner: dict[int, tuple[int, tuple[int, ...]]] = {}
    for s, mesh in enumerate(stages):
        coords = np.array(mesh.devices).reshape(mesh.shape) if mesh.devices else np.zeros(0)
        for index in np.ndindex(*mesh.shape):
            owner[int(coords[index])] = (s, tuple(int(i) for i in index))
    columns = min(devices_per_host, 8)
    rows_per_host = math.ceil(devices_per_host / columns)
    figure, ax = new_figure(1.2 + 1.1 * columns, 0.9 + (rows_per_host + 0.8) * num_hosts)
    drawn = 0
    for h in range(num_hosts):
        top = h * (rows_per_host + 0.8)
        ax.add_patch(Rectangle((-0.15, top - 0.1), columns + 0.2, rows_per_host + 0.35,
                               fill=False, linestyle=":", gid=f"host-{h}"))  # fmt: skip
        ax.text(-0.1, top + rows_per_host + 0.2, f"host {h}", fontsize=8, va="center")
        for k in range(devices_per_host):
            device = h * devices_per_host + k
            x, y = k % columns, top + k // columns
            stage, coord = owner.get(device, (None, ()))
            colour = "white" if stage is None else stage_colour(stage)
            ax.add_patch(Rectangle((x, y), 0.9, 0.85, facecolor=colour, edgecolor="black",
                                   gid=f"device-{device}"))  # fmt: skip
            label = f"d{device}" + ("" if stage is None else f"\n{list(coord)}")
            ax.text(x + 0.45, y + 0.43, label, ha="center", va="center", fontsize=7)
            drawn += 1
    ax.set_xlim(-0.3, columns + 0.2)
    ax.set_ylim(num_hosts * (rows_per_host + 0.8), -0.3)
    ax.set_axis_off()
    ax.legend(
        handles=[
            Patch(facecolor=stage_colour(s), label=f"{m.name}: mesh {list(m.shape)}")
            for s, m in enumerate(stages)
        ],
        loc="lower center", bbox_to_anchor=(0.5, 1.0), ncols=min(len(stages), 4), fontsize=7,
    )  # fmt: skip
    figure.suptitle(title, fontsize=9)
    return DevicesDrawing(save(figure, path), drawn, num_hosts)
