"""How the largest tensors are split: each tensor drawn as a grid of tiles
(its spec's split of its first two dimensions), each tile labelled with the
mesh coordinates of the devices that hold it."""

from __future__ import annotations

import math
import os
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from alpa_ir.dialects.sharding import ShardingSpec
from alpa_ir.plots.figure import save, stage_colour


@dataclass(frozen=True)
class ShardedTensor:
    name: str
    shape: tuple[int, ...]
    spec: ShardingSpec
    mesh_shape: tuple[int, ...]
    stage: int = 0
    why: str = ""
    """Why the plan is as it is: its function's costliest communication term."""


@dataclass(frozen=True)
class ShardingsDrawing:
    path: Path
    tiles: tuple[int, ...]
    """Per tensor, the tiles drawn (the product of its first two dims' shard counts)."""


def tile_owners(tensor: ShardedTensor) -> dict[tuple[int, ...], list[tuple[int, ...]]]:
    """Tile index (of the first two dims) -> mesh coordinates holding it."""
    rank = min(len(tensor.shape), 2)
    owners: dict[tuple[int, ...], list[tuple[int, ...]]] = {}
    for coord in np.ndindex(*tensor.mesh_shape):
        tile = []
        for d in range(rank):
            axes = tensor.spec.dims[d]
            index = 0
            for a in axes:  # the first named axis is the most significant
                index = index * tensor.mesh_shape[a] + coord[a]
            tile.append(index)
        owners.setdefault(tuple(tile), []).append(tuple(int(c) for c in coord))
    return owners


def draw_shardings(
    tensors: Sequence[ShardedTensor], path: str | os.PathLike[str], *, title: str = "shardings"
) -> ShardingsDrawing:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.patches import Rectangle

    columns = min(len(tensors), 3) or 1
    rows = math.ceil(len(tensors) / columns) or 1
    figure = Figure(figsize=(4 * columns, 3.2 * rows), layout="constrained")
    FigureCanvasAgg(figure)
    counts = []
    for t, tensor in enumerate(tensors):
        ax = figure.add_subplot(rows, columns, t + 1)
        shards = [
            tensor.spec.num_shards(tensor.mesh_shape, d) for d in range(min(2, len(tensor.shape)))
        ]
        rows_n, cols_n = [*shards, 1, 1][:2]
        owners = tile_owners(tensor)
        for tile, holders in sorted(owners.items()):
            i, j = (*tile, 0, 0)[:2]
            ax.add_patch(Rectangle((j / cols_n, i / rows_n), 1 / cols_n, 1 / rows_n,
                                   facecolor=stage_colour(tensor.stage), alpha=0.25 + 0.5 * ((i + j) % 2),
                                   edgecolor="black", gid=f"tile-{t}-{i}-{j}"))  # fmt: skip
            text = "\n".join(str(list(h)) for h in holders[:4]) + (
                "\n…" if len(holders) > 4 else ""
            )
            ax.text((j + 0.5) / cols_n, (i + 0.5) / rows_n, text, ha="center", va="center",
                    fontsize=6)  # fmt: skip
        counts.append(len(owners))
        ax.set_xlim(0, 1)
        ax.set_ylim(1, 0)
        ax.set_xticks([])
        ax.set_yticks([])
        heading = (
            f"{tensor.name} {list(tensor.shape)}\n{tensor.spec} on mesh {list(tensor.mesh_shape)}"
        )
        if tensor.why:
            heading += "\n" + textwrap.shorten(tensor.why, 70, placeholder="...")
        ax.set_title(heading, fontsize=8)
    figure.suptitle(title, fontsize=9)
    return ShardingsDrawing(save(figure, path), tuple(counts))
