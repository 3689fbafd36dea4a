"""Layer chunks for the schedules that put several stages on one mesh.

Interleaved 1F1B and ZB-V run ``v`` chunks of layers on each mesh; the
schedule's layout gives the mesh of each chunk in pipeline order
(:func:`chunk_layout`: interleaved deals the meshes round after round, ZB-V
goes down the meshes and back up, so mesh 0 holds the first and the last
layers). The stage DP (Eq. 2) prices one contiguous range per mesh, so neither
its balance nor its memory carries over to chunks: under a V the first mesh
holds the embedding and the head together.

:func:`balance_chunks` cuts the layers anew for given meshes: ``len(layout)``
contiguous, non-empty chunks, each priced on its mesh's view from the cost
table, a mesh's chunks counted together: their memory (parameters, the
largest recomputed stash, and the activations the schedule holds: at its
peak under interleaved's fixed order, one micro-batch through the mesh under
ZB-V, which sizes its caps from what is left) and their time (summed; under
ZB-V slower where the memory left holds fewer chunk activations than the
schedule wants, :data:`CAP_SLOWDOWN`). A mesh that does not fit takes its
chunks' memory-saving plans where that fits. The search starts from cuts at
equal shares of the layers' time, a chunk's share in proportion to its
mesh's devices, and shifts a run of neighbouring cuts by one layer (one
layer passes between two chunks, the chunks between keep their sizes) while
that lowers (memory overflow, the meshes' estimated times slowest first): a
local search to a fixed point. Which meshes to try (the DP's own, or the
cluster split into equal submeshes) and which result to keep is the
caller's: the simulator decides
(:func:`alpa_ir.pipeline.stage_construction.virtual_plans`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from alpa_ir.costs.stage_table import StageCostTable
from alpa_ir.errors import PlanError
from alpa_ir.hardware.device_mesh import LogicalDeviceMesh
from alpa_ir.pipeline.schedule_kinds import SPLIT_SCHEDULES, build_schedule
from alpa_ir.pipeline.task_order import peak_stage_in_flight

CAP_SLOWDOWN = 0.5
"""Under ZB-V, a mesh whose memory holds ``s`` of the ``2p`` chunk activations
the schedule wants runs about ``(2p / s) ** CAP_SLOWDOWN`` times slower (fit
to the simulator on GPT-3 15B: 8 of 10 slots cost 9 %, 4 of 10 cost 55 %)."""


@dataclass(frozen=True)
class VirtualMesh:
    """One mesh of a virtual plan: its submesh and its placed logical view."""

    submesh: tuple[int, int]
    mesh: LogicalDeviceMesh


@dataclass(frozen=True)
class Chunk:
    """A chunk of layers ``first..last`` on mesh ``mesh`` with plan ``choice``
    (0: the table's plan, 1: its memory-saving plan)."""

    first: int
    last: int
    mesh: int
    choice: int


def chunk_layout(schedule: str, meshes: int, chunks: int) -> tuple[int, ...]:
    """The mesh of each chunk in pipeline order, as ``schedule``'s builder
    places them (ZB-V down and back up, interleaved ``chunks`` rounds over the
    meshes); the placement does not depend on the micro-batch count."""
    return build_schedule(schedule, meshes, 1, chunks).mesh_of


class _Prices:
    """Per mesh, the table's ``[choice][first][last]`` values on its view, as
    nested lists (the local search reads single entries, which lists serve
    faster than arrays), and ``ranges[first][last]``: a range's eight values
    in one tuple (latency, persistent, transient and activations, each of
    choice 0 then 1), which :func:`_score` reads with one lookup."""

    def __init__(
        self,
        table: StageCostTable,
        meshes: Sequence[VirtualMesh],
        by_shape: dict[tuple[int, ...], dict[str, list]] | None = None,
    ) -> None:
        by_shape = {} if by_shape is None else by_shape  # a view's lists, built once
        names = ("latency", "persistent", "transient", "activations")
        for m in meshes:
            shape = tuple(m.mesh.shape)
            if shape not in by_shape:
                arrays = table.arrays(shape)
                by_shape[shape] = {n: arrays[n].tolist() for n in names}
                columns = [arrays[n][c] for n in names for c in (0, 1)]  # 8 of [first, last]
                by_shape[shape]["ranges"] = np.stack(columns, axis=-1).tolist()
        of = [by_shape[tuple(m.mesh.shape)] for m in meshes]
        self.latency = [a["latency"] for a in of]
        self.persistent = [a["persistent"] for a in of]
        self.transient = [a["transient"] for a in of]
        self.activations = [a["activations"] for a in of]
        self.ranges = [a["ranges"] for a in of]


def _chunks_of(cuts: Sequence[int], num_layers: int) -> list[tuple[int, int]]:
    edges = [0, *cuts, num_layers]
    return [(edges[c], edges[c + 1] - 1) for c in range(len(edges) - 1)]


@dataclass(frozen=True)
class _Demand:
    """What a layout asks of each mesh's memory: ``held[s]``, the chunk
    activations stage ``s`` holds at its peak under a fixed order
    (interleaved), or None where the schedule sizes its caps from memory
    (ZB-V: one micro-batch through the mesh must fit, more go faster)."""

    held: tuple[int, ...] | None
    micro_batches: int


def _score(
    prices: _Prices,
    layout: Sequence[int],
    cuts: Sequence[int],
    num_layers: int,
    memory: float,
    demand: _Demand,
) -> tuple[float, tuple[float, ...], list[int], set[int]]:
    """(memory overflow, the meshes' estimated seconds per micro-batch slowest
    first, each mesh's plan choice, the meshes a move must relieve: the
    slowest and those out of memory). A mesh's estimate is its summed chunk
    time; under ZB-V, slowed by :data:`CAP_SLOWDOWN` where its memory holds
    fewer chunk activations than the schedule wants."""
    meshes = max(layout) + 1
    load = [[0.0, 0.0] for _ in range(meshes)]
    fixed = [[0.0, 0.0] for _ in range(meshes)]
    running = [[0.0, 0.0] for _ in range(meshes)]
    transient = [[0.0, 0.0] for _ in range(meshes)]
    edges = [0, *cuts, num_layers]
    held_of = demand.held
    for pos, k in enumerate(layout):
        # latency, persistent, transient, activations; choice 0 then 1 (_Prices.ranges)
        lat0, lat1, per0, per1, tra0, tra1, act0, act1 = prices.ranges[k][edges[pos]][
            edges[pos + 1] - 1
        ]
        ld, fx, tr, rn = load[k], fixed[k], transient[k], running[k]
        ld[0] += lat0
        ld[1] += lat1
        fx[0] += per0
        fx[1] += per1
        tr[0] = max(tr[0], tra0)
        tr[1] = max(tr[1], tra1)
        if held_of is None:  # ZB-V: the larger chunk's counts (its caps' rule)
            rn[0] = max(rn[0], 2 * act0)
            rn[1] = max(rn[1], 2 * act1)
        else:
            rn[0] += held_of[pos] * act0
            rn[1] += held_of[pos] * act1
    choices: list[int] = []
    need_of: list[float] = []
    overflow = 0.0
    times: list[float] = []
    wanted = 2 * min(meshes, demand.micro_batches)
    for k in range(meshes):
        fx, tr, rn = fixed[k], transient[k], running[k]
        held0, held1 = fx[0] + tr[0], fx[1] + tr[1]
        need0, need1 = held0 + rn[0], held1 + rn[1]
        c = 0 if need0 <= memory else int(need1 < need0)
        held, need = (held1, need1) if c else (held0, need0)
        choices.append(c)
        need_of.append(need)
        overflow += max(0.0, need - memory)
        seconds = load[k][c]
        if held_of is None and rn[c] > 0:
            slots = max(2.0, 2 * (memory - held) / rn[c])
            seconds *= max(1.0, wanted / slots) ** CAP_SLOWDOWN
        times.append(seconds)
    slowest = max(range(meshes), key=times.__getitem__)
    hot = {slowest} | {k for k in range(meshes) if need_of[k] > memory}
    return overflow, tuple(sorted(times, reverse=True)), choices, hot


def _initial_cuts(
    prices: _Prices, layout: Sequence[int], sizes: Sequence[int], num_layers: int
) -> list[int]:
    """Cuts at equal shares of the layers' time on the first mesh's view, a
    chunk's share in proportion to its mesh's devices."""
    per_layer = np.diagonal(prices.latency[0][0]).copy()
    per_layer[~np.isfinite(per_layer)] = 0.0
    cumulative = np.cumsum(per_layer)
    weights = np.array([sizes[k] for k in layout], dtype=float)
    targets = np.cumsum(weights)[:-1] / weights.sum() * cumulative[-1]
    cuts = [int(np.searchsorted(cumulative, t)) + 1 for t in targets]
    # every chunk keeps at least one layer
    for c in range(len(cuts)):
        low = (cuts[c - 1] if c else 0) + 1
        cuts[c] = max(cuts[c], low)
    for c in reversed(range(len(cuts))):
        high = (cuts[c + 1] if c + 1 < len(cuts) else num_layers) - 1
        cuts[c] = min(cuts[c], high)
    return cuts


def _demand(schedule: str, meshes: int, micro_batches: int, chunks: int) -> _Demand:
    if schedule in SPLIT_SCHEDULES:
        return _Demand(None, micro_batches)
    order = build_schedule(schedule, meshes, micro_batches, chunks)
    return _Demand(tuple(peak_stage_in_flight(order)), micro_batches)


def load_bound(table: StageCostTable, meshes: Sequence[VirtualMesh]) -> float:
    """About the least seconds per micro-batch the slowest of ``meshes`` can
    take: all the layers on the fastest-per-device mesh's view, its share of
    the devices (the mean load, for equal meshes)."""
    devices = sum(m.submesh[0] * m.submesh[1] for m in meshes)
    best = math.inf
    for shape, size in {(tuple(m.mesh.shape), m.submesh[0] * m.submesh[1]) for m in meshes}:
        total = sum(table.cost(k, k, shape).latency for k in range(table.num_layers))
        best = min(best, total * size / devices)
    return best


def memory_floor(table: StageCostTable, meshes: Sequence[VirtualMesh]) -> float:
    """A floor on the persistent bytes per device of the fullest of ``meshes``
    under any cut of the layers into chunks and any plan choice: the device
    bytes (bytes per device times devices) add up over the meshes, and each
    layer holds at least its cheapest option's, so some mesh holds at least
    their sum over all the devices. Only ``layer-sum`` tables (a range's
    persistent bytes are its layers' sum); 0 for others."""
    if table.internal is None:
        return 0.0
    devices = sum(m.submesh[0] * m.submesh[1] for m in meshes)
    least = np.full(table.num_layers, np.inf)
    for shape, size in {(tuple(m.mesh.shape), m.submesh[0] * m.submesh[1]) for m in meshes}:
        for k in range(table.num_layers):
            cost = table.cost(k, k, shape)
            held = min(cost.persistent, (cost.memory_saving or cost).persistent)
            least[k] = min(least[k], held * size)
    return float(least.sum()) / devices


@dataclass(frozen=True)
class ChunkLayout:
    """:func:`balance_chunks`' result: the chunks in pipeline order, the bytes
    by which the meshes overflow their memory (0: all fit), and the slowest
    mesh's estimated seconds per micro-batch (:func:`_score`)."""

    chunks: tuple[Chunk, ...]
    overflow: float
    slowest: float


def balance_chunks(
    table: StageCostTable,
    meshes: Sequence[VirtualMesh],
    layout: Sequence[int],
    schedule: str,
    num_micro_batches: int,
    prices: dict[tuple[int, ...], dict[str, list]] | None = None,
) -> ChunkLayout:
    """The chunks of ``layout`` (the mesh of each chunk, in pipeline order) on
    ``meshes`` for ``schedule``, balanced as the module docstring says
    (``prices``: a dict the caller keeps across calls on ``table``, each
    view's values read out of it once)."""
    num = table.num_layers
    if len(layout) > num:
        raise PlanError(
            f"construct-stages: {len(layout)} chunks on {len(meshes)} meshes need at least "
            f"{len(layout)} layers, the step has {num}"
        )
    read = _Prices(table, meshes, prices)
    memory = table.cluster.device_memory
    sizes = [m.submesh[0] * m.submesh[1] for m in meshes]
    cuts = _initial_cuts(read, layout, sizes, num)
    demand = _demand(schedule, len(meshes), num_micro_batches, len(layout) // len(meshes))
    best = _score(read, layout, cuts, num, memory, demand)
    improved = True
    while improved:
        improved = False
        # shift cuts c..d together by one layer: one layer passes from chunk c
        # to chunk d + 1 (or back) and the chunks between keep their sizes;
        # only a move that touches the slowest mesh or one out of memory helps
        for c in range(len(cuts)):
            for d in range(c, len(cuts)):
                if layout[c] not in best[3] and layout[d + 1] not in best[3]:
                    continue
                for step in (-1, 1):
                    # the cuts are increasing: only chunk c (step -1) or d + 1 (+1) may empty
                    if step < 0 and cuts[c] - 1 <= (cuts[c - 1] if c else 0):
                        continue
                    if step > 0 and cuts[d] + 1 >= (cuts[d + 1] if d + 1 < len(cuts) else num):
                        continue
                    trial = [*cuts[:c], *(x + step for x in cuts[c : d + 1]), *cuts[d + 1 :]]
                    score = _score(read, layout, trial, num, memory, demand)
                    if score[:2] < best[:2]:
                        cuts, best, improved = trial, score, True
    choices = best[2]
    chunks = tuple(
        Chunk(first, last, k, choices[k])
        for (first, last), k in zip(_chunks_of(cuts, num), layout, strict=True)
    )
    return ChunkLayout(chunks, best[0], best[1][0])


__all__ = [
    "Chunk",
    "ChunkLayout",
    "VirtualMesh",
    "balance_chunks",
    "chunk_layout",
    "load_bound",
    "memory_floor",
]
