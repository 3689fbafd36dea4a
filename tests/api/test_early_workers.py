"""plan_pipeshard starts construct-stages' costing workers right after importing
a large step (they import the compiler while the layers are found), and none
for a small step, given stages or a model that measures on the local devices."""

from __future__ import annotations

import pytest
from xdsl.dialects import arith, func
from xdsl.dialects.builtin import IntegerAttr, i32
from xdsl.ir import Block, Region

from alpa_ir.api.pipeshard import AutoStageOption, PipeshardParallel, UniformStageOption
from alpa_ir.api.pipeshard_executable import _early_workers


def _main(num_ops: int) -> func.FuncOp:
    """``@main`` with ``num_ops`` ops (constants and the return)."""
    constants = [arith.ConstantOp(IntegerAttr(0, i32)) for _ in range(num_ops - 1)]
    return func.FuncOp("main", ((), ()), Region(Block([*constants, func.ReturnOp()])))


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
