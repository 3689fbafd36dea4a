"""A plugin that contributes a pipeline schedule, ``w-last``: each mesh runs every
forward, then every B (the input gradients) as soon as it can, and only then
its W's (the weight gradients). The last stage's B's reach the first stage
without waiting for any W: the backward wave crosses the pipeline once, as in
GPipe, and the W's fill the time a mesh would wait."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from alpa_ir.errors import AlpaError
from alpa_ir.pipeline.schedule import Task
from alpa_ir.pipeline.task_order import TaskOrder
from alpa_ir.plugins.hookspecs import hookimpl


def w_last(
    meshes: int, micro_batches: int, virtual: int, caps: Sequence[int] | None = None
) -> TaskOrder:
    del caps  # holds every micro-batch, as GPipe does
    if virtual != 1:
        raise AlpaError(f"schedule 'w-last' runs one stage per mesh; got virtual-stages={virtual}")
    orders = tuple(
        tuple(
            [Task(k, b, "forward") for b in range(micro_batches)]
            + [Task(k, b, "backward") for b in range(micro_batches)]
            + [Task(k, b, "backward_weight") for b in range(micro_batches)]
            + [Task(k, None, "apply_grad")]
        )
        for k in range(meshes)
    )
    return TaskOrder("w-last", micro_batches, tuple(range(meshes)), True, orders)


@hookimpl
def alpa_ir_schedules() -> Mapping[str, Callable[..., Any]]:
    return {"w-last": w_last}
