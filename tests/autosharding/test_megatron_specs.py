"""Megatron's tensor-parallel shardings of a layer's parameters, found from the
dataflow (column-parallel into a sub-block, row-parallel out of it), and kept
by the stage cost's ILP when given."""

from __future__ import annotations

from functools import cache
from typing import Any

from alpa_ir.autosharding.megatron_specs import batch_specs, megatron_specs
from alpa_ir.costs.function_plan import plan_function, with_argument_specs
from alpa_ir.costs.stage_cost import StageCostOptions
from alpa_ir.dialects.sharding import ShardingSpec, spec_of_value
from alpa_ir.hardware.device_mesh import LogicalDeviceMesh
from alpa_ir.ir.module_utils import main_function
from alpa_ir.pipeline.layer_ranges import LayerRanges

R1, R2 = ShardingSpec(((),)), ShardingSpec(((), ()))
COLUMN, ROW = ShardingSpec(((), (1,))), ShardingSpec(((1,), ()))
BLOCK = [R1, COLUMN, COLUMN, COLUMN, ROW, R1, COLUMN, COLUMN, ROW]
"""A Llama block: norm, q, k, v (column), o (row), norm, gate, up (column), down (row)."""


@cache
def _llama_layer() -> Any:
    """The tiny Llama (2 blocks) as one layer function: forward and backward."""
    from alpa_ir.tools.bench_suite import trace

    ranges = LayerRanges(main_function(trace("llama-tiny", 4, 1)))
    return ranges.function(0, ranges.num_layers - 1)


def test_a_llama_layer_gets_megatrons_column_then_row_split() -> None:
    layer = _llama_layer()
    specs = megatron_specs(layer.function, layer.param_args, (2, 4), 1)
    got = [specs[k] for k in sorted(layer.param_args)]
    embedding = ShardingSpec(((1,), ()))  # vocabulary-parallel: rows split
    assert got == [embedding, *BLOCK, *BLOCK, R1, COLUMN]  # final norm, head


def test_one_tensor_parallel_device_replicates_everything() -> None:
    layer = _llama_layer()
    specs = megatron_specs(layer.function, layer.param_args, (8, 1), 1)
    assert set(specs) == set(layer.param_args)
    assert all(s.is_replicated() for s in specs.values())


def test_batch_specs_split_the_micro_batch_rows() -> None:
    layer = _llama_layer()
    rows = 2  # batch 8 in 4 micro-batches
    specs = batch_specs(layer.function, layer.param_args, rows, (2, 4), [(0, 0)])
    assert specs and not set(specs) & set(layer.param_args)
    assert all(s.dims[0] == (0,) for s in specs.values())
    assert batch_specs(layer.function, layer.param_args, rows, (3, 4), [(0, 0)]) == {
        k: ShardingSpec(tuple(() for _ in s.dims)) for k, s in specs.items()
    }  # 3 does not divide 2 rows: nothing split


def test_the_ilp_keeps_the_given_specs() -> None:
    layer = _llama_layer()
    mesh = LogicalDeviceMesh((2, 4))
    specs = megatron_specs(layer.function, layer.param_args, mesh.shape, 1)
    specs.update(batch_specs(layer.function, layer.param_args, 2, mesh.shape, [(0, 0)]))
    given = with_argument_specs(layer.function, specs)
    planned = plan_function(given, mesh, StageCostOptions(keep_argument_specs=True))
    for k, spec in specs.items():
        assert spec_of_value(planned.args[k], planned) == spec
