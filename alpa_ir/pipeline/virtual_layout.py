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
table, a mesh's chunks counted together (their times, and their memory with
one micro-batch in flight on each and the largest recomputed stash; a mesh that does not fit takes its
chunks' memory-saving plans where that fits). It starts from cuts at equal
shares of the layers' time, a chunk's share in proportion to its mesh's
devices, and then moves one cut by one layer at a time while that lowers
(memory overflow, the meshes' summed times slowest first): a local search to
a fixed point. Which meshes to try (the DP's own, or the cluster split into
equal submeshes) and which result to keep is the caller's: the simulator
decides (:func:`alpa_ir.pipeline.stage_construction.evaluate_schedule`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from alpa_ir.costs.stage_table import StageCostTable
from alpa_ir.errors import PlanError
from alpa_ir.hardware.device_mesh import LogicalDeviceMesh
from alpa_ir.pipeline.schedule_kinds import SPLIT_SCHEDULES, build_schedule
from alpa_ir.pipeline.task_order import peak_stage_in_flight


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
    """The mesh of each chunk in pipeline order: ZB-V down and back up (two
    chunks per mesh), interleaved ``chunks`` rounds over the meshes."""
    if schedule == "zb-v":
        return (*range(meshes), *reversed(range(meshes)))
    return tuple(k for _ in range(chunks) for k in range(meshes))


class _Prices:
    """Per mesh, the table's ``[choice, first, last]`` arrays on its view, and
    what the estimate needs: the share of a range's time its forward and B
    take, and the seconds its inputs take to arrive (both directions)."""

    def __init__(self, table: StageCostTable, meshes: Sequence[VirtualMesh]) -> None:
        by_shape: dict[tuple[int, ...], dict[str, np.ndarray]] = {}
        for m in meshes:
            shape = tuple(m.mesh.shape)
            if shape not in by_shape:
                by_shape[shape] = table.arrays(shape)
        of = [by_shape[tuple(m.mesh.shape)] for m in meshes]
        self.latency = [a["latency"] for a in of]
        self.persistent = [a["persistent"] for a in of]
        self.transient = [a["transient"] for a in of]
        self.activations = [a["activations"] for a in of]
        self.forward_and_b = 1.0 - table.phase_shares()[:, :, 2]
        self.arrival = [
            table.transfer_seconds(a["cross_bytes"] - a["backward_bytes"], m.submesh)
            + table.transfer_seconds(a["backward_bytes"], m.submesh)
            for a, m in zip(of, meshes, strict=True)
        ]


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
) -> tuple[float, tuple[float, ...], list[int]]:
    """(memory overflow, the meshes' estimated seconds per micro-batch slowest
    first, each mesh's plan choice). A mesh's estimate is its summed chunk
    time; under ZB-V it is at least the time a micro-batch spends between its
    first forward and its last B on the mesh (chunks, B's and arrivals between)
    over the micro-batches its memory holds at once (Little's law), at most
    ``p`` of them."""
    meshes = max(layout) + 1
    chunks = _chunks_of(cuts, num_layers)
    load = np.zeros((meshes, 2))
    fixed = np.zeros((meshes, 2))
    running = np.zeros((meshes, 2))
    transient = np.zeros((meshes, 2))
    span = np.zeros(len(chunks))  # per pipeline position: forward + B + arrival
    for pos, ((first, last), k) in enumerate(zip(chunks, layout, strict=True)):
        seconds = prices.latency[k][:, first, last]
        load[k] += seconds
        fixed[k] += prices.persistent[k][:, first, last]
        transient[k] = np.maximum(transient[k], prices.transient[k][:, first, last])
        per = prices.activations[k][:, first, last]
        if demand.held is None:  # ZB-V: the larger chunk's counts (its caps' rule)
            running[k] = np.maximum(running[k], 2 * per)
        else:
            running[k] += demand.held[pos] * per
        span[pos] = seconds[0] * prices.forward_and_b[first, last]
        span[pos] += prices.arrival[k][0, first, last] if pos else 0.0
    fixed += transient
    need = fixed + running
    choices = [0 if need[k, 0] <= memory else int(need[k, 1] < need[k, 0]) for k in range(meshes)]
    overflow = sum(max(0.0, need[k, c] - memory) for k, c in enumerate(choices))
    times = []
    for k, c in enumerate(choices):
        seconds = float(load[k, c])
        if demand.held is None:
            where = [pos for pos, m in enumerate(layout) if m == k]
            trip = float(span[where[0] : where[-1] + 1].sum())
            room = max(memory - fixed[k, c], running[k, c])
            at_once = min(meshes, demand.micro_batches, room / running[k, c])
            seconds = max(seconds, trip / at_once)
        times.append(seconds)
    return overflow, tuple(sorted(times, reverse=True)), choices


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


def balance_chunks(
    table: StageCostTable,
    meshes: Sequence[VirtualMesh],
    layout: Sequence[int],
    schedule: str,
    num_micro_batches: int,
) -> tuple[Chunk, ...]:
    """The chunks of ``layout`` (the mesh of each chunk, in pipeline order) on
    ``meshes`` for ``schedule``, balanced as the module docstring says."""
    num = table.num_layers
    if len(layout) > num:
        raise PlanError(
            f"construct-stages: {len(layout)} chunks on {len(meshes)} meshes need at least "
            f"{len(layout)} layers, the step has {num}"
        )
    prices = _Prices(table, meshes)
    memory = table.cluster.device_memory
    sizes = [m.submesh[0] * m.submesh[1] for m in meshes]
    cuts = _initial_cuts(prices, layout, sizes, num)
    demand = _demand(schedule, len(meshes), num_micro_batches, len(layout) // len(meshes))
    best = _score(prices, layout, cuts, num, memory, demand)
    improved = True
    while improved:
        improved = False
        # shift cuts c..d together by one layer: one layer passes from chunk c
        # to chunk d + 1 (or back) and the chunks between keep their sizes
        for c in range(len(cuts)):
            for d in range(c, len(cuts)):
                for step in (-1, 1):
                    trial = [x + step if c <= i <= d else x for i, x in enumerate(cuts)]
                    edges = [0, *trial, num]
                    if any(edges[i + 1] <= edges[i] for i in range(len(edges) - 1)):
                        continue
                    score = _score(prices, layout, trial, num, memory, demand)
                    if score[:2] < best[:2]:
                        cuts, best, improved = trial, score, True
    choices = best[2]
    return tuple(
        Chunk(first, last, k, choices[k])
        for (first, last), k in zip(_chunks_of(cuts, num), layout, strict=True)
    )


__all__ = ["Chunk", "VirtualMesh", "balance_chunks", "chunk_layout"]
