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

A stage's forward, B and W times are its latency split by its layers' FLOPs
per phase (:meth:`alpa_ir.costs.stage_table.StageCostTable.phase_shares`); with
``remat`` the recomputed forward is part of B. Apply-grad costs reading and
writing the stage's persistent bytes once at the cluster's memory bandwidth
(80 % of peak).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from alpa_ir.costs.stage_table import StageCostTable
from alpa_ir.pipeline.pipeline_simulation import SimPlan, SimStage

AUTO_SCHEDULES = ("1f1b", "zb-h1", "gpipe")
"""What ``schedule=auto`` compares, in order of preference on a tie."""
MEMORY_EFFICIENCY = 0.8
"""Share of the memory bandwidth an optimizer update reaches."""


def dp_latencies(
    schedule: str, latency: np.ndarray, compute: np.ndarray, shares: np.ndarray
) -> np.ndarray:
    """The per-stage values the DP sums for ``schedule`` (``[first, last, submesh]``
    arrays; ``shares``: ``[first, last, phase]``, :meth:`StageCostTable.phase_shares`).
    ZB-H1: ``t − 2·W``, but never less than the stage's forward and transfers
    (a layer whose W outweighs its forward and B, an embedding, hides no more)."""
    if schedule == "zb-h1":
        f, w = shares[:, :, 0, None], shares[:, :, 2, None]
        finite = np.isfinite(latency)
        work = np.where(finite, compute, 0.0)
        hidden = np.minimum(2.0 * work * w, work * (1.0 - f))
        return np.where(finite, latency - hidden, np.inf)
    return latency


def phase_times(
    table: StageCostTable, first: int, last: int, compute: float, remat: bool
) -> tuple[float, float, float]:
    """A stage's forward, B and W seconds per micro-batch from its compute latency."""
    f, b, w = (float(x) for x in table.phase_shares()[first, last])
    if remat:  # the backward recomputes the forward: one more forward in B
        total = 1.0 + f
        f, b, w = f / total, (b + f) / total, w / total
    return compute * f, compute * b, compute * w


def in_flight_caps(
    table: StageCostTable, stages: Sequence[object], schedule: str
) -> tuple[int, ...] | None:
    """Per stage, the micro-batches a zero-bubble schedule may hold there: ``p``
    where the memory allows, else what fits, never below 1F1B's ``p − i``."""
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
) -> SimPlan:
    """The simulator's view of a stage plan (``stages``: ``StageChoice``)."""
    cluster = table.cluster
    hbm = cluster.hbm_bandwidth * MEMORY_EFFICIENCY
    sim = []
    for s in stages:
        cost = s.cost  # type: ignore[attr-defined]
        f, b, w = phase_times(table, s.first, s.last, cost.latency, remat)  # type: ignore[attr-defined]
        sim.append(
            SimStage(
                forward=f,
                backward=b,
                backward_weight=w,
                apply_grad=2 * cost.persistent / hbm if hbm > 0 else 0.0,
                # the recomputed stash (remat) is held once, not per micro-batch
                persistent_memory=cost.persistent + cost.transient,
                activation_memory=cost.activations,
                device_memory=cluster.device_memory,
                num_devices=s.mesh.size,  # type: ignore[attr-defined]
            )
        )
    # boundary k: stage k+1 receives activations, stage k receives gradients
    times = [table.transfer_times(s.cost, s.submesh) for s in stages]  # type: ignore[attr-defined]
    forward = tuple(times[k + 1][0] for k in range(len(stages) - 1))
    backward = tuple(times[k][1] for k in range(len(stages) - 1))
    return SimPlan(
        tuple(sim),
        num_micro_batches,
        schedule,
        forward,
        backward,
        in_flight_caps=in_flight_caps(table, stages, schedule),
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


def with_plan_latency(candidate: ScheduleCandidate) -> object:
    """The candidate's ``StagePlan`` with the simulated iteration time as its latency."""
    return replace(candidate.plan, latency=candidate.iteration_time)  # type: ignore[type-var]


__all__ = [
    "AUTO_SCHEDULES",
    "ScheduleCandidate",
    "dp_latencies",
    "in_flight_caps",
    "phase_times",
    "stage_sim_plan",
]
