"""Run an outlined pipeline step in one process, each stage on its own local devices.

The step is the driver function ``@main`` of the pipeline IR contract (see
:mod:`alpa_ir.stage_outline`): a list of calls of stage functions. Each stage
function is compiled once as an SPMD program on its submesh; this driver
feeds the micro-batches through the forward and backward functions in the
order of a schedule, accumulates what the apply-grad functions and the
results need (mean over micro-batches for batch-dependent values), runs the
apply-grad functions once, and returns the step's flat outputs.

Values cross meshes by ``transfer`` (a callable that moves an array onto a
destination sharding; ``jax.device_put`` unless a tile-plan transport is
given), so the same driver serves the plain copy and the planned transfers.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import jax
import numpy as np

Ref = tuple[str, int, int]
"""A value of the step: ("arg", input index, 0) or ("call", call index, result index)."""


@dataclass(frozen=True)
class StageCall:
    """One call of ``@main``: the compiled stage function and where its operands come from."""

    name: str
    stage: int
    phase: str
    operands: tuple[Ref, ...]
    run: Callable[..., Any]
    in_shardings: tuple[Any, ...]
    per_micro_batch: frozenset[int] = field(default_factory=frozenset)

    @property
    def per_step(self) -> bool:
        return self.phase == "apply_grad"


Transfer = Callable[[Any, Any], Any]


def device_put_transfer(value: Any, sharding: Any) -> Any:
    return jax.device_put(value, sharding)


@dataclass
class LocalPipelineDriver:
    """Executes the calls for ``num_micro_batches`` micro-batches."""

    calls: Sequence[StageCall]
    results: Sequence[Ref]
    batch_inputs: frozenset[int]
    num_micro_batches: int
    order: Sequence[tuple[int, int]] = ()
    """(call index, micro-batch) for the forward/backward calls in execution
    order; default: micro-batch by micro-batch, calls in ``@main`` order."""
    transfer: Transfer = device_put_transfer

    def __post_init__(self) -> None:
        if not self.order:
            self.order = [
                (k, b)
                for b in range(self.num_micro_batches)
                for k, call in enumerate(self.calls)
                if not call.per_step
            ]

    def micro_batches(self, flat: Sequence[Any]) -> list[list[Any]]:
        """Per input, its ``B`` micro-batch slices (whole inputs repeat)."""
        b = self.num_micro_batches
        out = []
        for k, x in enumerate(flat):
            if k in self.batch_inputs and b > 1:
                size = np.shape(x)[0] // b
                out.append([x[i * size : (i + 1) * size] for i in range(b)])
            else:
                out.append([x] * b)
        return out

    def __call__(self, flat: Sequence[Any]) -> list[Any]:
        inputs = self.micro_batches(flat)
        per_mb: dict[tuple[int, int, int], Any] = {}
        for k, b in self.order:
            call = self.calls[k]
            args = [self._operand(ref, b, inputs, per_mb, {}) for ref in call.operands]
            outs = self._run(call, args)
            for r, value in enumerate(outs):
                per_mb[(k, r, b)] = value
        step: dict[tuple[int, int], Any] = {}
        for k, call in enumerate(self.calls):
            if call.per_step:
                args = [self._operand(ref, None, inputs, per_mb, step) for ref in call.operands]
                for r, value in enumerate(self._run(call, args)):
                    step[(k, r)] = value
        return [self._operand(ref, None, inputs, per_mb, step) for ref in self.results]

    def _run(self, call: StageCall, args: list[Any]) -> Sequence[Any]:
        placed = [self.transfer(a, s) for a, s in zip(args, call.in_shardings, strict=True)]
        return call.run(*placed)

    def _operand(
        self,
        ref: Ref,
        b: int | None,
        inputs: list[list[Any]],
        per_mb: dict[tuple[int, int, int], Any],
        step: dict[tuple[int, int], Any],
    ) -> Any:
        kind, k, r = ref
        if kind == "arg":
            return inputs[k][0 if b is None else b]
        producer = self.calls[k]
        if producer.per_step:
            return step[(k, r)]
        if b is not None:
            return per_mb[(k, r, b)]
        key = (k, r, -1)
        if key not in per_mb:
            per_mb[key] = self._accumulate(producer, k, r, per_mb)
        return per_mb[key]

    def _accumulate(
        self, producer: StageCall, k: int, r: int, per_mb: dict[tuple[int, int, int], Any]
    ) -> Any:
        values = [per_mb[(k, r, b)] for b in range(self.num_micro_batches)]
        if r not in producer.per_micro_batch or len(values) == 1:
            return values[0]
        total = values[0]
        for v in values[1:]:
            total = total + v
        return (total / len(values)).astype(values[0].dtype)
