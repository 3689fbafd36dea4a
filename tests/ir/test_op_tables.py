"""Op tables: IR sent to another process without printing and parsing it."""

from __future__ import annotations

import pickle

import jax
import jax.numpy as jnp
import pytest
from xdsl.context import Context
from xdsl.dialects.arith import Arith
from xdsl.dialects.builtin import ModuleOp
from xdsl.dialects.cf import Cf
from xdsl.dialects.func import FuncOp

import alpa_ir
from alpa_ir.costs.costing_workers import function_of_payload, function_payload
from alpa_ir.ir.context import make_context
from alpa_ir.ir.module_utils import main_function
from alpa_ir.ir.op_tables import NotTabulable, dump_op, load_op
from alpa_ir.ir.text import parse_module, print_module
from alpa_ir.plugins.registry import load_registry


def _step(w: jax.Array, x: jax.Array) -> jax.Array:
    """Regions (a loop and a branch), constants, dot attributes, a gradient."""

    def loss(w: jax.Array) -> jax.Array:
        y = jax.lax.fori_loop(0, 3, lambda i, h: jnp.tanh(h @ w), x)
        y = jax.lax.cond(y.sum() > 0, lambda v: v * 2.0, lambda v: v - 1.0, y)
        return (y**2).mean()

    return jax.grad(loss)(w)


@pytest.fixture(scope="module")
def step_function() -> FuncOp:
    module = alpa_ir.import_jax(_step, jnp.ones((4, 4)), jnp.ones((2, 4)))
    return main_function(module)


def test_a_function_with_regions_comes_back_as_it_was(step_function: FuncOp) -> None:
    back = load_op(dump_op(step_function), make_context())
    assert isinstance(back, FuncOp)
    assert back.parent is None  # detached, ready to be put anywhere
    original = print_module(ModuleOp([step_function.clone()]), debuginfo=True)
    assert print_module(ModuleOp([back]), debuginfo=True) == original  # locations too
    assert any(op.regions for op in back.body.block.ops)
    # the values are wired as in the original: every use is known to its value
    for old, new in zip(step_function.walk(), back.walk(), strict=True):
        assert [r.uses.get_length() for r in new.results] == [
            r.uses.get_length() for r in old.results
        ]
        assert [r.name_hint for r in new.results] == [r.name_hint for r in old.results]


def test_each_distinct_attribute_is_sent_once(step_function: FuncOp) -> None:
    attributes, _ = pickle.loads(dump_op(step_function))
    assert len(attributes) == len(set(attributes))
    assert len(attributes) < sum(1 for _ in step_function.walk())


def _cf_context() -> Context:
    context = make_context(load_registry(builtin=False, entry_points=False))
    context.load_dialect(Arith)
    context.load_dialect(Cf)
    return context


FORWARD_BRANCH = """\
builtin.module {
  func.func @f(%a: i32) -> i32 {
    cf.br ^bb2
  ^bb1:
    func.return %a : i32
  ^bb2:
    %b = arith.addi %a, %a : i32
    cf.br ^bb1
  }
}
"""


def test_branches_to_later_blocks_are_kept() -> None:
    context = _cf_context()
    function = main_function(parse_module(FORWARD_BRANCH, ctx=context), "f")
    back = load_op(dump_op(function), context)
    assert print_module(ModuleOp([back])) == FORWARD_BRANCH


def test_a_value_used_before_its_definition_is_not_tabulable_and_goes_as_text() -> None:
    context = _cf_context()
    text = FORWARD_BRANCH.replace("func.return %a", "func.return %b")  # %b: a later block's
    function = main_function(parse_module(text, ctx=context), "f")
    with pytest.raises(NotTabulable, match=r"'func\.return' uses a value defined after it"):
        dump_op(function)
    kind, _ = payload = function_payload(function)
    assert kind == "text"
    assert print_module(ModuleOp([function_of_payload(payload, context)])) == text


def test_an_op_using_a_value_from_outside_is_not_tabulable(step_function: FuncOp) -> None:
    inner = next(op for op in step_function.body.block.ops if op.operands)
    with pytest.raises(NotTabulable, match="outside the IR sent"):
        dump_op(inner)


def test_a_worker_receives_a_table(step_function: FuncOp) -> None:
    payload = function_payload(step_function)
    assert payload[0] == "table"
    back = function_of_payload(payload, make_context())
    assert str(back) == str(step_function)
