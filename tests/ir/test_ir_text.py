"""IR text helpers: located one-line errors, source locations, split input."""

from __future__ import annotations

import pytest
from xdsl.context import Context
from xdsl.dialects.arith import Arith
from xdsl.dialects.builtin import FileLineColLoc, ModuleOp

from alpa_ir.errors import IRParseError, IRVerifyError
from alpa_ir.ir.context import make_context
from alpa_ir.ir.text import InputChunk, parse_module, print_module, split_input, verify_module
from alpa_ir.plugins.registry import load_registry

GOOD = """\
builtin.module {
  func.func @f(%a: i32) -> i32 {
    %b = arith.addi %a, %a : i32
    func.return %b : i32
  }
}
"""


@pytest.fixture(scope="module")
def ctx() -> Context:
    context = make_context(load_registry(builtin=False, entry_points=False))
    context.load_dialect(Arith)
    return context


def _error(text: str, ctx: Context, first_line: int = 1) -> str:
    with pytest.raises((IRParseError, IRVerifyError)) as info:
        parse_module(text, ctx=ctx, filename="m.mlir", first_line=first_line)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_round_trip_and_locations(ctx: Context) -> None:
    module = parse_module(GOOD, ctx=ctx, filename="m.mlir")
    assert print_module(module) == GOOD
    addi = module.body.block.first_op.body.block.first_op  # type: ignore[union-attr]
    assert isinstance(addi.location, FileLineColLoc)
    assert str(addi.location) == 'loc("m.mlir":3:5)'
    with_locs = print_module(module, debuginfo=True)
    assert 'arith.addi %a, %a : i32 loc("m.mlir":3:5)' in with_locs
    again = parse_module(with_locs, ctx=ctx, filename="other.mlir")
    assert print_module(again, debuginfo=True) == with_locs  # explicit locations are kept
    unknown = GOOD.replace("%a : i32\n", "%a : i32 loc(unknown)\n")
    kept = parse_module(unknown, ctx=ctx, filename="m.mlir")
    assert 'i32 loc(unknown)\n    func.return %b : i32 loc("m.mlir":4:5)' in print_module(
        kept, debuginfo=True
    )


def test_syntax_error_is_located(ctx: Context) -> None:
    text = "builtin.module {\n  func.func @f() {\n    func.return %\n  }\n}\n"
    assert _error(text, ctx) == "m.mlir:3:17: Expected suffix identifier after '%'"


def test_unknown_dialect_and_op_are_named_where_they_are_written(ctx: Context) -> None:
    assert _error("builtin.module {\n  foo.bar\n}\n", ctx) == (
        "m.mlir:2:3: unknown dialect 'foo' in operation 'foo.bar' "
        "(loaded dialects: arith, builtin, func)"
    )
    assert _error("builtin.module {\n  %x = arith.frobnicate\n}\n", ctx) == (
        "m.mlir:2:8: unknown operation 'arith.frobnicate'"
    )
    typed = '%x = "arith.constant"() <{value = 1 : i32}> : () -> !foo.t\n'
    assert _error(typed, ctx).startswith(
        "m.mlir:1:54: unknown dialect 'foo' in type or attribute 'foo.t'"
    )


def test_invalid_attribute_points_at_its_op(ctx: Context) -> None:
    text = "builtin.module {\n  %x = arith.constant 1000 : i3\n}\n"
    assert _error(text, ctx).startswith("m.mlir:2:3: invalid IR: Integer value 1000 is out of")


def test_verifier_failure_names_op_and_location(ctx: Context) -> None:
    text = GOOD.replace("-> i32 {", "-> i64 {")
    assert _error(text, ctx) == (
        "m.mlir:4:5: operation 'func.return' does not verify: Expected arguments to have the "
        "same types as the function output types: expected [i64], got [i32]"
    )
    bad_args = (
        '"func.func"() <{sym_name = "g", function_type = (i32) -> ()}> ({\n'
        '^bb0(%a: i64):\n  "func.return"() : () -> ()\n}) : () -> ()\n'
    )
    assert _error(bad_args, ctx).startswith("m.mlir:1:1: operation 'func.func' @g does not verify")


def test_verify_module_without_locations_names_the_op(ctx: Context) -> None:
    module = parse_module(GOOD, ctx=ctx)
    for op in module.walk():
        op.location = ModuleOp([]).location  # unknown
    module.body.block.first_op.body.block.last_op.detach()  # type: ignore[union-attr]
    with pytest.raises(IRVerifyError, match=r"^operation 'arith.addi' does not verify: "):
        verify_module(module)


def test_first_line_shifts_every_location(ctx: Context) -> None:
    assert _error("builtin.module {\n  foo.bar\n}\n", ctx, first_line=10).startswith("m.mlir:11:3:")


def test_empty_input_is_an_empty_module(ctx: Context) -> None:
    assert print_module(parse_module("// nothing here\n\n", ctx=ctx)) == "builtin.module {\n}\n"


def test_split_input_keeps_line_numbers() -> None:
    text = "a\n// -----\nb\nc\n  //-----  \nd\n// -----// IR Dump After x //----- //\n"
    assert split_input(text) == [
        InputChunk("a\n", 1),
        InputChunk("b\nc\n", 3),
        InputChunk("d\n// -----// IR Dump After x //----- //\n", 6),
    ]
