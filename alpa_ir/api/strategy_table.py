"""``ALPA_DEBUG_PRINT_AS_STRATEGY=1`` (Alpa's): print the strategy the
auto-sharding ILP chose for every op.

Alpa's patched XLA prints its strategy per instruction while it solves; here
the chosen strategies are written into the planned module (``sharding.strategy``
on each op, the result's spec beside it), so the table is read from the
module of a freshly compiled step: one row per op of every function that was
auto-sharded (``@main`` of a one-mesh step, every stage function of a
pipeline), printed to stdout once, when the step is compiled. The variable is
read then (Alpa reads it at compile time too): ``1`` or ``true`` (any case).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from xdsl.dialects import func
from xdsl.dialects.builtin import ModuleOp, StringAttr

from alpa_ir.dialects.sharding import STRATEGY_ATTR, spec_of_value
from alpa_ir.dialects.types import shape_of

ENV = "ALPA_DEBUG_PRINT_AS_STRATEGY"
"""Alpa's environment variable."""


def asked(environ: Mapping[str, str]) -> bool:
    """Whether ``environ`` asks for the table (Alpa's test: ``1`` or ``true``)."""
    return environ.get(ENV, "False").lower() in ("true", "1")


def strategy_rows(module: ModuleOp) -> list[tuple[str, str, str, str, str]]:
    """(function, op, result shape, strategy, result spec) of every op with a
    chosen strategy, in program order."""
    rows = []
    for fn in module.body.block.ops:
        if not isinstance(fn, func.FuncOp):
            continue
        for op in fn.walk():
            strategy = op.attributes.get(STRATEGY_ATTR)
            if not isinstance(strategy, StringAttr):
                continue
            result = op.results[0] if op.results else None
            shape = "" if result is None else str(list(shape_of(result.type)))
            spec = "" if result is None else str(spec_of_value(result, fn))
            rows.append((fn.sym_name.data, op.name, shape, strategy.data, spec))
    return rows


def strategy_table(module: ModuleOp) -> str:
    """The rows of :func:`strategy_rows` as one aligned table."""
    head = ("function", "op", "result shape", "strategy", "result spec")
    rows = [head, *strategy_rows(module)]
    widths = [max(len(r[k]) for r in rows) for k in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def print_if_asked(executable: Any, environ: Mapping[str, str] | None = None) -> bool:
    """Print the table of ``executable``'s planned module when ``environ``
    (default: the process's) asks for it; whether it printed."""
    module = getattr(executable, "module", None)
    if not isinstance(module, ModuleOp) or not asked(os.environ if environ is None else environ):
        return False
    print(f"auto-sharding strategies ({ENV}):\n{strategy_table(module)}", flush=True)
    return True


__all__ = ["ENV", "asked", "print_if_asked", "strategy_rows", "strategy_table"]
