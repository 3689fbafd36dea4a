"""The planner's plan of a zoo step by the search that scales (issue #42), as
``alpa-bench``'s published suites and ``tools/bench_scale.py`` run it.

:mod:`alpa_ir.pipeline.pipeline_replicas` plans ``r`` data-parallel replicas
of one pipeline: the step traced abstractly at the micro-batch shape with its
automatic layers, one cost table on the largest pipeline (the
``power-of-two`` submesh space, each layer priced once: ``layer-sum``), every
replica count's stage DP and the replicas' gradient all-reduce (or, with
ZeRO across the replicas, reduce-scatter and all-gather). The chosen
replica's stages are then simulated as every other ``alpa-bench`` plan is
(:func:`alpa_ir.tools.bench_outcome.outcome`: one replica's ``B / r``
micro-batches and ``1 / r`` of the step's FLOPs), and the all-reduce is added
to its iteration time.

The figures of the planning itself: wall seconds, CPU seconds of this process
and of the costing workers it started and joined (``getrusage`` of self and
children: the machine's load does not inflate them), and the largest resident
set of this process and of any worker.
"""

from __future__ import annotations

import resource
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from alpa_ir.costs.stage_table import StageCostTable
    from alpa_ir.hardware.clusters import Cluster
    from alpa_ir.pipeline.pipeline_replicas import ReplicatedPlan
from alpa_ir.pipeline.pipeline_replicas import DEFAULT_MAX_PIPELINE_DEVICES
from alpa_ir.tools.bench_outcome import Outcome


def cpu_seconds() -> float:
    """User and system CPU seconds of this process and its joined children so far."""
    return sum(
        getattr(resource.getrusage(who), f)
        for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
        for f in ("ru_utime", "ru_stime")
    )


