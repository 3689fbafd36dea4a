"""alpa-bench's planning of a model of repeated blocks from a shortened trace
(:func:`alpa_ir.tools.bench_suite.shortened_trace`): the same plans, the same
simulated steps and the same baselines as from the whole model's trace."""

from __future__ import annotations

from alpa_ir.tools.bench_scaled import plan_scaled
from alpa_ir.tools.bench_suite import bench_cluster, bench_model, default_layers


def test_alpa_bench_plans_gpt3_350m_alike_from_a_shortened_trace() -> None:
    cluster = bench_cluster("alpa-testbed", 2)
    common = {
        "num_micro_batches": 128,
        "layers": default_layers("gpt3-350m"),
        "cost_mode": "layer-sum",
        "submesh_space": "all",
        "cross_stage_comm": False,
        "epsilon": 0.0,
        "time_limit": 60.0,
        "progress": False,
    }
    short = bench_model("gpt3-350m", cluster, **common)  # type: ignore[arg-type]
    whole = bench_model("gpt3-350m", cluster, shorten=False, **common)  # type: ignore[arg-type]
    assert short["layers"] == whole["layers"] == 25
    assert not short["outcomes"][0]["error"] and short["outcomes"][0]["stages"]
    assert short["outcomes"] == whole["outcomes"]  # Alpa's plan and every baseline
    assert short["cache"]["misses"] == whole["cache"]["misses"]  # 3 kinds of layer either way


def test_the_published_suites_plan_alike_from_a_shortened_trace() -> None:
    cluster = bench_cluster("alpa-testbed", 2)
    common = {"layers": default_layers("gpt3-350m"), "time_limit": 60.0, "full": True}
    short = plan_scaled("gpt3-350m", cluster, 128, **common)  # type: ignore[arg-type]
    whole = plan_scaled("gpt3-350m", cluster, 128, shorten=False, **common)  # type: ignore[arg-type]
    assert not short.outcome.error and short.outcome.stages
    assert short.outcome == whole.outcome
    assert short.pairs_costed < whole.pairs_costed  # 8 layers priced, not 25
