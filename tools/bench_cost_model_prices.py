"""Collective prices of the auto-sharding cost models against the P² simulator.

For every GPU cluster preset, every logical view ``(dp, mp)`` of its one-node submesh
``(1, M)`` and of the whole cluster ``(N, M)`` (Alpa's submesh space, as ``construct-stages``
plans them), every axis set and every collective kind, prints ``price / simulated`` at a few
byte sizes per device (the cost-model protocol's bytes: the all-gather's output, the
all-reduce's operand, the reduce-scatter's input, the all-to-all's operand).

* ``alpha-beta``: Alpa's formulas on the mesh the preset gives (α/β per axis from
  :meth:`Cluster.logical_mesh`, in microseconds as the stage cost model hands them to the ILP);
* ``calibrated``: :mod:`alpa_ir.p2.calibrated`;
* simulated: :class:`alpa_ir.p2.simulator.Simulator` (ring algorithm) on the preset's P² system
  (a GCP preset's own system; any other cluster one switched interconnect per level), all the
  groups of the axes at once, in microseconds.

Usage: ``python tools/bench_cost_model_prices.py [--model alpha-beta|calibrated|both]
[--presets a,b] [--sizes-mb 1,256] [--summary]``. Runs in seconds.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from alpa_ir.autosharding.cost_model import AlphaBetaCostModel
from alpa_ir.dialects.sharding import CollectiveKind
from alpa_ir.hardware.clusters import get_cluster
from alpa_ir.hardware.device_mesh import LogicalDeviceMesh
from alpa_ir.p2.calibrated import MICROSECONDS, CalibratedCostModel
from alpa_ir.plugins.registry import default_registry

PRESETS = (
    "alpa-testbed",
    "dgx-a100",
    "dgx-h100",
    "gcp-a100-16x2",
    "gcp-a100-16x4",
    "gcp-v100-8x2",
    "gcp-v100-8x4",
)
MB = 2**20
KINDS = tuple(k.value for k in CollectiveKind)
SHORT = {"all_gather": "AG", "reduce_scatter": "RS", "all_reduce": "AR", "all_to_all": "A2A"}


@dataclass(frozen=True)
class Row:
    preset: str
    shape: tuple[int, ...]
    axes: tuple[int, ...]
    ratios: dict[tuple[str, str, float], float]  # (model, kind, bytes) -> price / simulated


def in_microseconds(mesh: LogicalDeviceMesh) -> LogicalDeviceMesh:
    """The mesh with α/β in microseconds (what the stage cost model gives the ILP)."""
    assert mesh.alpha is not None and mesh.beta is not None
    return LogicalDeviceMesh(
        mesh.shape,
        tuple(a * MICROSECONDS for a in mesh.alpha),
        tuple(b * MICROSECONDS for b in mesh.beta),
        mesh.devices,
    )


def axis_sets(shape: Sequence[int]) -> list[tuple[int, ...]]:
    """Each axis of more than one device alone, and both when both are."""
    axes = [(a,) for a, n in enumerate(shape) if n > 1]
    return [*axes, (0, 1)] if len(axes) == 2 else axes


def meshes(preset: str) -> Iterator[LogicalDeviceMesh]:
    """The logical views of the preset's one-node submesh and of the whole cluster."""
    cluster = get_cluster(preset, presets=default_registry().cluster_presets)
    m, n = cluster.devices_per_node, cluster.num_nodes
    for submesh in dict.fromkeys([(1, m), (n, m)]):
        yield from cluster.submesh_logical_meshes(submesh)


def rows(presets: Sequence[str], models: Sequence[str], sizes: Sequence[float]) -> Iterator[Row]:
    alpha_beta = AlphaBetaCostModel()
    for preset in presets:
        calibrated = CalibratedCostModel.for_cluster(
            get_cluster(preset, presets=default_registry().cluster_presets)
        )
        for mesh in meshes(preset):
            scaled = in_microseconds(mesh)
            for axes in axis_sets(mesh.shape):
                ratios = {}
                for kind in KINDS:
                    for nbytes in sizes:
                        sim = calibrated.simulated(kind, mesh, nbytes, axes) * MICROSECONDS
                        for name in models:
                            model = alpha_beta if name == "alpha-beta" else calibrated
                            ratios[name, kind, nbytes] = (
                                getattr(model, kind)(scaled, nbytes, axes) / sim
                            )
                yield Row(preset, mesh.shape, axes, ratios)


def size_label(nbytes: float) -> str:
    return f"{nbytes / MB:g}MB" if nbytes < 1024 * MB else f"{nbytes / MB / 1024:g}GB"


def print_table(table: list[Row], model: str, sizes: Sequence[float]) -> None:
    print(f"\nprice / simulated, cost model {model}")
    cols = [(k, b) for k in KINDS for b in sizes]
    head = " ".join(f"{SHORT[k] + '@' + size_label(b):>10s}" for k, b in cols)
    print(f"{'preset':14s} {'mesh':9s} {'axes':7s} {head}")
    for row in table:
        cells = " ".join(f"{row.ratios[model, k, b]:10.2f}" for k, b in cols)
        print(f"{row.preset:14s} {row.shape!s:9s} {row.axes!s:7s} {cells}")


def print_summary(table: list[Row], model: str, sizes: Sequence[float]) -> None:
    """Per preset, kind and size: the range of the ratios and how many are within 10 %."""
    print(f"\nsummary, cost model {model}: min..max of price/simulated, share within 10 %")
    for preset in dict.fromkeys(r.preset for r in table):
        cells = []
        for kind in KINDS:
            for nbytes in sizes:
                vals = [r.ratios[model, kind, nbytes] for r in table if r.preset == preset]
                ok = sum(abs(v - 1) <= 0.1 for v in vals)
                label = SHORT[kind] + "@" + size_label(nbytes)
                cells.append(f"{label} {min(vals):.2f}..{max(vals):.2f} ({ok}/{len(vals)})")
        print(f"{preset:14s} " + "; ".join(cells))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=("alpha-beta", "calibrated", "both"), default="both")
    parser.add_argument("--presets", default=",".join(PRESETS))
    parser.add_argument("--sizes-mb", default="1,256", help="bytes per device, in MiB")
    parser.add_argument("--summary", action="store_true", help="only the per-preset summary")
    args = parser.parse_args(argv)
    models = ("alpha-beta", "calibrated") if args.model == "both" else (args.model,)
    sizes = [float(s) * MB for s in args.sizes_mb.split(",")]
    if not all(math.isfinite(s) and s > 0 for s in sizes):
        parser.error("--sizes-mb: positive sizes")
    presets = [p for p in args.presets.split(",") if p]
    table = list(rows(presets, models, sizes))
    for model in models:
        if not args.summary:
            print_table(table, model, sizes)
        print_summary(table, model, sizes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
