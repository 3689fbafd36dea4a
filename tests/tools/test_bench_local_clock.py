"""bench-local-clock on one tiny plan; a plan's predicted step time reads the
cluster's device profile (a slower device, a slower prediction); a pipeline's
stage functions are priced as planned, not planned again. No timing asserted."""

from __future__ import annotations

import json
import warnings
from dataclasses import replace
from pathlib import Path

import pytest
from zoo_fixtures import tiny_step

import alpa_ir
from alpa_ir.api.plan import planned_step_time
from alpa_ir.hardware.clusters import local_cpu
from alpa_ir.hardware.device_profile import (
    CollectiveFit,
    DeviceProfile,
    GemmPoint,
)
from alpa_ir.tools.bench_local_clock import cases, main, predict


def cpu_profile(speed: float = 1.0) -> DeviceProfile:
    """A made-up CPU profile, every figure times ``speed``."""
    return DeviceProfile(
        name="test-cpu",
        device="cpu",
        source="made up for a test",
        peak_flops=(("float32", 2e10 * speed),),
        gemm=(
            GemmPoint(512, 512, 512, "float32", 2e10 * speed),
            GemmPoint(512, 64, 512, "float32", 1e10 * speed),
        ),
        memory_bandwidth=4e9 * speed,
        launch_overhead=2e-6 / speed,
        collectives=tuple(
            CollectiveFit(kind, "device", g, 3e-5 / speed, 2e9 * speed)
            for kind in ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "send-recv")
            for g in (2, 4, 8)
        ),
    )


def test_the_table_covers_the_methods_and_models_asked_for() -> None:
    table = cases()
    assert len(table) >= 12
    assert {c.model for c in table} == {"gpt", "mlp", "moe", "wresnet"}
    assert {
        "shard-2x4", "shard-1x8", "shard-8x1", "data", "zero3",
        "pipe2-1f1b", "pipe2-gpipe", "pipe4-1f1b", "pipe4-gpipe",
    } <= {c.method for c in table}  # fmt: skip


def test_a_shard_parallel_plan_predicts_from_the_clusters_profile() -> None:
    fn, args = tiny_step("mlp-tiny")
    plan = alpa_ir.compile(fn, *args, method=alpa_ir.ShardParallel(devices=range(8)))
    assert plan.step_time is not None and plan.step_time > 0  # the local devices' own
    slow = planned_step_time(plan.module, local_cpu().with_profile(cpu_profile(1.0)))
    fast = planned_step_time(plan.module, local_cpu().with_profile(cpu_profile(10.0)))
    assert slow is not None and fast is not None
    assert slow == pytest.approx(10 * fast, rel=1e-6)  # every price scaled alike
    no_mesh = replace(plan, module=plan.input_module.clone())
    from alpa_ir.ir.module_utils import main_function

    main_function(no_mesh.module).attributes.pop("mesh.mesh", None)
    assert planned_step_time(no_mesh.module) is None


@pytest.mark.slow
def test_a_pipelines_stages_are_priced_as_planned() -> None:
    fn, args = tiny_step("gpt-tiny")
    method = alpa_ir.PipeshardParallel(
        num_micro_batches=2,
        layer_option=alpa_ir.AutoLayerOption(layer_num=2),
        stage_option=alpa_ir.UniformStageOption(num_stages=2),
        pipeline_schedule="1f1b",
    )
    plan = alpa_ir.compile(fn, *args, method=method)
    cluster = local_cpu().with_profile(cpu_profile())
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # planning a planned stage again warns
        seconds = predict(plan, cluster)
    assert seconds > 0
    slower = predict(plan, local_cpu().with_profile(cpu_profile(0.5)))
    assert slower == pytest.approx(2 * seconds, rel=1e-6)


@pytest.mark.slow
def test_the_tool_runs_one_tiny_plan(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    profile = cpu_profile().save(tmp_path / "p.json")
    out = tmp_path / "rows.json"
    args = ["--profile", str(profile), "--cases", "tiny", "--steps", "1", "--warmup", "1"]
    assert main([*args, "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "tiny/shard-2x4" in text and "against measured: within ±25%:" in text
    assert "load average" in text
    body = json.loads(out.read_text())
    (row,) = body["rows"]
    assert row["name"] == "tiny/shard-2x4" and not row["error"]
    assert row["predicted"] > 0 and row["measured"] > 0
    assert row["ratio"] == pytest.approx(row["predicted"] / row["measured"])
    assert row["cpu_per_core"] > 0


def test_bad_arguments_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--profile", str(tmp_path / "none.json"), "--cases", "tiny"]) == 2
    assert "device profile" in capsys.readouterr().err
    assert main(["--cases", "gpt/warp-drive"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("bench-local-clock: error: --cases: unknown case 'gpt/warp-drive'")
    assert err.count("\n") == 1
