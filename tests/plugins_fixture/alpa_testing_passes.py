"""Passes that misbehave on purpose, to test the pass manager and alpa-opt.

Loaded with ``--load-plugin=alpa_testing_passes`` by the pytest and lit tests.
It also contributes xDSL's ``arith`` dialect so that tests can write small
computations without the lax dialect.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from xdsl.context import Context
from xdsl.dialects import func
from xdsl.dialects.arith import Arith
from xdsl.dialects.builtin import ModuleOp, StringAttr
from xdsl.passes import ModulePass

from alpa_ir.errors import AlpaError
from alpa_ir.plugins.hookspecs import hookimpl


@dataclass(frozen=True)
class TestFail(ModulePass):
    """Raise a RuntimeError (an internal bug of a pass)."""

    name: ClassVar[str] = "test-fail"

    message: str = "boom"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        raise RuntimeError(self.message)


@dataclass(frozen=True)
class TestUserError(ModulePass):
    """Raise an AlpaError (a user error found by a pass)."""

    name: ClassVar[str] = "test-user-error"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        raise AlpaError("the model does not fit in memory")


@dataclass(frozen=True)
class TestBreakVerify(ModulePass):
    """Erase the terminator of the first function, leaving IR that does not verify."""

    name: ClassVar[str] = "test-break-verify"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        for nested in op.walk():
            if isinstance(nested, func.FuncOp):
                last = nested.body.block.last_op
                if last is not None:
                    last.detach()
                    last.erase()
                return


@dataclass(frozen=True)
class TestRenameFuncs(ModulePass):
    """Prefix the name of every function (a visible, always-valid rewrite)."""

    name: ClassVar[str] = "test-rename-funcs"

    prefix: str = "renamed_"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        for nested in op.walk():
            if isinstance(nested, func.FuncOp):
                nested.sym_name = StringAttr(self.prefix + nested.sym_name.data)


@hookimpl
def alpa_ir_passes() -> Sequence[type[ModulePass]]:
    return [TestFail, TestUserError, TestBreakVerify, TestRenameFuncs]


@hookimpl
def alpa_ir_dialects() -> Sequence[Any]:
    return [Arith]
