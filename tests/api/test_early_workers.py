"""plan_pipeshard starts construct-stages' costing workers right after importing
a large step (they import the compiler while the layers are found), and none
for a small step, given stages or a model that measures on the local devices."""

from __future__ import annotations

import pytest
from xdsl.dialects import arith, func
from xdsl.dialects.builtin import IntegerAttr, i32
from xdsl.ir import Block, Region

from alpa_ir.api.pipeshard import AutoStageOption, PipeshardParallel, UniformStageOption
from alpa_ir.api.pipeshard_pipeline import resolve_pipeshard
from alpa_ir.ir.module_utils import num_ops


def _main(count: int) -> func.FuncOp:
    """``@main`` with ``count`` ops (constants and the return)."""
    constants = [arith.ConstantOp(IntegerAttr(0, i32)) for _ in range(count - 1)]
    return func.FuncOp("main", ((), ()), Region(Block([*constants, func.ReturnOp()])))


def _early_workers(method: PipeshardParallel, main: func.FuncOp) -> int:
    return resolve_pipeshard(method).early_workers(num_ops(main))


def test_a_large_step_gets_its_workers_started_ahead(monkeypatch: pytest.MonkeyPatch) -> None:
    import alpa_ir.costs.stage_table as stage_table

    monkeypatch.setattr(stage_table, "WORKERS_FROM_OPS", 3)
    auto = PipeshardParallel(stage_option=AutoStageOption(workers=3))
    assert _early_workers(auto, _main(3)) == 2  # the other two besides this process
    assert _early_workers(auto, _main(1)) == 0  # small: the table costs in this process
    profiled = PipeshardParallel(
        stage_option=AutoStageOption(workers=3, stage_cost_model="profile")
    )
    assert _early_workers(profiled, _main(3)) == 0
    given = PipeshardParallel(stage_option=UniformStageOption())
    assert _early_workers(given, _main(3)) == 0