def peak_rss_gib() -> tuple[float, float]:
    """The largest resident set so far of this process and of any joined child (GiB)."""
    me, kids = (resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
    return me.ru_maxrss / 2**20, kids.ru_maxrss / 2**20  # KiB -> GiB


@dataclass
class ScaledResult:
    """The scaled search's plan of one step and the figures of its planning."""

    found: ReplicatedPlan
    outcome: Outcome
    views: int
    pairs_costed: int
    times: dict[str, float] = field(default_factory=dict)
    """Wall seconds (trace, costing, dp, simulate, total), ``cpu``: CPU seconds
    of it all, and the CPU seconds of each part (``cpu_trace``, ``cpu_costing``
    with the workers', ``cpu_dp``, ``cpu_simulate``)."""

    def summary(self) -> dict[str, Any]:
        """JSON figures: replicas, pipeline, views, times, peak memory."""
        planner, worker = peak_rss_gib()
        return {
            "replicas": self.found.replicas,
            "pipeline_gpus": self.found.pipeline.num_devices,
            "replica_counts": sorted({c.replicas for c in self.found.candidates}),
            "sync_seconds": self.found.sync_seconds,
            "replica_zero": self.found.zero,
            "views": self.views,
            "pairs_costed": self.pairs_costed,
            "time": dict(self.times),
            "peak_rss_gib": {"planner": planner, "worker": worker},
        }


def plan_scaled(
    name: str,
    cluster: Cluster,
    num_micro_batches: int,
    *,
    layers: int,
    remat: bool = True,
    zero: bool = True,
    fusion: bool = True,
    memory_fallback: bool = True,
    time_limit: float = 60.0,
    cost_model: str = "auto",
    schedule: str = "1f1b",
    workers: int = 1,
    progress: bool = False,
    epsilon: float = 0.0,
    cross_stage_comm: bool = False,
    max_pipeline_gpus: int = DEFAULT_MAX_PIPELINE_DEVICES,
    dtype: str | None = None,
    full: bool = False,
    submesh_space: str = "all",
    cost_mode: str = "layer-sum",
    replica_zero: Sequence[int] | None = None,
    shorten: bool = True,
    tiled_attention: bool = False,
) -> ScaledResult:
    """Zoo model ``name`` on ``cluster`` at ``num_micro_batches`` micro-batches,
    planned by the scaled search and simulated (module docstring). ``full``:
    by the full search instead (one replica: the stage DP on a table of the
    whole cluster, ``submesh_space`` and ``cost_mode`` as ``construct-stages``
    takes them), Alpa's plan alone, without the baselines ``alpa-bench``
    prices beside it. ``replica_zero``: the ZeRO stages across replicas the
    search tries (None: none and ZeRO-2 with ``zero``, else none);
    ``tiled_attention``: the cost model's (FlashAttention's memory).
    ``shorten``: a model of repeated blocks with a layer per block is traced
    with a few blocks and its ``layer-sum`` table expanded to the full depth
    (:mod:`alpa_ir.pipeline.repeated_layers`: the same table without tracing
    every block); off, or where the pattern does not hold, the whole model is
    traced."""
    from alpa_ir.costs.analytical_stage_cost import AnalyticalStageCostModel
    from alpa_ir.costs.costing_workers import StartedWorkers
    from alpa_ir.costs.function_plan import bound_cost_model
    from alpa_ir.costs.stage_table import cost_table
    from alpa_ir.ir.module_utils import main_function
    from alpa_ir.models.train_step import train_step_flops
    from alpa_ir.pipeline.layer_phases import layer_phase_flops
    from alpa_ir.pipeline.layer_ranges import LayerRanges
    from alpa_ir.pipeline.pipeline_replicas import (
        plan_replicated,
        planned_replica_counts,
        scaled_cost_table,
    )
    from alpa_ir.plugins.registry import default_registry
    from alpa_ir.tools.bench_outcome import outcome
    from alpa_ir.tools.bench_suite import bench_optimizer, early_workers, shortened_trace, trace

    counts = (1,) if full else planned_replica_counts(cluster, num_micro_batches, max_pipeline_gpus)
    stage_pass = default_registry().get_pass("construct-stages")(
        cluster=cluster.name,
        num_micro_batches=num_micro_batches,
        cost_mode=cost_mode if full else "layer-sum",
        remat=remat,
        zero=zero,
        fusion=fusion,
        memory_fallback=memory_fallback,
        optimizer_state_factor=bench_optimizer(name)[1],
        time_limit=time_limit,
        cost_model=cost_model,
        progress=progress,
    )
    options = replace(stage_pass.cost_options(), tiled_attention=tiled_attention)
    flops = train_step_flops(name)
    cpu0, t0 = cpu_seconds(), time.perf_counter()
    model = AnalyticalStageCostModel(options)
    with StartedWorkers(early_workers(flops, workers)) as started:

        def costed(ranges: LayerRanges) -> StageCostTable:
            costing: dict[str, Any] = {
                "workers": workers,
                "progress": progress,
                "phase_flops": layer_phase_flops(ranges),
                "started": started,
            }
            if full:
                space = {"space": submesh_space, "cost_mode": cost_mode}
                return cost_table(ranges, cluster, model, **space, **costing)
            return scaled_cost_table(ranges, cluster, model, counts, **costing)

        mode = (cost_mode if full else "layer-sum") if shorten else "range"  # range: whole
        module, repeated = shortened_trace(name, num_micro_batches, layers, dtype, mode)
        t1, cpu1 = time.perf_counter(), cpu_seconds()
        table = costed(LayerRanges(main_function(module)))
        if repeated is not None:
            expanded = repeated.expand_table(table)
            if expanded is None:  # interior layers priced apart: the whole model after all
                whole = trace(name, num_micro_batches, layers, dtype)
                expanded = costed(LayerRanges(main_function(whole)))
            table = expanded
    t2, cpu2 = time.perf_counter(), cpu_seconds()
    found = plan_replicated(
        table,
        cluster,
        num_micro_batches,
        schedule,
        replicas=counts,
        pricer=bound_cost_model(options.cost_model, cluster),
        epsilon=epsilon,
        cross_stage_comm=cross_stage_comm,
        remat=remat,
        replica_zero=(0, 2) if replica_zero is None and zero else tuple(replica_zero or (0,)),
    )
    t3, cpu3 = time.perf_counter(), cpu_seconds()
    r = found.replicas
    plan = found.plan
    alpa = outcome(
        "alpa",
        found.table(table),
        plan.stages,
        found.num_micro_batches,
        flops / r,
        remat,
        plan.schedule,
        plan.mesh_of,
        plan.phase_times,
    )
    if not alpa.error:
        alpa.iteration_time += found.sync_seconds
        alpa.pflops = flops / alpa.iteration_time / 1e15
    t4, cpu4 = time.perf_counter(), cpu_seconds()
    times = {
        "trace": t1 - t0,
        "costing": t2 - t1,
        "dp": t3 - t2,
        "simulate": t4 - t3,
        "total": t4 - t0,
        "cpu": cpu4 - cpu0,
        "cpu_trace": cpu1 - cpu0,
        "cpu_costing": cpu2 - cpu1,
        "cpu_dp": cpu3 - cpu2,
        "cpu_simulate": cpu4 - cpu3,
    }
    views = sum(len(v) for v in table.views.values())
    return ScaledResult(found, alpa, views, table.pairs_costed, times)


__all__ = ["ScaledResult", "cpu_seconds", "peak_rss_gib", "plan_scaled"]
