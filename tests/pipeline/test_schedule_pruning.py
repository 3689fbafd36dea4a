"""The schedule chosen with the stages, pruned (issue #42): a plan is simulated
only if its busiest mesh alone could still beat the best step found so far
and its meshes could hold their stages, a mesh split is balanced only if its
fullest mesh could fit, and the pruned search returns the unpruned one's plan."""

from __future__ import annotations

import math

import numpy as np
import pytest

from alpa_ir.costs.stage_table import StageCostTable, ViewCost, submesh_views
from alpa_ir.errors import PlanError
from alpa_ir.hardware.clusters import Cluster, ClusterLevel
from alpa_ir.pipeline.pipeline_replicas import plan_replicated
from alpa_ir.pipeline.pipeline_simulation import simulate
from alpa_ir.pipeline.schedule_choice import AUTO_SCHEDULES, stage_sim_plan
from alpa_ir.pipeline.stage_construction import (
    _equal_splits,
    _simulated,
    busy_bound,
    choose_schedule,
    held_floors,
    schedule_plans,
    solve_stages,
    step_floor,
)
from alpa_ir.pipeline.virtual_layout import balance_chunks, chunk_layout, memory_floor


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
    """busy_bound and step_floor (with the forward ahead of each mesh) are
    floors: no schedule's simulated plan runs faster."""
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
                floor = step_floor(table, plan, 8, True)
                assert floor >= busy_bound(plan, 8)
                assert found.iteration_time >= floor * (1 - 1e-12)
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


@pytest.mark.parametrize(("seed", "memory"), [(0, 450.0), (1, 450.0), (2, 700.0)])
def test_memory_floors_are_floors(seed: int, memory: float) -> None:
    """A mesh split's memory_floor is below the persistent bytes of its fullest
    mesh however the chunks are cut (balance_chunks' cut here), and a plan's
    held_floors are below the peaks the simulator finds on its meshes."""
    table = _table(_cluster(2, memory), 7, seed, layer_sum=True)
    checked = 0
    for schedule in ("interleaved-1f1b", "zb-v"):
        for meshes in _equal_splits(table, None):
            layout = chunk_layout(schedule, len(meshes), 2)
            if len(layout) > table.num_layers:
                continue
            found = balance_chunks(table, meshes, layout, schedule, 8)
            held = [0.0] * len(meshes)
            for chunk in found.chunks:
                cost = table.cost(chunk.first, chunk.last, tuple(meshes[chunk.mesh].mesh.shape))
                if chunk.choice and cost.memory_saving is not None:
                    cost = cost.memory_saving
                held[chunk.mesh] += cost.persistent
            assert memory_floor(table, meshes) <= max(held) * (1 + 1e-12)
            checked += 1
    assert checked >= 4
    for schedule in AUTO_SCHEDULES:
        plans = schedule_plans(table, 8, schedule)
        for plan in [] if isinstance(plans, str) else plans:
            sim = stage_sim_plan(table, plan.stages, 8, schedule, True, plan.mesh_of)
            peaks = simulate(sim, check_memory=False).peak_memory
            assert all(f <= p * (1 + 1e-12) for f, p in zip(held_floors(plan), peaks, strict=True))


@pytest.mark.parametrize("seed", range(3))
def test_memory_floors_keep_the_plan(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """choose_schedule with the memory floors (splits that cannot fit are not
    balanced, plans that cannot fit are not simulated) and without them: the
    same choice; the floors dropped something on these instances."""
    import alpa_ir.pipeline.stage_construction as construction

    dropped = 0
    for memory in (300.0, 450.0):
        table = _table(_cluster(4, memory), 9, seed, layer_sum=True)
        dropped += sum(memory_floor(table, m) > memory for m in _equal_splits(table, None))
        try:
            with_floors = choose_schedule(table, 16, remat=True)
        except PlanError:
            with_floors = None
        with monkeypatch.context() as patch:
            patch.setattr(construction, "memory_floor", lambda table, meshes: 0.0)
            patch.setattr(construction, "held_floors", lambda plan: [0.0])
            try:
                without = choose_schedule(table, 16, remat=True)
            except PlanError:
                assert with_floors is None
                continue
        assert with_floors is not None
        assert with_floors[0].schedule == without[0].schedule
        assert with_floors[0].iteration_time == without[0].iteration_time
        assert _key(with_floors[0].plan) == _key(without[0].plan)
        assert with_floors[0].plan.mesh_of == without[0].plan.mesh_of  # type: ignore[union-attr]
    assert dropped


@pytest.mark.parametrize(("seed", "memory"), INSTANCES)
def test_virtual_schedules_read_the_one_chunk_dp_solves(seed: int, memory: float) -> None:
    """Interleaved 1F1B and ZB-V run their DP on 1F1B's and ZB-H1's values with
    the sum halved, reading the solves those DPs made (solve_stages'
    dp_solves): the same plan and latency as each DP run alone, with fewer
    DP solves."""
    table = _table(_cluster(2, memory), 7, seed)
    shared: dict[str, dict[float, object]] = {}
    alone_solves = shared_solves = 0
    for schedule in ("1f1b", "zb-h1", "interleaved-1f1b", "zb-v"):
        try:
            alone = solve_stages(table, 8, schedule=schedule)
        except PlanError:
            with pytest.raises(PlanError):
                solve_stages(table, 8, schedule=schedule, dp_solves=shared)
            continue
        found = solve_stages(table, 8, schedule=schedule, dp_solves=shared)
        assert _key(found) == _key(alone)
        assert found.latency == alone.latency
        alone_solves += alone.dp_solves
        shared_solves += found.dp_solves
    assert set(shared) <= {"1f1b", "zb-h1"}
    assert 0 < shared_solves < alone_solves
