"""The schedule chosen with the stages, pruned (issue #42): a plan is simulated
only if its busiest mesh alone could still beat the best step found so far,
and the pruned search returns the unpruned one's plan."""

from __future__ import annotations

import math

import numpy as np
import pytest

from alpa_ir.costs.stage_table import StageCostTable, ViewCost, submesh_views
from alpa_ir.errors import PlanError
from alpa_ir.hardware.clusters import Cluster, ClusterLevel
from alpa_ir.pipeline.pipeline_replicas import plan_replicated
from alpa_ir.pipeline.schedule_choice import AUTO_SCHEDULES
from alpa_ir.pipeline.stage_construction import (
    _simulated,
    busy_bound,
    choose_schedule,
    schedule_plans,
)


def _cluster(nodes: int, memory: float) -> Cluster:
    return Cluster(
        "pruning",
        (ClusterLevel("node", nodes, 1e9, 1e-5), ClusterLevel("gpu", 2, 1e11, 1e-6)),
        memory,
        1e12,
    )


def _table(cluster: Cluster, layers: int, seed: int, layer_sum: bool = False) -> StageCostTable:
    """Every range (``layer_sum``: every layer, ranges their sums) on every
    power-of-two view: latencies falling with the view's devices (noisy, so
    that plans differ), parameters, gradients, optimizer state and
    activations that make memory bind on small meshes."""
    rng = np.random.default_rng(seed)
    views = submesh_views(cluster, "power-of-two")
    table = StageCostTable(cluster, tuple(views), views, layers)
    if layer_sum:
        table.internal = (np.zeros((layers, layers)), np.zeros((layers, layers)))
    work = rng.uniform(0.5, 2.0, layers)
    for i in range(layers):
        for j in range(i, i + 1 if layer_sum else layers):
            for meshes in views.values():
                for view in meshes:
                    size = int(np.prod(view.shape))
                    latency = work[i : j + 1].sum() / size**0.8 * rng.uniform(0.9, 1.3)
                    params = 100.0 * (j - i + 1) / size
                    table.costs[(i, j, view.shape)] = ViewCost(
                        float(latency),
                        4 * params,
                        10.0 * (j - i + 1) / size,
                        8.0 * (j - i + 1) / size,
                        gradients=params,
                        optimizer_state=2 * params,
                    )
    return table


def _key(plan: object) -> tuple[object, ...]:
    return tuple((s.first, s.last, s.submesh, tuple(s.mesh.shape)) for s in plan.stages)  # type: ignore[attr-defined]


INSTANCES = [(seed, memory) for seed in range(3) for memory in (800.0, 1e9)]


@pytest.mark.parametrize(("seed", "memory"), INSTANCES)
def test_the_busiest_mesh_bounds_every_simulated_step(seed: int, memory: float) -> None:
    """busy_bound is a floor: no schedule's simulated plan runs faster."""
    table = _table(_cluster(2, memory), 7, seed)
    checked = 0
    for schedule in AUTO_SCHEDULES:
        plans = schedule_plans(table, 8, schedule)
        if isinstance(plans, str):
            continue
        for plan in plans:
            found = _simulated(table, plan, 8, schedule, True)
            if found.fits:
                assert found.iteration_time >= busy_bound(plan, 8) * (1 - 1e-12)
                checked += 1
    assert checked >= 3


@pytest.mark.parametrize(("seed", "memory"), INSTANCES)
def test_bounded_choice_is_the_unbounded_one(seed: int, memory: float) -> None:
    """choose_schedule with a bound of inf (and of the unbounded step) picks
    the unbounded choice: schedule, stages, meshes, simulated step."""
    table = _table(_cluster(2, memory), 7, seed)
    try:
        full = choose_schedule(table, 8, remat=True)
    except PlanError as error:  # the bounded search must fail alike
        with pytest.raises(type(error)):
            choose_schedule(table, 8, bound=math.inf, remat=True)
        return
    for bound in (math.inf, full[0].iteration_time):
        got = choose_schedule(table, 8, bound=bound, remat=True)
        assert got[0].schedule == full[0].schedule
        assert got[0].iteration_time == full[0].iteration_time
        assert got[0].in_flight == full[0].in_flight
        assert _key(got[0].plan) == _key(full[0].plan)
        assert got[0].plan.mesh_of == full[0].plan.mesh_of  # type: ignore[union-attr]


@pytest.mark.parametrize(("seed", "layer_sum"), [(0, False), (1, False), (0, True), (1, True)])
def test_pruned_replicated_search_finds_the_unpruned_plan(seed: int, layer_sum: bool) -> None:
    """plan_replicated(schedule=auto) with and without pruning: the same
    replica count, ZeRO stage, schedule, stages and step; pruning skipped
    simulations on these instances (some candidate is noted not simulated).
    ``layer_sum``: tables whose ranges are sums of their layers (the scaled search's)."""
    skipped = False
    for memory in (600.0, 1000.0):
        cluster = _cluster(4, memory)
        table = _table(cluster, 9, seed, layer_sum)
        kwargs = {"remat": True, "replica_zero": (0, 2)}
        full = plan_replicated(table, cluster, 16, "auto", prune=False, **kwargs)  # type: ignore[arg-type]
        pruned = plan_replicated(table, cluster, 16, "auto", **kwargs)  # type: ignore[arg-type]
        assert (pruned.replicas, pruned.zero) == (full.replicas, full.zero)
        assert pruned.plan.schedule == full.plan.schedule
        assert _key(pruned.plan) == _key(full.plan)
        assert pruned.plan.mesh_of == full.plan.mesh_of
        assert pruned.iteration_time == full.iteration_time
        skipped |= any(
            "not simulated" in c.note
            for r in pruned.candidates
            if r.plan is not None
            for c in r.plan.candidates
        ) or any("not simulated" in r.note for r in pruned.candidates)
    assert skipped
