"""The pipeline schedule, chosen with the stages.

For each candidate schedule the stage DP runs with that schedule's latency
(Eq. 2 generalised, :func:`dp_latencies`), the stages it returns are timed and
sized by the simulator under that schedule (:func:`stage_sim_plan`), and the
fastest plan that fits in memory wins
(:func:`alpa_ir.pipeline.stage_construction.choose_schedule`). The
candidates are the schedules the runtimes execute with one stage per mesh:

- ``1f1b`` and ``gpipe``: Eq. 2 as Alpa has it, ``Σ t_i + (B − 1)·max t_i``
  (GPipe has 1F1B's bubble and more memory, so it only wins a tie it loses on
  order);
- ``zb-h1``: the backward split into B and W, W filling the bubbles. For
  equal stages the iteration takes ``B·t + (p − 1)(T_F + T_B − T_W)``
  (Qi et al.), so the DP sums ``t_i − 2·W_i`` where Eq. 2 sums ``t_i``, and
  keeps ``max t_i`` in the ``(B − 1)`` term. Each stage may hold up to ``p``
  micro-batches (1F1B's peak, on stage 0) where its memory allows, and at
  least 1F1B's ``p − i``; the caps are written into the plan
  (:func:`in_flight_caps`).
- ``interleaved-1f1b`` and ``zb-v``: the DP slices the layers into ``p``
  meshes' worth (each DP stage is a mesh) with the bubble term divided by
  the ``v = 2`` chunks per mesh (interleaved: ``Σ t_i / v``; zb-v: ZB-H1's sum
  halved). On those meshes, and on every split of the cluster into equal
  submeshes, the layers are then cut anew into chunks laid out in the
  schedule's order (interleaved: every mesh's first chunk, then every mesh's
  second; V: the second chunks in reverse), a mesh's chunks priced together
  (:mod:`alpa_ir.pipeline.virtual_layout`); the simulator keeps the fastest
  that fits (:func:`alpa_ir.pipeline.stage_construction.virtual_plans`).

A stage's forward, B and W times are its latency split by its layers' FLOPs
per phase (:meth:`alpa_ir.costs.stage_table.StageCostTable.phase_shares`); with
``remat`` the recomputed forward is part of B. Apply-grad costs reading and
writing the stage's persistent bytes once at the cluster's memory bandwidth
(80 % of peak).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from alpa_ir.costs.stage_table import StageCostTable
from alpa_ir.pipeline.pipeline_simulation import SimPlan, SimStage
from alpa_ir.pipeline.schedule_kinds import SPLIT_SCHEDULES

AUTO_SCHEDULES = ("1f1b", "zb-h1", "interleaved-1f1b", "zb-v", "gpipe")
"""What ``schedule=auto`` compares, in order of preference on a tie."""
VIRTUAL_STAGES = {"interleaved-1f1b": 2, "zb-v": 2}
"""Chunks per mesh the planner gives the schedules that place several on one.
Each is a power of two: the stage DP of such a schedule reuses its one-chunk
schedule's solves with the sum weighted by ``1 / v`` (``stage_dp(sum_scale=)``),
which equals the DP on costs divided by ``v`` bit for bit only when the
division is exact."""
assert all(v & (v - 1) == 0 for v in VIRTUAL_STAGES.values())
MEMORY_EFFICIENCY = 0.8
"""Share of the memory bandwidth an optimizer update reaches."""


def dp_latencies(
    schedule: str, latency: np.ndarray, compute: np.ndarray, shares: np.ndarray
) -> np.ndarray:
    """The per-stage values the DP sums for ``schedule`` (``[first, last, submesh]``
    arrays; ``shares``: ``[first, last, phase]``, :meth:`StageCostTable.phase_shares`).
    ZB-H1: ``t − 2·W``, but never less than the stage's forward and transfers
    (a layer whose W outweighs its forward and B, an embedding, hides no more)."""
    if schedule in ("zb-h1", "zb-v"):
        f, w = shares[:, :, 0, None], shares[:, :, 2, None]
        finite = np.isfinite(latency)
        work = np.where(finite, compute, 0.0)
        hidden = np.minimum(2.0 * work * w, work * (1.0 - f))
        summed = np.where(finite, latency - hidden, np.inf)
        return summed / VIRTUAL_STAGES[schedule] if schedule == "zb-v" else summed
    if schedule == "interleaved-1f1b":
        return latency / VIRTUAL_STAGES[schedule]
    return latency


def phase_times(
    table: StageCostTable,
    first: int,
    last: int,
    compute: float,
    remat: bool,
    shares: np.ndarray | None = None,
) -> tuple[float, float, float]:
    """A stage's forward, B and W seconds per micro-batch from its compute
    latency (``shares``: ``table.phase_shares()``, where the caller has it)."""
    shares = table.phase_shares() if shares is None else shares
    f, b, w = (float(x) for x in shares[first, last])
    if remat:  # the backward recomputes the forward: one more forward in B
        total = 1.0 + f
        f, b, w = f / total, (b + f) / total, w / total
    return compute * f, compute * b, compute * w


def in_flight_caps(
    table: StageCostTable,
    stages: Sequence[object],
    schedule: str,
    mesh_of: Sequence[int] | None = None,
) -> tuple[int, ...] | None:
    """Per stage, the micro-batches a zero-bubble schedule may hold there: ZB-H1,
    ``p`` where the memory allows, else what fits, never below 1F1B's ``p − i``;
    ZB-V, half of the chunk activations that fit beside the mesh's persistent
    memory on each of its two chunks (the schedule caps their sum; at least
    one each)."""
    if schedule == "zb-v":
        of = list(mesh_of or range(len(stages)))
        caps = []
        for k in of:
            mine = [st.cost for st, m in zip(stages, of, strict=True) if m == k]  # type: ignore[attr-defined]
            held = sum(c.persistent for c in mine) + max(c.transient for c in mine)
            room = table.cluster.device_memory - held
            # the schedule counts a mesh's chunk activations against the sum of
            # its chunks' caps: whichever chunk holds them, they must fit
            largest = max(c.activations for c in mine)
            slots = int(room // largest) if largest > 0 else 2 * len(stages)
            caps.append(max(1, slots // 2))
        return tuple(caps)
    if schedule != "zb-h1":
        return None
    p = len(stages)
    caps = []
    for i, stage in enumerate(stages):
        cost = stage.cost  # type: ignore[attr-defined]
        held = cost.persistent + cost.transient
        room = table.cluster.device_memory - held
        fits = int(room // cost.activations) if cost.activations > 0 else p
        caps.append(max(p - i, min(p, fits)))
    return tuple(caps)


def stage_sim_plan(
    table: StageCostTable,
    stages: Sequence[object],
    num_micro_batches: int,
    schedule: str = "1f1b",
    remat: bool = False,
    mesh_of: Sequence[int] | None = None,
) -> SimPlan:
    """The simulator's view of a stage plan (``stages``: ``StageChoice``;
    ``mesh_of``: each stage's mesh, where several share one)."""
    cluster = table.cluster
    # apply-grad streams the state once: the profile's achieved bandwidth
    hbm = (
        cluster.profile.memory_bandwidth
        if cluster.profile is not None
        else cluster.hbm_bandwidth * MEMORY_EFFICIENCY
    )
    sim = []
    shares = table.phase_shares()  # once: the ranges' shares of every stage
    for s in stages:
        cost = s.cost  # type: ignore[attr-defined]
        f, b, w = phase_times(table, s.first, s.last, cost.latency, remat, shares)  # type: ignore[attr-defined]
        sim.append(
            SimStage(
                forward=f,
                backward=b,
                backward_weight=w,
                apply_grad=2 * cost.persistent / hbm if hbm > 0 else 0.0,
                persistent_memory=cost.persistent,
                # the recomputed stash (remat): once per mesh, not per micro-batch
                transient_memory=cost.transient,
                activation_memory=cost.activations,
                device_memory=cluster.device_memory,
                num_devices=s.mesh.size,  # type: ignore[attr-defined]
            )
        )
    # boundary k: stage k+1 receives activations, stage k receives gradients;
    # nothing moves between two stages of one mesh
    of = list(mesh_of or range(len(stages)))
    times = [table.transfer_times(s.cost, s.submesh) for s in stages]  # type: ignore[attr-defined]
    apart = [of[k] != of[k + 1] for k in range(len(stages) - 1)]
    # the share of a transfer the runtime hides under compute (the profile's)
    exposed = 1.0 - (cluster.profile.overlap.cross_mesh if cluster.profile is not None else 0.0)
    forward = tuple(times[k + 1][0] * apart[k] * exposed for k in range(len(stages) - 1))
    backward = tuple(times[k][1] * apart[k] * exposed for k in range(len(stages) - 1))
    split = schedule in SPLIT_SCHEDULES
    # per stage: F, B, W, and when its forward and gradient inputs arrive
    arrivals = [
        (forward[s - 1] if s > 0 else 0.0, backward[s] if s < len(sim) - 1 else 0.0)
        for s in range(len(sim))
    ]
    return SimPlan(
        tuple(sim),
        num_micro_batches,
        schedule,
        forward,
        backward,
        virtual_stages=len(stages) // len(set(of)),
        in_flight_caps=in_flight_caps(table, stages, schedule, of),
        # the zero-bubble orders are built with the stages' own times (and
        # written into the plan with them)
        phase_times=tuple(
            (s.forward, s.backward, s.backward_weight, *arrival)
            for s, arrival in zip(sim, arrivals, strict=True)
        )
        if split
        else None,
    )


@dataclass(frozen=True)
class ScheduleCandidate:
    """One schedule's best plan: its stages (``StagePlan``), simulated seconds per
    iteration and peak bytes per device (``inf``: no plan fits), and why not."""

    schedule: str
    plan: object | None
    iteration_time: float = math.inf
    peak_memory: float = math.inf
    in_flight: tuple[int, ...] | None = None
    note: str = ""

    @property
    def fits(self) -> bool:
        return self.plan is not None and math.isfinite(self.iteration_time)


__all__ = [
    "AUTO_SCHEDULES",
    "VIRTUAL_STAGES",
    "ScheduleCandidate",
    "dp_latencies",
    "in_flight_caps",
    "phase_times",
    "stage_sim_plan",
]
