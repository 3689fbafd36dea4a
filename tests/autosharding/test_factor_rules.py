"""The factor rules of the common primitives, read off ops imported from JAX,
and the strategies they enumerate on a 2x4 mesh."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax.numpy as jnp
import numpy as np

import alpa_ir
from alpa_ir.autosharding.factors import FactorKind, FactorRule, enumerate_strategies
from alpa_ir.autosharding.rules import RULES
from alpa_ir.dialects.lax import LaxOp
from alpa_ir.ir.module_utils import main_function

P, R, N = FactorKind.PASS_THROUGH, FactorKind.REDUCTION, FactorKind.NEED_REPLICATION


def _rule(fn: Callable[..., Any], *shapes: tuple[int, ...], primitive: str) -> FactorRule:
    """The rule of the (only) ``primitive`` op of ``fn`` imported for these shapes."""
    args = [np.ones(s, np.float32) for s in shapes]
    function = main_function(alpa_ir.import_jax(fn, *args))
    [op] = [
        op
        for op in function.body.block.ops
        if isinstance(op, LaxOp) and op.primitive_name == primitive
    ]
    return RULES[primitive](op)


def test_batched_matmul_has_batch_rows_columns_and_a_reduction() -> None:
    rule = _rule(lambda a, b: jnp.einsum("bmk,bkn->bmn", a, b), (2, 8, 16), (2, 16, 4),
                 primitive="dot_general")  # fmt: skip
    assert rule.heavy
    assert dict(zip(rule.names, zip(rule.sizes, rule.kinds, strict=True), strict=True)) == {
        "b0": (2, P), "k0": (16, R), "i1": (8, P), "j2": (4, P),
    }  # fmt: skip
    b, k, i, j = (rule.names.index(n) for n in ("b0", "k0", "i1", "j2"))
    assert rule.operands == (((b,), (i,), (k,)), ((b,), (k,), (j,)))
    assert rule.results == (((b,), (i,), (j,)),)


def test_a_reduction_reduces_with_its_own_operator() -> None:
    total = _rule(lambda x: x.sum(axis=1), (8, 16), primitive="reduce_sum")
    assert total.kinds == (P, R) and total.reduce == "sum"
    assert total.operands == (((0,), (1,)),) and total.results == (((0,),),)
    largest = _rule(lambda x: x.max(axis=0), (8, 16), primitive="reduce_max")
    assert largest.kinds == (R, P) and largest.reduce == "max"


def test_a_transpose_permutes_its_factors() -> None:
    rule = _rule(lambda x: x.transpose(2, 0, 1), (2, 4, 8), primitive="transpose")
    assert rule.kinds == (P, P, P) and rule.sizes == (2, 4, 8)
    assert rule.results == (((2,), (0,), (1,)),)


def test_reshapes_merge_and_split_dims_by_shared_factors() -> None:
    merge = _rule(lambda x: x.reshape(24), (4, 6), primitive="reshape")
    assert merge.sizes == (4, 6) and merge.kinds == (P, P)
    assert merge.operands == (((0,), (1,)),) and merge.results == (((0, 1),),)
    split = _rule(lambda x: x.reshape(4, 6), (24,), primitive="reshape")
    assert split.operands == (((0, 1),),) and split.results == (((0,), (1,)),)
    # (6, 4) -> (4, 6) shares no dim boundary inside: the leading dims share
    # their major factor gcd(6, 4) = 2 (the two halves of the elements), the
    # rest (12) cannot be split
    shuffle = _rule(lambda x: x.reshape(4, 6), (6, 4), primitive="reshape")
    assert shuffle.sizes == (2, 12) and shuffle.kinds == (P, N)
    assert shuffle.operands == (((0, 1), (1,)),) and shuffle.results == (((0, 1), (1,)),)


def test_a_regrouped_batch_keeps_its_split() -> None:
    """(64, 16) -> (32, 32), MoE's tokens regrouped for the experts: a split of
    the leading dims over up to 32 devices keeps every device's tokens, so a
    batch split passes through the reshape; the minor dims stay whole."""
    rule = _rule(lambda x: x.reshape(32, 32, 8), (64, 16, 8), primitive="reshape")
    strategies = {s.name: s for s in enumerate_strategies(rule, (2, 4))}
    both = next(s for s in strategies.values() if s.operand_specs[0].dims[0] == (0, 1))
    assert both.result_specs[0].dims[0] == (0, 1)
    for s in strategies.values():
        assert not s.operand_specs[0].dims[1] and not s.result_specs[0].dims[1]


def test_strategies_of_a_reduction_leave_partial_results_exactly_where_it_is_split() -> None:
    rule = _rule(lambda x: x.sum(axis=1), (8, 16), primitive="reduce_sum")
    strategies = enumerate_strategies(rule, (2, 4))
    names = {s.name for s in strategies}
    assert {"replicated", "d0->0", "d1->1", "d0->01", "d1->01", "d0->0,d1->1"} <= names
    for s in strategies:
        split_reduced = s.operand_specs[0].dims[1]
        assert s.partial_axes == tuple(sorted(split_reduced))
        assert s.result_specs[0].partial == s.partial_axes
        assert s.final_result_specs[0].partial == ()


def test_a_merged_dim_is_split_only_on_its_major_factor() -> None:
    """(4, 6) -> (24): splitting the minor factor 6 alone is no block layout of
    the merged dim, so no strategy does it."""
    rule = _rule(lambda x: x.reshape(24), (4, 6), primitive="reshape")
    strategies = enumerate_strategies(rule, (2, 4))
    assert {s.name for s in strategies} == {"replicated", "f0->0", "f0->1"}
    for s in strategies:
        (operand,) = s.operand_specs
        (result,) = s.result_specs
        assert not operand.dims[1], f"{s.name} splits the minor factor of the merged dim"
        assert result.dims[0] == operand.dims[0]
