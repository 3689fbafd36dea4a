"""Alpa's ``HloStatus``: which HLO ``get_hlo_text(status)`` returns.

XLA partitions and optimizes a program in one compile, so the statuses fall in two
groups: ``UNOPTIMIZED`` and ``SHARDING_ANNOTATED`` give the program as lowered (the
plan's program with its shardings, before XLA's passes); ``SPMD_PARTITIONED`` and
``FULLY_OPTIMIZED`` (the default, as in Alpa) give the compiled per-device program,
with its collectives, printed as XLA's ``HloModule::ToString`` prints it, each
operand with its shape (``all-reduce(f32[] %x)``, ``gather(f32[64,32]{1,0} %p, ...)``),
as Alpa's ``get_hlo_text`` returned it and as Alpa's helpers read it
(``count_communication_primitives(ignore_scalar_all_reduce=True)`` finds scalar
all-reduces by ``all-reduce(f32[]``); ``compiled.as_text()`` leaves operand shapes out.
"""

from __future__ import annotations

from enum import Enum, auto
from typing import Any

from alpa_ir.errors import AlpaError


class HloStatus(Enum):
    """The state of an HLO module (Alpa's names)."""

    UNOPTIMIZED = auto()
    SHARDING_ANNOTATED = auto()
    SPMD_PARTITIONED = auto()
    FULLY_OPTIMIZED = auto()


def split_status(args: tuple[Any, ...], status: Any) -> tuple[tuple[Any, ...], HloStatus]:
    """``get_hlo_text``'s arguments: a leading :class:`HloStatus` (Alpa's positional
    form) or ``status=``, and the example arguments after it."""
    if args and isinstance(args[0], HloStatus):
        if status is not None:
            raise AlpaError("get_hlo_text: the status is given twice")
        status, args = args[0], args[1:]
    if status is None:
        status = HloStatus.FULLY_OPTIMIZED
    if not isinstance(status, HloStatus):
        raise AlpaError(
            f"get_hlo_text: status must be an alpa_ir.HloStatus "
            f"({', '.join(s.name for s in HloStatus)}), got {status!r}"
        )
    return args, status


def hlo_text(lowered: Any, status: HloStatus) -> str:
    """The HLO of a ``jax.stages.Lowered`` program at ``status`` (module docstring)."""
    if status in (HloStatus.UNOPTIMIZED, HloStatus.SHARDING_ANNOTATED):
        return str(lowered.as_text(dialect="hlo"))
    return compiled_text(lowered.compile())


def compiled_text(compiled: Any) -> str:
    """The compiled program's HLO modules, operands printed with their shapes."""
    from jaxlib._hlo import HloPrintOptions

    options = HloPrintOptions()
    options.print_operand_shape = True
    modules = compiled.runtime_executable().hlo_modules()
    return "\n".join(m.to_string(options) for m in modules)
