"""Gradient accumulation as two programs, as Alpa compiles it.

A step split at its gradient marker (:mod:`alpa_ir.pipeline.step_partition`)
runs with B micro-batches as

- ``accumulate``: one micro-batch's forward and backward, its values added
  to the accumulators (``acc + value``, accumulators donated); run for the
  first B - 1 micro-batches, with the gradient reductions the plan defers
  (the sums over the mesh whose results only reach accumulated values)
  left out, so each device adds its own partial sums;
- ``accumulate_last``: the same for the last micro-batch, then the
  accumulated values averaged and the deferred reductions run once, on the
  sums (a ZeRO-2 reduce-scatter once per step, not once per micro-batch);
- ``apply``: the optimizer, on the state and the averaged values.

This is Alpa's accumulate-gradient and apply-gradient pair: Alpa runs one
accumulate program B times and its patched XLA skips the gradient
all-reduces (``grad_sync_channel_ids``) on all but the last call; stock XLA
cannot skip a collective, so the last call is a program of its own. The
program text that ``get_hlo_text`` returns is ``accumulate_last`` then
``apply``, as Alpa's two modules. Compile time no longer grows with B (the
old single program unrolled the micro-batch loop).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np
from jax import lax
from xdsl.ir import Block, Operation, SSAValue

from alpa_ir.errors import AlpaError

GRAD_SYNC_SCOPE = "grad_sync"
"""The name scope of the deferred gradient reductions in ``accumulate_last``
(their HLO metadata names it: :func:`grad_sync_channel_ids`)."""


def needed_ops(
    block: Block, ops: Sequence[Operation], wanted: Sequence[SSAValue]
) -> tuple[list[Operation], tuple[int, ...]]:
    """The ops of ``ops`` (in order) that ``wanted`` depends on, and the
    indices of the block arguments they (or ``wanted`` directly) read."""
    needed = set(wanted)
    kept: list[Operation] = []
    for op in reversed(ops):
        if any(r in needed for r in op.results):
            kept.append(op)
            needed.update(op.operands)
    kept.reverse()
    args = tuple(k for k, a in enumerate(block.args) if a in needed)
    return kept, args


def split_step(
    block: Block, part: Any, batch_args: Sequence[int]
) -> tuple[list[SSAValue], list[Operation], tuple[int, ...], list[Operation], tuple[int, ...]]:
    """The step's split into its two programs, from its partition ``part``
    (:func:`alpa_ir.pipeline.step_partition.partition_step`): the accumulated
    values, the accumulate program's ops and the block arguments it reads,
    and the apply program's ops and arguments (it returns the step's results).
    An apply program that reads a batch argument is a one-line error."""
    returned = list(block.last_op.operands)  # type: ignore[union-attr]
    accumulated = list(part.accumulated)
    acc_ops, acc_inputs = needed_ops(block, [*part.setup, *part.compute], accumulated)
    apply_ops, apply_inputs = needed_ops(block, [*part.setup, *part.apply], returned)
    if any(k in batch_args for k in apply_inputs):
        raise AlpaError(
            "gradient accumulation: the step returns or applies a batch argument itself; "
            "return values computed from it"
        )
    return accumulated, acc_ops, acc_inputs, apply_ops, apply_inputs


def averaged(total: Any, steps: int) -> Any:
    """The mean of ``steps`` accumulated values (integers: floor division)."""
    if jax.numpy.issubdtype(total.dtype, jax.numpy.inexact):
        return total / steps
    return total // steps


@dataclass(frozen=True)
class AccumulatingStep:
    """The programs of a step with gradient accumulation (module docstring),
    called like the single program it replaces: the flat inputs, batch leaves
    as ``[micro-batches, micro-batch...]`` (:attr:`in_shardings`)."""

    num_micro_batches: int
    in_shardings: tuple[Any, ...]
    """Each flat input's sharding, batch leaves with their micro-batch axis first."""
    acc_inputs: tuple[int, ...]
    """The flat inputs the accumulate programs read (batch leaves one micro-batch each)."""
    apply_inputs: tuple[int, ...]
    """The flat inputs the apply program reads."""
    micro_batch: Callable[..., tuple[Any, ...]]
    """``(i, *batch leaves) -> their micro-batch i`` in the accumulate programs' shardings."""
    micro_leaves: tuple[int, ...]
    """The batch leaves among :attr:`acc_inputs`, as :attr:`micro_batch` takes them."""
    zeros: Callable[[], tuple[Any, ...]] | None
    """The zero accumulators the first micro-batch adds to; None: :attr:`first` instead."""
    accumulate: Any
    accumulate_last: Any
    apply: Any
    acc_structs: tuple[jax.ShapeDtypeStruct, ...]
    """The accumulators (their global shapes and shardings)."""
    reduced_structs: tuple[jax.ShapeDtypeStruct, ...]
    """The averaged, reduced values ``apply`` reads."""
    micro_structs: dict[int, jax.ShapeDtypeStruct]
    """One micro-batch of each batch leaf the accumulate programs read."""
    first: Any = None
    """The first micro-batch's values, in the accumulators' layout (when
    XLA chooses that layout), instead of :attr:`zeros` and ``accumulate``."""

    def __call__(self, *flat: Any) -> tuple[Any, ...]:
        b = self.num_micro_batches
        accs = self.zeros() if self.zeros is not None else ()
        reduced: tuple[Any, ...] = ()
        for i in range(b):
            micro = dict(
                zip(
                    self.micro_leaves,
                    self.micro_batch(np.int32(i), *[flat[k] for k in self.micro_leaves]),
                    strict=True,
                )
            )
            inputs = [micro.get(k, flat[k]) for k in self.acc_inputs]
            if i == 0 and self.first is not None:
                accs = self.first(*inputs)
            elif i < b - 1:
                accs = self.accumulate(*inputs, *accs)
            else:
                reduced = self.accumulate_last(*inputs, *accs)
        return tuple(self.apply(*[flat[k] for k in self.apply_inputs], *reduced))

    def accumulate_structs(
        self, structs: Sequence[jax.ShapeDtypeStruct]
    ) -> list[jax.ShapeDtypeStruct]:
        """The accumulate programs' inputs for the step's flat input ``structs``."""
        acc_in = [self.micro_structs.get(k, structs[k]) for k in self.acc_inputs]
        return [*acc_in, *self.acc_structs]

    def lowered(self, structs: Sequence[jax.ShapeDtypeStruct]) -> tuple[Any, Any]:
        """``accumulate_last`` and ``apply`` lowered for the step's flat input
        ``structs`` (batch leaves as ``[micro-batches, ...]``)."""
        apply_in = [structs[k] for k in self.apply_inputs]
        return (
            self.accumulate_last.lower(*self.accumulate_structs(structs)),
            self.apply.lower(*apply_in, *self.reduced_structs),
        )


