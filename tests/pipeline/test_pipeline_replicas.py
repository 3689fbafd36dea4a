"""The search that scales: data-parallel replicas of one pipeline outside the
stage DP, one cost table for every replica count, the power-of-two submesh
space, and the full search kept where it runs (exactness)."""

from __future__ import annotations

import numpy as np
import pytest
from stage_fixtures import _deep_module

from alpa_ir.costs.analytical_stage_cost import AnalyticalStageCostModel
from alpa_ir.costs.stage_table import StageCostTable, ViewCost, submesh_views
from alpa_ir.errors import AlpaError, PlanError
from alpa_ir.hardware.clusters import Cluster, ClusterLevel
from alpa_ir.ir.module_utils import main_function
from alpa_ir.pipeline.layer_ranges import LayerRanges
from alpa_ir.pipeline.pipeline_replicas import (
    count_views,
    pipeline_cluster,
    plan_replicated,
    planned_replica_counts,
    replica_counts,
    replica_sync_seconds,
    replica_zero_table,
    scaled_cost_table,
    search_kind,
    sub_table,
)
from alpa_ir.pipeline.stage_construction import plan_stages


def _cluster(nodes: int, per_node: int = 2, memory: float = 1e9, shared: bool = False) -> Cluster:
    return Cluster(
        "replicas",
        (
            ClusterLevel("node", nodes, 1e9, 1e-5, shared=shared),
            ClusterLevel("gpu", per_node, 1e11, 1e-6),
        ),
        memory,
        1e12,
    )


def _random_table(cluster: Cluster, layers: int, seed: int, space: str = "all") -> StageCostTable:
    """Every range on every view: a latency falling with the view's devices (and
    noise, so that views and submeshes differ), parameters, activations and
    gradients."""
    rng = np.random.default_rng(seed)
    views = submesh_views(cluster, space)
    table = StageCostTable(cluster, tuple(views), views, layers)
    work = rng.uniform(0.5, 2.0, layers)
    for i in range(layers):
        for j in range(i, layers):
            for meshes in views.values():
                for view in meshes:
                    size = int(np.prod(view.shape))
                    latency = work[i : j + 1].sum() / size**0.8 * rng.uniform(0.9, 1.3)
                    params = 100.0 * (j - i + 1) / size
                    table.costs[(i, j, view.shape)] = ViewCost(
                        float(latency), 4 * params, 10.0, 8.0, gradients=params
                    )
    return table


def test_one_replica_is_the_stage_dp() -> None:
    """replicas=(1,) on the whole cluster's table: the same plan and latency."""
    cluster = _cluster(4)
    table = _random_table(cluster, 5, seed=0)
    full = plan_stages(table, 8)
    one = plan_replicated(table, cluster, 8, replicas=(1,))
    assert one.replicas == 1 and one.sync_seconds == 0.0
    assert one.plan.latency == full.latency
    assert [(s.first, s.last, s.submesh) for s in one.plan.stages] == [
        (s.first, s.last, s.submesh) for s in full.stages
    ]


