"""The stage cost model's shortcuts (issue #42: Megatron rows planned in a
minute) give what the slow path gives: the memory-saving plan's persistent
bytes read before it is priced, one attribute per distinct sharding spec,
the fusion decisions with each value's users kept and the cheap test first,
and each type's shape decoded once."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
from stage_fixtures import _deep_module, _small_cluster
from xdsl.dialects.builtin import ArrayAttr, i32
from xdsl.ir import Operation, SSAValue

from alpa_ir.costs.analytical_stage_cost import AnalyticalStageCostModel
from alpa_ir.costs.function_plan import plan_function_and_variant
from alpa_ir.costs.fusion import (
    BlockFusion,
    fuses_inputs,
    is_fusible,
    is_identity,
    streamed_inputs,
)
from alpa_ir.costs.stage_cost import MEMORY_FALLBACK_MIP_GAP, StageCostOptions
from alpa_ir.dialects.lax_attrs import ints_attr
from alpa_ir.dialects.sharding import ShardingSpec, ShardingSpecAttr
from alpa_ir.dialects.types import shape_of, tensor_type
from alpa_ir.errors import AlpaError
from alpa_ir.ir.module_utils import main_function
from alpa_ir.pipeline.layer_ranges import LayerRanges

SMALL_MEMORY = 2**13  # the deep module's 16x16 weights are well over 1/256 of it


@pytest.mark.parametrize("devices, shape", [(2, (1, 2)), (4, (2, 2)), (4, (1, 4))])
def test_persistent_bytes_are_the_priced_plans(devices: int, shape: tuple[int, int]) -> None:
    """``persistent_bytes`` is ``price_planned``'s persistent memory, to the
    last bit, for the first plan and the memory-saving one of every layer."""
    cluster = _small_cluster(devices=devices, memory=SMALL_MEMORY)
    mesh = cluster.logical_mesh(shape)
    options = StageCostOptions(memory_fallback=True, zero=True, num_micro_batches=4)
    sharded = replace(
        options,
        allow_replicated_parameters=False,
        mip_gap=MEMORY_FALLBACK_MIP_GAP,
        branch_and_bound=False,
    )
    model = AnalyticalStageCostModel(options)
    ranges = LayerRanges(main_function(_deep_module()))
    for k in range(ranges.num_layers):
        extracted = ranges.function(k, k)
        params = tuple(extracted.param_args)
        first, variant = plan_function_and_variant(
            extracted.function, mesh, options, sharded, {}, cluster=cluster
        )
        plans = [first] + ([variant()] if variant is not None and params else [])
        for planned in plans:
            priced = model.price_planned(planned, mesh, cluster, params)
            assert model.persistent_bytes(planned, mesh, params) == priced.memory.persistent


def test_the_early_return_gives_the_slow_paths_costs() -> None:
    """Every layer of the deep module on meshes of 2 and 4 devices: the
    same stage cost (memory-saving plan included) with the persistent bytes
    read first as with every memory-saving plan priced whole; and the early
    return is taken at least once (a memory-saving plan that holds no less)."""
    ranges = LayerRanges(main_function(_deep_module()))
    options = StageCostOptions(memory_fallback=True, zero=True, num_micro_batches=4)
    fast, slow = AnalyticalStageCostModel(options), AnalyticalStageCostModel(options)
    slow.persistent_bytes = lambda *args: -math.inf  # type: ignore[method-assign]
    taken = []
    real = fast.persistent_bytes

    def spy(planned, mesh, params):  # type: ignore[no-untyped-def]
        held = real(planned, mesh, params)
        taken.append(held)
        return held

    fast.persistent_bytes = spy  # type: ignore[method-assign]
    early = priced = 0
    for devices, shapes in ((2, [(1, 2)]), (4, [(1, 4), (2, 2)])):
        cluster = _small_cluster(devices=devices, memory=SMALL_MEMORY)
        for shape in shapes:
            mesh = cluster.logical_mesh(shape)
            for k in range(ranges.num_layers):
                extracted = ranges.function(k, k)
                args = (extracted.function, mesh, cluster, extracted.param_args)
                taken.clear()
                cost = fast.stage_cost(*args)
                assert cost == slow.stage_cost(*args)
                if taken:  # a memory-saving plan was made: returned early, or priced
                    early += cost.memory_saving is None
                    priced += cost.memory_saving is not None
    assert early and priced  # both branches ran


def test_equal_specs_share_one_attribute_equal_to_a_fresh_one() -> None:
    dims = ((0,), (), (1,))
    first, second = ShardingSpec(dims), ShardingSpec(dims, ())
    partial = ShardingSpec(dims, (2,))
    assert first is not second and first.to_attr() is second.to_attr()
    fresh = ShardingSpecAttr(ArrayAttr([ints_attr(d) for d in dims]), ints_attr(()))
    assert first.to_attr() == fresh and str(first.to_attr()) == str(fresh)
    assert partial.to_attr() != fresh and partial.to_attr().spec == partial
    assert first.to_attr().spec == first


class _SlowFusion(BlockFusion):
    """The fusion decisions as made before #42's shortcuts: every value's users
    walked again, and the readers of a result counted before its producer's
    streamed inputs (the slow path)."""

    def users(self, value: SSAValue) -> list[Operation]:
        out: list[Operation] = []
        for use in value.uses:
            user = self.top(use.operation)
            if is_identity(user) and user.parent_block() is self.block:
                out += self.users(user.results[use.index])
            else:
                out.append(user)
        return out

    def _decide(self, op: Operation) -> None:
        here = self.position[op]
        if is_identity(op):
            self.runs_until[op] = here
            return
        fusible = is_fusible(op)
        fused_until = here
        for result in op.results:
            users = self.users(result)
            if fusible and not users:
                continue
            if result in self.tiled and users and self.block.last_op not in users:
                for user in users:
                    fused_until = max(fused_until, self.runs_until.get(user, self.end))
                continue
            if (
                not fusible
                or not users
                or any(u is self.block.last_op or not fuses_inputs(u) for u in users)
                or (self.kernels_reading(result) > 1 and streamed_inputs(op) > 1)
            ):
                self.materialized.add(result)
                continue
            for user in users:
                fused_until = max(fused_until, self.runs_until.get(user, self.end))
        self.runs_until[op] = (
            here if any(r in self.materialized for r in op.results) else fused_until
        )


def test_fusion_decides_as_its_slow_path() -> None:
    """A planned step of four layers (forward, backward, collectives), with
    and without tiled attention: the same materialized values, kernel ends,
    kernels per value and last reads."""
    cluster = _small_cluster(devices=4)
    extracted = LayerRanges(main_function(_deep_module())).function(0, 3)
    planned, _ = plan_function_and_variant(
        extracted.function, cluster.logical_mesh((2, 2)), StageCostOptions(), None, {}
    )
    block = planned.body.block
    values = [v for op in block.ops for v in op.results]
    for tiled in (False, True):
        kept, walked = BlockFusion(block, tiled), _SlowFusion(block, tiled)
        assert kept.materialized == walked.materialized
        assert kept.runs_until == walked.runs_until
        for k, value in enumerate(values):
            assert kept.kernel_ops_reading(value) == walked.kernel_ops_reading(value)
            assert kept.last_read(value, k) == walked.last_read(value, k)


def test_a_types_shape_is_decoded_once_and_the_type_is_unchanged() -> None:
    ty = tensor_type((4, 8), np.float32)
    fresh = tensor_type((4, 8), np.float32)
    assert shape_of(ty) == (4, 8) and shape_of(ty) is shape_of(ty)  # kept
    assert ty == fresh and hash(ty) == hash(fresh) and str(ty) == str(fresh)
    assert shape_of(tensor_type((), np.float32)) == ()
    with pytest.raises(AlpaError, match="expected a tensor type"):
        shape_of(i32)
