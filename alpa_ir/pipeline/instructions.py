"""One instruction of a mesh's list: what ``emit-instructions`` writes as
``pipeline.program`` ops, what the runtime's interpreter executes and what
the simulator and the timeline read (one type for all of them)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Kind = Literal["run", "send", "recv", "broadcast", "free"]
Key = tuple[str, int | None]
"""A buffer: its name and micro-batch (None: once per step)."""


@dataclass(frozen=True)
class Instruction:
    """RUN ``target`` (a function), SEND/RECV/BROADCAST ``target`` (a
    transfer), or FREE ``buffers``, for ``micro_batch`` (None: per step)."""

    kind: Kind
    target: str = ""
    micro_batch: int | None = None
    buffers: tuple[str, ...] = ()

    def __str__(self) -> str:
        what = self.target or ",".join(self.buffers)
        mb = "" if self.micro_batch is None else f" mb={self.micro_batch}"
        return f"{self.kind.upper()} {what}{mb}"
