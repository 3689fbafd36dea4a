"""Refuse a plan that cannot fit in the local devices' memory, after planning
and before anything compiles: one :class:`~alpa_ir.errors.PlanError` line
naming the predicted need and the budget, both in GiB per device, and where
the budget comes from.

The budget is :func:`~alpa_ir.hardware.memory_budget.local_device_budget` of
the devices the plan uses (a figure given by hand, else the host memory the
local CPU devices share); the need is the plan's own prediction
(:mod:`alpa_ir.pipeline.plan_memory`, every op's result materialized: on the
small MLP and GPT plans of ``tests/pipeline/test_plan_memory.py`` 1.0-1.9 times
what XLA's ``memory_analysis`` reports for a ``ShardParallel`` program and
0.86-1.6 times for the functions of a pipeline stage: a bound that errs on
the safe side rather than a guess that may fall short). Plans on the ``ray`` backend (the
hosts' memory is not read here) and on devices with their own memory (a
GPU, whose runtime reports its own out-of-memory errors) are not checked,
unless the budget is given by hand for local devices.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from xdsl.dialects import func
from xdsl.dialects.builtin import ModuleOp

from alpa_ir.errors import PlanError
from alpa_ir.hardware.memory_budget import (
    MEMORY_ENV,
    NOMINAL_DEVICE_MEMORY,
    MemoryBudget,
    format_gib,
    given_memory_budget,
    local_device_budget,
)
from alpa_ir.pipeline.plan_memory import StagePeak, pipeline_memory, program_memory

_ADVICE = (
    f"nothing was compiled; use more devices or a plan that shards more, or give the "
    f"budget by hand (device_memory=..., {MEMORY_ENV}=...)"
)


def plan_memory_budget(given: object, backend: str, num_devices: int) -> MemoryBudget:
    """The budget per device of a plan on ``num_devices`` devices of ``backend``:
    ``given`` (a method's ``device_memory``) or ``ALPA_DEVICE_MEMORY``, else on
    the xla backend the local devices' (shared host memory for CPUs), else on
    ray a nominal figure that nothing is checked against."""
    if backend != "ray":
        return local_device_budget(num_devices, given=given)
    by_hand = given_memory_budget(given)
    if by_hand is not None:
        return MemoryBudget(by_hand.per_device, by_hand.source, enforced=False)
    return MemoryBudget(NOMINAL_DEVICE_MEMORY, "nominal: the Ray hosts' memory is not read", False)


def check_program_memory(
    function: func.FuncOp,
    mesh_shape: Sequence[int],
    budget: MemoryBudget,
    *,
    donated: Sequence[int] = (),
    batch_args: Sequence[int] = (),
    num_micro_batches: int = 1,
    where: str = "ShardParallel",
) -> None:
    """Raise :class:`PlanError` when ``function``'s plan, one SPMD program on a
    mesh of ``mesh_shape``, needs more than ``budget`` per device."""
    if not budget.enforced:
        return
    memory = program_memory(
        function,
        mesh_shape,
        donated=donated,
        batch_args=batch_args,
        num_micro_batches=num_micro_batches,
        fusion=False,
    )
    if memory.peak <= budget.per_device:
        return
    parts = (
        f"{format_gib(memory.arguments)} arguments + {format_gib(memory.outputs)} outputs + "
        f"{format_gib(memory.temporaries)} temporaries - {format_gib(memory.aliased)} donated"
    )
    raise PlanError(
        f"{where}: the plan on mesh {list(mesh_shape)} needs {format_gib(memory.peak)} per "
        f"device ({parts}) but the budget is {budget.text()}; {_ADVICE}"
    )


def _stage_parts(stage: StagePeak) -> str:
    running = (
        f"{stage.in_flight} micro-batches x {format_gib(stage.stash)} stash + "
        f"{format_gib(stage.temporaries)} temporaries"
    )
    if stage.apply_grad > stage.in_flight * stage.stash + stage.temporaries:
        running = f"{format_gib(stage.apply_grad)} apply-grad outputs and temporaries"
    return f"{format_gib(stage.held)} state + {format_gib(stage.gradients)} gradients + {running}"


def check_pipeline_memory(
    module: ModuleOp,
    budget: MemoryBudget,
    where: str = "PipeshardParallel",
    schedules: Mapping[str, Any] | None = None,
) -> None:
    """Raise :class:`PlanError` when a stage of the outlined, sharded pipeline
    ``module`` needs more than ``budget`` per device (the neediest stage is named;
    ``schedules``: plugin schedule builders by name, for a plan that runs one)."""
    if not budget.enforced:
        return
    peaks = pipeline_memory(module, schedules=schedules)
    by_mesh: dict[str, list[StagePeak]] = {}
    for peak in peaks:
        by_mesh.setdefault(peak.mesh, []).append(peak)
    shared = [group for group in by_mesh.values() if len(group) > 1]
    if shared:  # virtual stages: a mesh holds all of its stages (their peaks added: a bound)
        group = max(shared, key=lambda g: sum(s.peak for s in g))
        total = sum(s.peak for s in group)
        if total > budget.per_device and total >= max(s.peak for s in peaks):
            names = ", ".join(str(s.stage) for s in group)
            raise PlanError(
                f"{where}: stages {names} of the plan share mesh {list(group[0].mesh_shape)} and "
                f"need {format_gib(total)} per device but the budget is {budget.text()}; "
                f"{_ADVICE}"
            )
    worst = max(peaks, key=lambda s: s.peak)
    if worst.peak <= budget.per_device:
        return
    raise PlanError(
        f"{where}: stage {worst.stage} of the plan, on mesh {list(worst.mesh_shape)}, needs "
        f"{format_gib(worst.peak)} per device ({_stage_parts(worst)}) but the budget is "
        f"{budget.text()}; {_ADVICE}"
    )


__all__ = ["check_pipeline_memory", "check_program_memory", "plan_memory_budget"]
