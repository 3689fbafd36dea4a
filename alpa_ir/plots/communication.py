"""Communication per collective kind and program: the bytes one device sends
per step as the plan predicts them (the cost model's collectives) beside the
bytes of the collectives XLA compiled (read from the HLO), so that a gap
between the model and the compiler shows."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from xdsl.dialects import func

from alpa_ir.plots.figure import new_figure, save

KINDS = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")


@dataclass(frozen=True)
class CommRow:
    """One program's bytes per device of one collective kind, per step."""

    program: str
    kind: str
    predicted: float
    measured: float


@dataclass(frozen=True)
class CommunicationDrawing:
    path: Path
    rows: tuple[CommRow, ...]


def _rows(
    program: str, predicted: Sequence[Any], hlo_text: str, devices: int, more: Sequence[str] = ()
) -> list[CommRow]:
    """``more``: other compiled modules whose collectives count for ``program``."""
    from alpa_ir.costs.collective_accounting import hlo_collectives

    measured = [c for text in (hlo_text, *more) for c in hlo_collectives(text)]
    rows = []
    for kind in KINDS:
        p = sum(c.wire_bytes for c in predicted if c.kind == kind)
        m = sum(r.wire_bytes(devices) for r in measured if r.kind == kind)
        if p or m:
            rows.append(CommRow(program, kind, float(p), float(m)))
    return rows


def shard_rows(executable: Any) -> list[CommRow]:
    """A ShardParallel executable: its one program."""
    return _rows(
        "step", executable.predicted_collectives(), executable.get_hlo_text(), executable.mesh.size
    )


def pipeshard_rows(executable: Any) -> list[CommRow]:
    """A PipeshardParallel executable: each stage program, per call (with the
    sums over its mesh that run once per step after its micro-batches)."""
    from alpa_ir.autosharding.plan_bytes import predicted_collectives
    from alpa_ir.hardware.device_mesh import function_mesh
    from alpa_ir.ir.module_utils import symbol_op

    rows = []
    names = executable.stage_function_names()
    for name, text in zip(names, executable.get_hlo_text(), strict=True):
        function = symbol_op(executable.module, name, func.FuncOp)
        assert isinstance(function, func.FuncOp)
        mesh = function_mesh(executable.module, function)
        assert mesh is not None
        more = executable.deferred_hlo_texts(name)
        rows += _rows(name, predicted_collectives(function, mesh.shape), text, mesh.size, more)
    return rows


def draw_communication(
    rows: Sequence[CommRow], path: str | os.PathLike[str], *, title: str = "communication"
) -> CommunicationDrawing:
    figure, ax = new_figure(max(6.0, 0.9 * len(rows) + 2), 3.8)
    labels = [f"{r.program}\n{r.kind}" for r in rows]
    xs = range(len(rows))
    ax.bar([x - 0.2 for x in xs], [r.predicted for r in rows], 0.4, label="predicted (plan)",
           color="#4C72B0")  # fmt: skip
    ax.bar([x + 0.2 for x in xs], [r.measured for r in rows], 0.4, label="measured (HLO)",
           color="#DD8452")  # fmt: skip
    for k, r in enumerate(rows):  # ids for the bars, in order
        ax.patches[k].set_gid(f"predicted-{r.program}-{r.kind}")
        ax.patches[len(rows) + k].set_gid(f"measured-{r.program}-{r.kind}")
    ax.set_xticks(list(xs), labels, fontsize=7)
    ax.set_ylabel("bytes per device per call")
    ax.set_title(title if rows else f"{title}: no collectives", fontsize=9)
    ax.legend(fontsize=7)
    return CommunicationDrawing(save(figure, path), tuple(rows))
