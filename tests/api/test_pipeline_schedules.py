"""Every pipeline schedule PipeshardParallel runs equals one device: the zoo's
tiny GPT on 2 and 4 stages, 4 and 8 micro-batches, over 3 steps (loss and
state), on the xla backend; the planner's choice (``auto``) too, with its
runner-up in why_text. (The ray backend: tests/backends/test_multi_host.py.)"""

from __future__ import annotations

import pytest
from pipeshard_fixtures import tiny_gpt_method
from zoo_fixtures import same_steps, tiny_step

import alpa_ir
from alpa_ir.api.pipeshard import AutoLayerOption, AutoStageOption, PipeshardParallel
from alpa_ir.dialects.pipeline import PlanOp
from alpa_ir.ir.module_utils import top_level_ops

STEPS = 3


@pytest.mark.parametrize("micro_batches", [4, 8])
@pytest.mark.parametrize("stages", [2, 4])
@pytest.mark.parametrize("schedule", ["gpipe", "1f1b", "zb-h1", "interleaved-1f1b", "zb-v"])
def test_every_schedule_equals_one_device(schedule: str, stages: int, micro_batches: int) -> None:
    fn, (state, batch) = tiny_step("gpt-tiny")
    method = tiny_gpt_method(schedule, stages, micro_batches)
    parallel = alpa_ir.parallelize(fn, method=method, donate_argnums=())
    same_steps(parallel, fn, state, batch, STEPS, state_tol=1e-5)
    module = parallel.get_executable(state, batch).module
    (plan,) = top_level_ops(module, PlanOp)
    assert isinstance(plan, PlanOp) and plan.schedule.data == schedule
    split = any(
        "backward_weight" in op.sym_name.data for op in module.ops if hasattr(op, "sym_name")
    )
    assert split == (schedule in ("zb-h1", "zb-v"))
    meshes = {op.mesh.root_reference.data for op in module.ops if op.name == "pipeline.stage"}
    assert len(meshes) == stages


def test_the_planner_chooses_the_schedule_with_the_stages() -> None:
    """``auto`` (the default) with automatic stages: construct-stages times each
    schedule and keeps the fastest; the step equals one device under it, and
    why_text names the runner-up."""
    fn, (state, batch) = tiny_step("gpt-tiny")
    method = PipeshardParallel(
        num_micro_batches=8,
        layer_option=AutoLayerOption(layer_num=4),
        stage_option=AutoStageOption(),
    )
    assert method.pipeline_schedule == "auto"
    parallel = alpa_ir.parallelize(fn, method=method, donate_argnums=())
    same_steps(parallel, fn, state, batch, STEPS, state_tol=1e-5)
    executable = parallel.get_executable(state, batch)
    (plan,) = top_level_ops(executable.module, PlanOp)
    assert isinstance(plan, PlanOp)
    chosen = plan.schedule.data
    assert chosen in ("1f1b", "zb-h1", "interleaved-1f1b", "zb-v", "gpipe")
    assert (
        "construct-stages{" in executable.pass_pipeline
        and "schedule=auto" in executable.pass_pipeline
    )
    lines = executable.why_text().splitlines()
    assert lines[0].startswith(f"pipeline schedule {chosen}: ")
    if len(plan.attributes["construct_stages.schedules"].data) > 1:  # type: ignore[attr-defined]
        assert lines[1].startswith("  runner-up: ")


@pytest.mark.parametrize("schedule", ["zb-v", "interleaved-1f1b"])
def test_automatic_stages_plan_two_chunks_per_mesh(schedule: str) -> None:
    """construct-stages cuts the layers into chunks per mesh for the schedule the
    user names; the step equals one device under it."""
    fn, (state, batch) = tiny_step("gpt-tiny")
    method = PipeshardParallel(
        num_micro_batches=8,
        layer_option=AutoLayerOption(layer_num=4),
        stage_option=AutoStageOption(),
        pipeline_schedule=schedule,  # type: ignore[arg-type]
    )
    parallel = alpa_ir.parallelize(fn, method=method, donate_argnums=())
    same_steps(parallel, fn, state, batch, STEPS, state_tol=1e-5)
    module = parallel.get_executable(state, batch).module
    (plan,) = top_level_ops(module, PlanOp)
    assert isinstance(plan, PlanOp) and plan.schedule.data == schedule
    stages = [op for op in module.ops if op.name == "pipeline.stage"]
    meshes = {op.mesh.root_reference.data for op in stages}  # type: ignore[attr-defined]
    assert len(stages) == 2 * len(meshes)


def test_automatic_stages_take_two_chunks_only() -> None:
    with pytest.raises(alpa_ir.AlpaError) as info:
        PipeshardParallel(
            num_micro_batches=8,
            stage_option=AutoStageOption(),
            pipeline_schedule="interleaved-1f1b",
            virtual_stages=3,
        )
    assert str(info.value) == (
        "virtual_stages=3: automatic stages plan 2 chunks per mesh; give the stages "
        "(UniformStageOption) for more"
    )


def test_given_stages_keep_1f1b_under_auto() -> None:
    fn, (state, batch) = tiny_step("gpt-tiny")
    parallel = alpa_ir.parallelize(fn, method=tiny_gpt_method("auto", 2, 4), donate_argnums=())
    (plan,) = top_level_ops(parallel.get_executable(state, batch).module, PlanOp)
    assert isinstance(plan, PlanOp) and plan.schedule.data == "1f1b"