@pytest.mark.parametrize("seed", range(4))
def test_several_replica_counts_are_the_best_of_each_planned_alone(seed: int) -> None:
    """One table of the whole cluster read per replica count equals a table
    built for each pipeline's own cluster, planned alone, plus its all-reduce."""
    cluster = _cluster(4)
    table = _random_table(cluster, 5, seed=seed)
    found = plan_replicated(table, cluster, 8)
    assert [c.replicas for c in found.candidates] == [1, 2, 4]
    best = np.inf
    for r in (1, 2, 4):
        pipeline = pipeline_cluster(cluster, 4 // r)
        alone = _random_table(pipeline, 5, seed=seed)  # different noise: re-key below
        alone.costs = {k: v for k, v in table.costs.items() if k[2] in _shapes(alone)}
        plan = plan_stages(alone, 8 // r)
        total = plan.latency + replica_sync_seconds(cluster, plan, r)
        best = min(best, total)
        got = next(c for c in found.candidates if c.replicas == r)
        assert got.iteration_time == pytest.approx(total, rel=1e-12)
    assert found.iteration_time == pytest.approx(best, rel=1e-12)
    assert found.num_micro_batches * found.replicas == 8


def _shapes(table: StageCostTable) -> set[tuple[int, ...]]:
    return {tuple(v.shape) for views in table.views.values() for v in views}


def test_sync_is_an_all_reduce_across_nodes_per_mesh() -> None:
    """Two replicas of a one-node pipeline: each GPU all-reduces its gradients
    with its peer on the other node, over the node link: α + β·2(r−1)/r·bytes;
    with a shared NIC the node's two groups share it (β doubled)."""
    for shared, factor in ((False, 1.0), (True, 2.0)):
        cluster = _cluster(2, shared=shared)
        table = _random_table(cluster, 3, seed=1)
        found = plan_replicated(table, cluster, 4, replicas=(2,))
        grads = max(s.cost.gradients for s in found.plan.stages)  # one stage per mesh
        expected = 1e-5 + factor / 1e9 * 2 * (2 - 1) / 2 * grads
        assert found.sync_seconds == pytest.approx(expected, rel=1e-9)
        assert found.pipeline.num_devices == 2


def test_replica_counts_divide_nodes_and_micro_batches() -> None:
    assert replica_counts(12, 8, 12) == (1, 2, 4)
    assert replica_counts(12, 8, 3) == (4,)
    assert replica_counts(12, 3, 2) == ()


def test_no_replica_count_is_a_plan_error() -> None:
    cluster = _cluster(4)
    table = _random_table(pipeline_cluster(cluster, 1), 2, seed=0)
    with pytest.raises(PlanError, match="no replica count divides"):
        plan_replicated(table, cluster, 1)  # one micro-batch cannot be split over 4
    with pytest.raises(AlpaError, match="3 replicas do not divide"):
        plan_replicated(table, cluster, 8, replicas=(3,))


def test_pipeline_cluster_keeps_the_levels_its_nodes_span() -> None:
    levels = (
        ClusterLevel("pod", 3, 1e9, 3e-6),
        ClusterLevel("su", 8, 2e9, 2e-6),
        ClusterLevel("node", 16, 4e9, 1e-6),
        ClusterLevel("gpu", 8, 1e11, 1e-7),
    )
    cluster = Cluster("tiers", levels, 1e9, 1e12)
    assert [lv.cardinality for lv in pipeline_cluster(cluster, 96).levels] == [6, 16, 8]
    assert [lv.name for lv in pipeline_cluster(cluster, 256).levels] == ["pod", "su", "node", "gpu"]
    assert [lv.cardinality for lv in pipeline_cluster(cluster, 8).levels] == [8, 8]
    assert [lv.cardinality for lv in pipeline_cluster(cluster, 1).levels] == [8]
    with pytest.raises(
        AlpaError, match="24 nodes are not a whole number of its 'node' units of 16"
    ):
        pipeline_cluster(cluster, 24)
    # a view of the pipeline is priced as the same devices of the whole cluster
    sub = pipeline_cluster(cluster, 32)
    assert sub.logical_mesh((4, 64)).beta == cluster.logical_mesh((4, 64)).beta


def test_sub_table_reads_the_submeshes_that_fit() -> None:
    cluster = _cluster(8)
    table = _random_table(cluster, 2, seed=0, space="power-of-two")
    assert table.submeshes == ((1, 1), (1, 2), (2, 2), (4, 2), (8, 2))
    small = sub_table(table, pipeline_cluster(cluster, 4))
    assert small.submeshes == ((1, 1), (1, 2), (2, 2), (4, 2))
    assert small.costs is table.costs
    with pytest.raises(AlpaError, match="cannot plan 16 nodes"):
        sub_table(small, _cluster(16))


def test_views_counted_per_space_and_the_search_kept_full_where_it_runs() -> None:
    small = _cluster(8, per_node=8)  # 64 GPUs: Alpa's 62 views
    assert count_views(small) == sum(len(v) for v in submesh_views(small, "all").values()) == 62
    power = sum(len(v) for v in submesh_views(small, "power-of-two").values())
    assert count_views(small, "power-of-two") == power == 28
    assert search_kind(small) == "full"
    assert search_kind(_cluster(128, per_node=8)) == "scaled"
    assert search_kind(small, "scaled") == "scaled"
    with pytest.raises(AlpaError, match="search must be one of"):
        search_kind(small, "fast")


def test_a_real_table_plans_replicas_with_measured_gradients() -> None:
    """The deep test step costed by the analytical model on a power-of-two
    space: every stage's gradients are its parameters' bytes per device, and
    replicas need the all-reduce one pipeline does not."""
    ranges = LayerRanges(main_function(_deep_module()))
    cluster = _cluster(4, per_node=2, memory=2**30)
    counts = planned_replica_counts(cluster, 4, max_devices=4)
    assert counts == (2, 4)
    table = scaled_cost_table(ranges, cluster, AnalyticalStageCostModel(), counts, progress=False)
    assert table.cluster.num_nodes == 2 and table.submeshes == ((1, 1), (1, 2), (2, 2))
    layer = table.cost(0, 0, (1, 1))
    assert layer.gradients == 16 * 16 * 4  # one 16x16 f32 weight
    found = plan_replicated(table, cluster, 4)
    assert [c.replicas for c in found.candidates] == [2, 4]
    assert all(c.sync_seconds > 0 for c in found.candidates)
    assert found.iteration_time == min(c.iteration_time for c in found.candidates)


def test_planned_replica_counts_skip_pipelines_that_split_a_unit() -> None:
    """384 nodes in units of 16 (DGX SuperPOD-like): a pipeline of 24 nodes
    would split a unit, so 16 replicas are not planned; none fits: one line."""
    levels = (
        ClusterLevel("pod", 24, 1e9, 3e-6),
        ClusterLevel("node", 16, 4e9, 1e-6),
        ClusterLevel("gpu", 8, 1e11, 1e-7),
    )
    cluster = Cluster("tiers", levels, 1e9, 1e12)
    assert planned_replica_counts(cluster, 128, max_devices=512) == (8, 32, 64, 128)
    with pytest.raises(PlanError, match="no replica count divides"):
        planned_replica_counts(cluster, 1, max_devices=512)


def _zero_instance(memory: float = 300.0) -> tuple[Cluster, StageCostTable]:
    """Two one-GPU nodes, one layer: on one GPU 1.0 s per micro-batch and
    100 B of parameters, 100 of gradients, 200 of optimizer state (400 held,
    10 per micro-batch); on both GPUs 0.7 s and 220 held. 300 B per GPU."""
    cluster = _cluster(2, per_node=1, memory=memory)
    views = submesh_views(cluster, "power-of-two")
    table = StageCostTable(cluster, tuple(views), views, 1)
    for meshes in views.values():
        for view in meshes:
            one = int(np.prod(view.shape)) == 1
            table.costs[(0, 0, view.shape)] = ViewCost(
                1.0 if one else 0.7,
                400.0 if one else 220.0,
                10.0,
                8.0,
                gradients=100.0 if one else 50.0,
                optimizer_state=200.0 if one else 100.0,
            )
    return cluster, table


def test_zero_across_replicas_lets_a_narrower_pipeline_fit_and_win() -> None:
    """Hand computation. One replica on both GPUs: 4 micro-batches of 0.7 s =
    2.8 s. Two replicas of one GPU hold 400 + 10 > 300 B without ZeRO, and
    400 − 200/2 + 10 = 310 B with ZeRO-1 (neither fits); with ZeRO-2 across
    them 400 − 300/2 + 10 = 260 B: 2 micro-batches of 1.0 s, then a
    reduce-scatter and an all-gather of 100 B over the node link
    (2 × (10 µs + 1 ns/B · ½ · 100 B)): 2.0000201 s, ahead of 2.8 s."""
    cluster, table = _zero_instance()
    found = plan_replicated(table, cluster, 4, replica_zero=(0, 1, 2))
    tried = {(c.replicas, c.zero): c for c in found.candidates}
    assert set(tried) == {(1, 0), (2, 0), (2, 1), (2, 2)}
    assert tried[(1, 0)].iteration_time == pytest.approx(2.8)
    assert tried[(2, 0)].plan is None and tried[(2, 1)].plan is None
    sync = 2 * (1e-5 + 1e-9 * 0.5 * 100)
    assert tried[(2, 2)].sync_seconds == pytest.approx(sync, rel=1e-12)
    assert found.replicas == 2 and found.zero == 2
    assert found.iteration_time == pytest.approx(2.0 + sync, rel=1e-12)
    # the stages the simulator gets hold ZeRO-2's bytes
    stage = found.table(table).cost(0, 0, (1, 1))
    assert stage.persistent == 250.0 and stage.gradients == 100.0
    # without ZeRO across replicas (the default) one replica of two GPUs wins
    plain = plan_replicated(table, cluster, 4)
    assert (plain.replicas, plain.zero) == (1, 0)
    assert plain.iteration_time == pytest.approx(2.8)


def test_zero_across_replicas_costs_nothing_when_all_fit() -> None:
    """With memory enough for all, ZeRO-2's reduce-scatter and all-gather move
    what the all-reduce moves (α twice: 2.0000201 against 2.0000101 s), so
    the plain all-reduce is kept; one replica has nothing to partition."""
    cluster, table = _zero_instance(memory=1e9)
    found = plan_replicated(table, cluster, 4, replica_zero=(0, 2))
    tried = {(c.replicas, c.zero): c for c in found.candidates}
    assert tried[(2, 0)].sync_seconds == pytest.approx(1e-5 + 1e-9 * 100, rel=1e-12)
    assert (found.replicas, found.zero) == (2, 0)
    assert replica_zero_table(table, 1, 2) is table
    with pytest.raises(AlpaError, match="ZeRO across replicas must be one of"):
        plan_replicated(table, cluster, 4, replica_zero=(3,))


def test_zero_table_of_shared_costs_equals_each_cost_zeroed() -> None:
    """An expanded table's layers share their cost objects: the ZeRO table
    zeroes each object once (shared in the result too), and every entry equals
    the entry zeroed on its own (the slow path)."""
    from alpa_ir.pipeline.pipeline_replicas import _zero_view

    cluster = _cluster(2)
    views = submesh_views(cluster, "all")
    table = StageCostTable(cluster, tuple(views), views, 6)
    saving = ViewCost(2.0, 50.0, 10.0, 8.0, gradients=20.0, optimizer_state=25.0)
    interior = ViewCost(1.0, 100.0, 10.0, 8.0, memory_saving=saving, gradients=30.0)
    for meshes in views.values():
        for view in meshes:
            edge = ViewCost(0.5, 40.0, 5.0, 4.0, gradients=10.0, optimizer_state=20.0)
            for k in range(6):
                table.costs[(k, k, view.shape)] = edge if k in (0, 5) else interior
    for stage in (1, 2):
        zeroed = replica_zero_table(table, 4, stage)
        assert zeroed.costs == {
            key: _zero_view(cost, 4, stage) for key, cost in table.costs.items()
        }
        inner = {id(zeroed.costs[(k, k, (1, 1))]) for k in range(1, 5)}
        assert len(inner) == 1
        kept = 25.0 + (20.0 if stage == 2 else 0.0)  # optimizer state (and gradients)
        assert zeroed.costs[(2, 2, (1, 1))].memory_saving.persistent == 50.0 - kept * 0.75