def micro_batch_program(shardings: Sequence[Any]) -> Callable[..., tuple[Any, ...]]:
    """The jitted ``(i, *leaves) -> leaves[i]`` into ``shardings`` (one micro-batch)."""

    def pick(i: Any, *xs: Any) -> tuple[Any, ...]:
        return tuple(lax.dynamic_index_in_dim(x, i, 0, keepdims=False) for x in xs)

    return jax.jit(pick, out_shardings=tuple(shardings))


def zeros_program(structs: Sequence[jax.ShapeDtypeStruct]) -> Callable[[], tuple[Any, ...]]:
    """The jitted zero accumulators, in their shardings."""

    def zeros() -> tuple[Any, ...]:
        return tuple(jax.numpy.zeros(s.shape, s.dtype) for s in structs)

    return jax.jit(zeros, out_shardings=tuple(s.sharding for s in structs))


_CHANNEL = re.compile(r"channel_id=(\d+)")


def grad_sync_channel_ids(hlo_text: str) -> str:
    """Alpa's ``grad_sync_channel_ids`` of a compiled ``accumulate_last``: the
    channel ids of its collectives that synchronise gradients (the deferred
    reductions, named by :data:`GRAD_SYNC_SCOPE`), as ``".3.7."``; ``""``
    when there are none."""
    ids = []
    for line in hlo_text.splitlines():
        if f"/{GRAD_SYNC_SCOPE}/" not in line:
            continue
        match = _CHANNEL.search(line)
        if match and match.group(1) not in ids:
            ids.append(match.group(1))
    return "." + ".".join(ids) + "." if ids else ""


__all__ = [
    "GRAD_SYNC_SCOPE",
    "AccumulatingStep",
    "averaged",
    "grad_sync_channel_ids",
    "micro_batch_program",
    "needed_ops",
    "zeros_program",
]
