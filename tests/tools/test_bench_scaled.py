"""alpa-bench's planner row beyond the full search: the scaled search's plan
of a zoo step (data-parallel replicas of one pipeline), simulated, with the
replicas' gradient all-reduce in its iteration time."""

from __future__ import annotations

import math

from alpa_ir.pipeline.pipeline_replicas import search_kind
from alpa_ir.tools.bench_scaled import plan_scaled
from alpa_ir.tools.bench_suite import bench_cluster, bench_model


def test_a_cluster_beyond_the_full_search_gets_a_replicated_plan() -> None:
    cluster = bench_cluster("dgx-a100", 1024)
    assert search_kind(cluster) == "scaled"
    result = plan_scaled(
        "gpt-tiny", cluster, 8, layers=3, max_pipeline_gpus=128, time_limit=5.0, workers=1
    )
    found, alpa = result.found, result.outcome
    assert not alpa.error and math.isfinite(alpa.iteration_time)
    assert found.replicas * found.pipeline.num_devices == 1024
    # 8 micro-batches: 8 replicas of 16 nodes (32 nodes are no block of 20-node units)
    # each with and without ZeRO-2 across the replicas (plan_scaled's zero)
    assert [(c.replicas, c.zero) for c in found.candidates] == [(8, 0), (8, 2)]
    assert found.num_micro_batches == 1
    assert found.sync_seconds > 0
    # one replica's simulated pipeline plus the all-reduce across replicas
    assert alpa.iteration_time > found.sync_seconds
    assert alpa.pflops * alpa.iteration_time > 0
    summary = result.summary()
    assert summary["replicas"] == found.replicas and summary["views"] == result.views
    assert summary["replica_zero"] == found.zero
    assert summary["time"]["cpu"] > 0 and summary["peak_rss_gib"]["planner"] > 0
    parts = [summary["time"][f"cpu_{p}"] for p in ("trace", "costing", "dp", "simulate")]
    assert min(parts) >= 0 and math.isclose(sum(parts), summary["time"]["cpu"])


def test_the_full_search_alone_plans_as_alpa_bench_does() -> None:
    """``full=True``: Alpa's own plan without the baselines, the same stages and
    simulated step as ``alpa-bench``'s ``alpa`` row (the published suites time
    the planner alone with it)."""
    cluster = bench_cluster("local-cpu", 4)
    common = {"layers": 2, "time_limit": 60.0, "epsilon": 0.0, "cross_stage_comm": False}
    alone = plan_scaled("mlp-tiny", cluster, 2, full=True, **common)  # type: ignore[arg-type]
    bench = bench_model(
        "mlp-tiny",
        cluster,
        num_micro_batches=2,
        cost_mode="layer-sum",
        submesh_space="all",
        **common,  # type: ignore[arg-type]
    )
    alpa = bench["outcomes"][0]
    assert alone.found.replicas == 1 and alone.found.sync_seconds == 0.0
    assert alone.outcome.stages == alpa["stages"]
    assert alone.outcome.iteration_time == alpa["iteration_time"]
    assert len(bench["outcomes"]) > 1  # alpa-bench also priced the baselines
