"""alpa-bench on a tiny model and cluster: the plan, baselines, timings, JSON;
remat, the DeepSpeed-style MoE baseline (grid, argument shardings)."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from alpa_ir.dialects.types import shape_of
from alpa_ir.tools.alpa_bench import format_result, main
from alpa_ir.tools.bench_baselines import deepspeed_specs, deepspeed_views
from alpa_ir.tools.bench_suite import (
    batch_divisors,
    bench_cluster,
    bench_optimizer,
    default_layers,
    trace,
)


def test_bench_cluster_below_one_node() -> None:
    cluster = bench_cluster("alpa-testbed", 4)
    assert cluster.num_devices == 4 and cluster.num_nodes == 1
    assert bench_cluster("alpa-testbed", 16).num_nodes == 2


def test_automatic_layers_are_one_per_block_and_one_more() -> None:
    assert default_layers("gpt3-39b") == 48 + 1  # transformer layers
    assert default_layers("moe-27b") == 16 + 1
    assert default_layers("wresnet-250m") == 3 + 4 + 6 + 3 + 1  # bottleneck blocks
    assert default_layers("gpt-tiny") == 2 + 1


def test_layers_must_be_auto_or_a_positive_count(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--models=mlp-tiny", "--layers=zero"])
    assert "--layers must be 'auto' or a positive integer, got 'zero'" in capsys.readouterr().err


def test_moe_trains_with_adafactor_as_alpas_benchmark() -> None:
    assert bench_optimizer("moe-70b") == ("adafactor", 0.0)
    assert bench_optimizer("gpt3-39b") == ("adam", 2.0)


def test_wresnet_trains_with_nesterov_momentum_as_alpas_benchmark() -> None:
    import jax
    import jax.numpy as jnp

    from alpa_ir.models.train_step import make_optimizer

    assert bench_optimizer("wresnet-4b") == ("sgd-momentum", 1.0)
    params = {"conv": jnp.ones((3, 3, 4, 8)), "scale": jnp.ones((8,))}
    tx = make_optimizer("sgd-momentum", 0.1)
    state = tx.init(params)
    # one momentum per parameter, as the state factor 1.0 prices it
    assert sum(m.size for m in jax.tree.leaves(state)) == 3 * 3 * 4 * 8 + 8
    grads = {"conv": jnp.ones((3, 3, 4, 8)), "scale": jnp.ones((8,))}
    updates, _ = tx.update(grads, state, params)
    # Nesterov's first update: -lr * (g + 0.9 g)
    assert float(updates["scale"][0]) == pytest.approx(-0.1 * 1.9)


def test_an_adafactor_step_runs() -> None:
    import jax

    from alpa_ir.models.train_step import make_train_step

    step, (state, batch) = make_train_step("moe-tiny", optimizer="adafactor")
    new_state, loss = jax.jit(step)(state, batch)
    assert bool(jax.numpy.isfinite(loss))
    assert jax.tree.structure(new_state) == jax.tree.structure(state)


def test_batch_divisors_are_powers_of_two() -> None:
    assert batch_divisors(24, 64) == [1, 2, 4, 8]


def test_tiny_bench_json(capsys: pytest.CaptureFixture[str]) -> None:
    argv = [
        "--models=mlp-tiny",
        "--cluster=local-cpu",
        "--gpus=2",
        "--layers=2",
        "--micro-batches=auto",
        "--max-micro-batches=2",
        "--json",
    ]
    assert main(argv) == 0
    (result,) = json.loads(capsys.readouterr().out)
    assert [t["num_micro_batches"] for t in result["micro_batch_search"]] == [1, 2]
    methods = {o["method"]: o for o in result["outcomes"]}
    assert set(methods) == {"alpa", "alpa+comm", "intra-op", "inter-op"}
    alpa = methods["alpa"]
    # option 6a on the same table: its DP objective adds the transfers, never lowers it
    assert methods["alpa+comm"]["eq2_latency"] >= alpa["eq2_latency"] - 1e-12
    assert alpa["eq2_latency"] > 0
    assert alpa["iteration_time"] > 0 and alpa["pflops"] > 0
    covered = [layer for s in alpa["stages"] for layer in range(s["layers"][0], s["layers"][1] + 1)]
    assert covered == [0, 1]
    assert sum(s["submesh"][0] * s["submesh"][1] for s in alpa["stages"]) == 2
    times = result["compile_time"]
    assert times["total"] == pytest.approx(
        times["clustering"] + times["costing"] + times["dp"] + times["other"]
    )


def test_beyond_1024_views_the_search_that_scales_plans(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """1,024 GPUs of 8-GPU nodes have 1,746 views of Alpa's space: the run is
    planned by the search that scales (replicas of one pipeline) and says so."""
    argv = ["--models=mlp-tiny", "--gpus=1024", "--layers=2", "--micro-batches=8"]
    assert main([*argv, "--workers=1", "--json", "--quiet"]) == 0
    (result,) = json.loads(capsys.readouterr().out)
    search = result["search"]
    assert search["kind"] == "scaled"
    assert search["replicas"] * search["pipeline_gpus"] == 1024
    assert search["replica_counts"] == [2, 4, 8]  # pipelines of at most 512 GPUs
    (alpa,) = result["outcomes"]
    assert not alpa["error"] and math.isfinite(alpa["iteration_time"]) and alpa["pflops"] > 0
    used = sum(s["submesh"][0] * s["submesh"][1] for s in alpa["stages"])
    assert used == search["pipeline_gpus"]
    assert (
        format_result(result)
        .splitlines()[-2]
        .startswith(
            f"  search: scaled (Alpa's full space has more than 1024 logical mesh views): "
            f"{search['replicas']} data-parallel replicas"
        )
    )


@pytest.mark.parametrize("schedule", ["auto", "zb-v", "interleaved-1f1b"])
def test_the_alpa_row_times_the_plan_as_the_planner_did(
    capsys: pytest.CaptureFixture[str], schedule: str
) -> None:
    """Virtual plans on their shared meshes, zero-bubble ones with the order the
    plan keeps: the row's time is the chosen candidate's."""
    argv = ["--models=mlp-tiny", "--cluster=local-cpu", "--gpus=2", "--layers=4",
            "--micro-batches=4", f"--schedule={schedule}", "--json"]  # fmt: skip
    assert main(argv) == 0
    (result,) = json.loads(capsys.readouterr().out)
    alpa = next(o for o in result["outcomes"] if o["method"] == "alpa")
    assert alpa["error"] == "" and 0 < alpa["iteration_time"] < math.inf
    if schedule == "auto":
        chosen = result["schedules"][alpa["schedule"]]
        assert alpa["iteration_time"] == pytest.approx(chosen["iteration_time"], rel=1e-9)
    else:
        assert alpa["schedule"] == schedule and len(alpa["stages"]) == 4
        assert len({tuple(s["devices"]) for s in alpa["stages"]}) == 2


def test_tiny_bench_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(
            [
                "--models=mlp-tiny",
                "--cluster=local-cpu",
                "--gpus=2",
                "--layers=2",
                "--micro-batches=2",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "mlp-tiny on 2 GPUs" in out and "intra-op" in out and "compile time" in out


def _bench_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    assert main([*argv, "--json"]) == 0
    (result,) = json.loads(capsys.readouterr().out)
    return result  # type: ignore[no-any-return]


def test_remat_lowers_memory_and_raises_time(capsys: pytest.CaptureFixture[str]) -> None:
    common = ("--models=mlp-tiny", "--cluster=local-cpu", "--gpus=2", "--layers=2")
    runs = {
        flag: _bench_json(capsys, *common, "--micro-batches=4", flag)
        for flag in ("--remat", "--no-remat")
    }
    assert runs["--remat"]["remat"] and not runs["--no-remat"]["remat"]
    # inter-op: two 1x1 stages, the first holds 2 micro-batches in flight under 1F1B
    on, off = ({o["method"]: o for o in runs[f]["outcomes"]}["inter-op"] for f in runs)
    assert on["stages"] == off["stages"]
    assert on["peak_memory_gib"] < off["peak_memory_gib"]
    assert on["iteration_time"] > off["iteration_time"]


def test_moe_has_the_deepspeed_baseline(capsys: pytest.CaptureFixture[str]) -> None:
    result = _bench_json(
        capsys,
        "--models=moe-tiny",
        "--cluster=local-cpu",
        "--gpus=2",
        "--layers=2",
        "--micro-batches=2",
        "--time-limit=5",
    )
    methods = {o["method"]: o for o in result["outcomes"]}
    assert set(methods) == {"alpa", "alpa+comm", "intra-op", "inter-op", "deepspeed"}
    ds = methods["deepspeed"]
    assert not ds["error"] and ds["iteration_time"] > 0 and ds["pflops"] > 0
    assert ds["pflops_ignoring_memory"] == pytest.approx(ds["pflops"])  # it fits
    (stage,) = ds["stages"]  # no pipeline: one stage on every device
    assert stage["layers"] == [0, 1] and stage["submesh"] == [1, 2]
    assert stage["logical_mesh"] == [1, 2]


def test_deepspeed_specs_split_experts_and_tokens() -> None:
    from alpa_ir.ir.module_utils import main_function
    from alpa_ir.pipeline.layer_ranges import LayerRanges

    ranges = LayerRanges(main_function(trace("moe-tiny", 2, 2)))
    experts = 8
    seen_expert = False
    for k in range(ranges.num_layers):
        extracted = ranges.function(k, k)
        specs = deepspeed_specs(extracted.function, extracted.param_args, experts, (2, 4))
        for index, arg in enumerate(extracted.function.body.block.args):
            shape = tuple(shape_of(arg.type))
            spec = specs.get(index)
            if index in extracted.param_args:
                assert spec is not None
                if len(shape) >= 2 and shape[0] == experts:
                    seen_expert = True
                    assert spec.dims[0] == (1,) and all(not d for d in spec.dims[1:])
                else:
                    assert spec.is_replicated()
            elif shape and shape[0] % 8 == 0:
                assert spec is not None and spec.dims[0] == (0, 1)
    assert seen_expert


def test_deepspeed_grid_is_the_views_whose_minor_axis_divides_the_experts() -> None:
    from alpa_ir.costs.stage_table import StageCostTable, submesh_views

    cluster = bench_cluster("alpa-testbed", 32)
    views = submesh_views(cluster, "all")
    table = StageCostTable(cluster, tuple(views), views, 1)
    shapes = {v.shape for v in deepspeed_views(table, 48)}
    assert shapes == {(4, 8), (2, 16)}  # ep 32 does not divide 48 experts
    assert {v.shape for v in deepspeed_views(table, 64)} == {(4, 8), (2, 16), (1, 32)}


def test_inter_op_gets_a_layer_per_device(capsys: pytest.CaptureFixture[str]) -> None:
    result = _bench_json(
        capsys,
        "--models=mlp-tiny",
        "--cluster=local-cpu",
        "--gpus=4",
        "--layers=2",
        "--micro-batches=4",
        "--time-limit=5",
    )
    assert result["layers"] == 2
    inter = {o["method"]: o for o in result["outcomes"]}["inter-op"]
    assert not inter["error"]
    assert [s["submesh"] for s in inter["stages"]] == [[1, 1]] * 4
    covered = [
        layer for s in inter["stages"] for layer in range(s["layers"][0], s["layers"][1] + 1)
    ]
    assert covered == [0, 1, 2, 3]


def test_tracing_and_costing_run_with_rare_full_collections(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """As under the API: full collections walk the whole heap (GPT-3 39B's
    costing: 34 s with Python's thresholds, 29.5 s with the planning ones)."""
    import gc

    from alpa_ir.costs import stage_table
    from alpa_ir.ir.collection import PLANNING_THRESHOLDS
    from alpa_ir.tools import bench_suite

    seen: dict[str, tuple[int, ...]] = {}
    real_trace, real_table = bench_suite.trace, stage_table.cost_table

    def trace_spy(*args: Any) -> Any:
        seen["trace"] = gc.get_threshold()
        return real_trace(*args)

    def table_spy(*args: Any, **kwargs: Any) -> Any:
        seen["costing"] = gc.get_threshold()
        return real_table(*args, **kwargs)

    monkeypatch.setattr(bench_suite, "trace", trace_spy)
    monkeypatch.setattr(stage_table, "cost_table", table_spy)
    before = gc.get_threshold()
    argv = ["--models=mlp-tiny", "--cluster=local-cpu", "--gpus=2", "--layers=2",
            "--micro-batches=2", "--json"]  # fmt: skip
    assert main(argv) == 0
    capsys.readouterr()
    for phase in ("trace", "costing"):
        assert all(t >= p for t, p in zip(seen[phase], PLANNING_THRESHOLDS, strict=True)), phase
    assert gc.get_threshold() == before


def test_a_real_size_step_starts_its_costing_workers_before_it_is_traced(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Workers import the compiler while a zoo model is traced; the cost
    table takes them. The tiny test models start none."""
    from alpa_ir.costs import stage_table
    from alpa_ir.costs.costing_workers import StartedWorkers
    from alpa_ir.models.train_step import train_step_flops
    from alpa_ir.tools import bench_suite

    assert bench_suite.early_workers(train_step_flops("gpt3-39b"), 2) == 1
    assert bench_suite.early_workers(train_step_flops("gpt3-350m"), 4) == 3
    assert bench_suite.early_workers(train_step_flops("gpt-tiny"), 2) == 0
    assert bench_suite.early_workers(train_step_flops("gpt3-39b"), 1) == 0
    seen: list[object] = []
    real_table = stage_table.cost_table

    def table_spy(*args: Any, **kwargs: Any) -> Any:
        seen.append(kwargs.get("started"))
        return real_table(*args, **kwargs)

    monkeypatch.setattr(stage_table, "cost_table", table_spy)
    monkeypatch.setattr(bench_suite, "early_workers", lambda flops, workers: 1)
    argv = ["--models=mlp-tiny", "--cluster=local-cpu", "--gpus=2", "--layers=2",
            "--micro-batches=2", "--workers=2", "--json"]  # fmt: skip
    assert main(argv) == 0
    capsys.readouterr()
    (started,) = seen
    assert isinstance(started, StartedWorkers)
    assert len(started) == 0  # taken by the table, or ended with the run


def test_a_profile_file_prices_the_cluster(
    capsys: pytest.CaptureFixture[str], tmp_path: Any
) -> None:
    """--profile FILE: the cluster's devices priced by that profile (a slower
    GEMM rate, a slower step); a bad file is a one-line usage error."""
    from dataclasses import replace

    from alpa_ir.hardware.builtin_profiles import v100_sxm2_aws
    from alpa_ir.hardware.device_profile import GemmPoint

    base = v100_sxm2_aws()
    slow = replace(
        base, gemm=tuple(GemmPoint(p.m, p.n, p.k, p.dtype, p.flops_per_s / 10) for p in base.gemm)
    )
    path = slow.save(tmp_path / "slow.json")
    argv = ["--models=mlp-tiny", "--gpus=1", "--layers=1", "--micro-batches=1", "--json"]
    assert main(argv) == 0
    (fast,) = json.loads(capsys.readouterr().out)
    assert main([*argv, f"--profile={path}"]) == 0
    (slowed,) = json.loads(capsys.readouterr().out)
    time = {r["method"]: r["iteration_time"] for r in fast["outcomes"]}["alpa"]
    slower = {r["method"]: r["iteration_time"] for r in slowed["outcomes"]}["alpa"]
    assert slower > time
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(SystemExit):
        main([*argv, f"--profile={tmp_path / 'bad.json'}"])
    err = capsys.readouterr().err
    assert "--profile: device profile" in err and "not a device profile" in err
