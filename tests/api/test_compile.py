"""alpa_ir.compile: the plan without running it; printable, saved and loaded,
turned into the executable parallelize would run."""

from __future__ import annotations

from pathlib import Path

import pytest
from pipeshard_fixtures import tiny_gpt_method
from zoo_fixtures import max_abs_diff, reference_outputs, tiny_step

import alpa_ir
from alpa_ir.api.plan import Plan
from alpa_ir.ir.module_utils import main_function


def test_a_shard_parallel_plan_is_made_saved_loaded_and_run(tmp_path: Path) -> None:
    fn, args = tiny_step("mlp-tiny")
    plan = alpa_ir.compile(fn, *args, method=alpa_ir.ShardParallel(devices=range(8)))
    assert isinstance(plan, Plan)
    assert "sharding.objective" in main_function(plan.module).attributes
    assert (
        plan.pass_pipeline.startswith("builtin.module(") and "auto-sharding" in plan.pass_pipeline
    )
    assert len(plan.peak_memory) == 1 and plan.peak_memory[0] > 0
    assert plan.step_time is not None and plan.step_time > 0  # priced on its mesh
    assert any(s.name == "num-nodes" for s in plan.statistics)
    text = str(plan)
    assert text.startswith("plan of ShardParallel(") and "predicted memory per device" in text

    loaded = Plan.load(plan.save(tmp_path / "plan"))
    assert str(loaded.module) == str(plan.module)
    assert str(loaded.input_module) == str(plan.input_module)
    assert loaded.pass_pipeline == plan.pass_pipeline
    assert loaded.statistics == plan.statistics and loaded.peak_memory == plan.peak_memory
    with pytest.raises(alpa_ir.AlpaError, match="holds no step"):
        loaded.executable()

    executable = plan.executable()
    assert executable.pass_pipeline == plan.pass_pipeline
    got = executable(*tiny_step("mlp-tiny")[1])
    assert max_abs_diff(got, reference_outputs("mlp-tiny")) < 1e-5


def test_a_pipeline_plan_predicts_each_stage_and_the_planners_step_time() -> None:
    fn, args = tiny_step("gpt-tiny")
    given = alpa_ir.compile(fn, *args, method=tiny_gpt_method("1f1b", 2, 4))
    assert len(given.peak_memory) == 2 and min(given.peak_memory) > 0
    assert given.step_time is None  # given stages: nothing timed them
    assert "emit-instructions" in given.pass_pipeline
    method = alpa_ir.PipeshardParallel(
        num_micro_batches=4,
        layer_option=alpa_ir.AutoLayerOption(layer_num=2),
        stage_option=alpa_ir.AutoStageOption(),
        pipeline_schedule="1f1b",
    )
    planned = alpa_ir.compile(fn, *tiny_step("gpt-tiny")[1], method=method)
    assert planned.step_time is not None and planned.step_time > 0
    assert "simulated step time" in str(planned)


def test_loading_a_folder_that_is_no_plan_names_what_is_missing(tmp_path: Path) -> None:
    (tmp_path / "module.mlir").write_text("builtin.module {}\n")
    with pytest.raises(alpa_ir.AlpaError) as info:
        Plan.load(tmp_path)
    assert str(info.value) == (
        f"Plan.load: {tmp_path} has no input_module.mlir, pass_pipeline.txt, plan.json "
        "(not a saved plan)"
    )
