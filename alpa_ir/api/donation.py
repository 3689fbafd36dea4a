"""Which arguments of a step are donated: positions, or ``"auto"`` (the
default, as Alpa's): every ``TrainState`` argument, and every other container
the step returns updated (its array leaves all come back as outputs at their
paths), never a bare array (:func:`alpa_ir.frontend.output_paths.auto_donated`;
resolved when the step is traced). A donated argument's buffers are reused for
its new value: the caller must not read it after the call, and the plan keeps
its leaves in one layout (input and output aliased), which is what lets ZeRO-2/3
shard the state's update."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from alpa_ir.errors import AlpaError

DonateArgnums = Sequence[int] | Literal["auto"]


def resolve_donate_argnums(
    donate_argnums: DonateArgnums, num_args: int
) -> tuple[int, ...] | Literal["auto"]:
    """``donate_argnums`` checked against ``num_args`` arguments: ``"auto"``,
    or the donated positions (negative ones counted from the end)."""
    if isinstance(donate_argnums, str):
        if donate_argnums != "auto":
            raise AlpaError(
                f"donate_argnums must be argument positions or 'auto', got {donate_argnums!r}"
            )
        return "auto"
    out = []
    for i in donate_argnums:
        if isinstance(i, bool) or not isinstance(i, int) or not -num_args <= i < num_args:
            raise AlpaError(
                f"donate_argnums: {i!r} is not the position of one of the {num_args} arguments"
            )
        out.append(i % num_args)
    return tuple(sorted(set(out)))
