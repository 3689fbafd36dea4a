"""alpa-bench's baselines with the artifact's own settings of each method:
the views each method runs on, and a method simulated with its own
mesh and remat on a tiny model."""

from __future__ import annotations

import pytest

from alpa_ir.errors import AlpaError
from alpa_ir.models.method_settings import MethodSetting, method_setting
from alpa_ir.tools.bench_own_settings import describe, own_setting_outcome, setting_views
from alpa_ir.tools.bench_suite import bench_cluster, trace, with_own_settings


def test_intra_op_runs_on_the_scripts_one_mesh() -> None:
    cluster = bench_cluster("alpa-testbed", 16)
    setting = method_setting("gpt3-6.7b", "intra-op")
    assert setting is not None
    views = setting_views(setting, cluster, "all")
    assert list(views) == [(2, 8)]
    assert [v.shape for v in views[(2, 8)]] == [(2, 8)]


def test_megatron_runs_on_its_published_view_and_pp_dp_on_dp_only_views() -> None:
    cluster = bench_cluster("alpa-testbed", 32)
    setting = method_setting("gpt3-15b", "megatron")
    assert setting is not None
    views = setting_views(setting, cluster, "all")
    assert list(views) == [(1, 4)] and [v.shape for v in views[(1, 4)]] == [(1, 4)]
    pp_dp = MethodSetting("wresnet-4b", "pp-dp", (384,), True, "x.py", data_parallel_only=True)
    dp_only = setting_views(pp_dp, bench_cluster("alpa-testbed", 16), "all")
    assert (2, 8) in dp_only and all(v.shape[-1] == 1 for vs in dp_only.values() for v in vs)
    # the row the artifact measured: its manual plan's meshes only
    manual = method_setting("wresnet-2b", "pp-dp")
    assert manual is not None
    views = setting_views(manual, bench_cluster("alpa-testbed", 8), "all")
    assert {p: [v.shape for v in vs] for p, vs in views.items()} == {
        (1, 4): [(4, 1)],
        (1, 1): [(1, 1)],
        (1, 2): [(2, 1)],
    }


def test_a_mesh_that_is_not_the_whole_cluster_is_refused() -> None:
    cluster = bench_cluster("alpa-testbed", 8)
    bad = MethodSetting("gpt3-2.6b", "intra-op", (32,), True, "x.py", logical_mesh=(2, 2))
    with pytest.raises(AlpaError, match="not all 8 devices"):
        setting_views(bad, cluster, "all")


def test_describe_names_the_settings_and_their_source() -> None:
    setting = method_setting("wresnet-4b", "intra-op")
    assert setting is not None
    text = describe(setting, 64)
    assert "B=64" in text and "mesh 2x8" in text and "no remat" in text
    assert "suite_artifact_e2e_wresnet.py" in text


def _outcome(setting: MethodSetting, micro: int, model: str = "gpt-tiny") -> dict[str, object]:
    cluster = bench_cluster("local-cpu", 4)
    out = own_setting_outcome(
        model,
        cluster,
        setting,
        micro,
        trace_step=lambda count, layers: trace(model, count, layers),
        layers=3,
        flops=1e9,
        stage_options={
            "cluster": cluster.name,
            "num_devices": 4,
            "time_limit": 5.0,
            "progress": False,
        },
        cost_mode="layer-sum",
        submesh_space="all",
        workers=1,
        progress=False,
    )
    assert not out.error, out.error
    return out.__dict__


def test_a_method_is_simulated_with_its_own_mesh_and_remat() -> None:
    on_4x1 = MethodSetting("gpt-tiny", "intra-op", (2,), True, "x.py", logical_mesh=(4, 1))
    on_2x2 = MethodSetting("gpt-tiny", "intra-op", (2,), True, "x.py", logical_mesh=(2, 2))
    a, b = _outcome(on_4x1, 2), _outcome(on_2x2, 2)
    assert [s["logical_mesh"] for s in a["stages"]] == [[4, 1]]  # type: ignore[attr-defined]
    assert [s["logical_mesh"] for s in b["stages"]] == [[2, 2]]  # type: ignore[attr-defined]
    assert a["iteration_time"] != b["iteration_time"]
    kept = MethodSetting("gpt-tiny", "intra-op", (2,), False, "x.py", logical_mesh=(4, 1))
    assert _outcome(kept, 2)["iteration_time"] < a["iteration_time"]  # no recomputation


def test_megatron_has_its_pipeline_degree() -> None:
    setting = MethodSetting(
        "gpt-tiny", "megatron", (4,), True, "x.py", logical_mesh=(2, 1), stages=2
    )
    out = _outcome(setting, 4)
    assert [s["logical_mesh"] for s in out["stages"]] == [[2, 1], [2, 1]]  # type: ignore[attr-defined]


def test_only_a_sizes_own_gpu_count_takes_the_settings() -> None:
    result = {"outcomes": [{"method": "intra-op"}], "compile_time": {}}
    kept = with_own_settings(dict(result), "gpt3-6.7b", bench_cluster("alpa-testbed", 8))
    assert (
        kept["outcomes"] == [{"method": "intra-op"}] and "own_settings" not in kept["compile_time"]
    )


def test_inter_op_takes_equal_layers_on_a_1x1_mesh_per_device() -> None:
    setting = MethodSetting("mlp-tiny", "inter-op", (4,), True, "x.py", uniform_layers=True)
    out = _outcome(setting, 4, "mlp-tiny")
    assert out["method"] == "inter-op"
    stages = out["stages"]
    assert [s["submesh"] for s in stages] == [[1, 1]] * 4  # type: ignore[attr-defined]
    assert [s["layers"] for s in stages] == [[k, k] for k in range(4)]  # type: ignore[attr-defined]


def test_one_device_keeps_the_clusters_device_profile() -> None:
    """The inter-op baseline prices its 1x1 stages on one device of the
    cluster: with the cluster's own prices (a V100's fp32 GEMMs, not a default)."""
    from alpa_ir.tools.bench_baselines import one_device

    cluster = bench_cluster("alpa-testbed", 8)
    single = one_device(cluster)
    assert single.num_devices == 1
    assert cluster.profile is not None and single.profile == cluster.profile


def test_a_row_measured_with_a_manual_plan_is_that_plan() -> None:
    """Wide-ResNet's PP-DP and inter-op rows ran the artifact's manual plans:
    simulated with exactly their stages, submeshes and logical meshes, not
    with a plan the stage DP finds (which would balance these stages)."""
    setting = MethodSetting(
        "mlp-tiny",
        "pp-dp",
        (4,),
        True,
        "x.py",
        data_parallel_only=True,
        stage_layer_ids=((0,), (1,), (2,)),
        submeshes=((1, 2), (1, 1), (1, 1)),
        logical_meshes=((2, 1), (1, 1), (1, 1)),
        artifact_layers=3,
    )
    out = _outcome(setting, 4, "mlp-tiny")
    assert out["method"] == "pp-dp"
    stages = out["stages"]
    assert [s["layers"] for s in stages] == [[0, 0], [1, 1], [2, 2]]  # type: ignore[attr-defined]
    assert [s["submesh"] for s in stages] == [[1, 2], [1, 1], [1, 1]]  # type: ignore[attr-defined]
    assert [s["logical_mesh"] for s in stages] == [[2, 1], [1, 1], [1, 1]]  # type: ignore[attr-defined]
    assert "manual plan of 3 stages" in describe(setting, 4)


def test_one_stage_row_is_the_micro_batches_times_the_whole_steps_price() -> None:
    # An intra-op row is one stage on one view: 1F1B has no bubble, so its step
    # is B times the stage's price of all its layers (priced here as one range,
    # apart from the row's layer sums and its simulation) plus one apply-grad.
    # A row simulated twice over (the pipeline's phases or a layer counted twice,
    # as once reported for GPT-3 1.3B: 97.8 s for a 51 s step) falls outside.
    from alpa_ir.costs.analytical_stage_cost import AnalyticalStageCostModel
    from alpa_ir.costs.stage_table import cost_table
    from alpa_ir.ir.module_utils import main_function
    from alpa_ir.pipeline.layer_ranges import LayerRanges
    from alpa_ir.plugins.registry import default_registry

    setting = MethodSetting("gpt-tiny", "intra-op", (4,), True, "x.py", logical_mesh=(4, 1))
    row = _outcome(setting, 4)
    cluster = bench_cluster("local-cpu", 4)
    options = {"cluster": cluster.name, "num_devices": 4, "time_limit": 5.0, "progress": False}
    stage_pass = default_registry().get_pass("construct-stages")(
        **options, num_micro_batches=4, remat=True, cost_mode="range"
    )
    ranges = LayerRanges(main_function(trace("gpt-tiny", 4, 3)))
    table = cost_table(
        ranges,
        cluster,
        AnalyticalStageCostModel(stage_pass.cost_options()),
        cost_mode="range",
        progress=False,
        views=setting_views(setting, cluster, "all"),
    )
    whole = table.cost(0, ranges.num_layers - 1, (4, 1)).latency
    assert row["iteration_time"] == pytest.approx(4 * whole, rel=0.1)
