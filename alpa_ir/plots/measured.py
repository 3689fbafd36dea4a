"""A measured step as a timeline: the runtime's recorded instructions (see
``MeshInterpreter.events``) turned into the simulator's tasks and transfers,
so that :func:`alpa_ir.plots.timeline.draw_timeline` draws both alike."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from alpa_ir.backends.simulate import SimResult, SimTask, SimTransfer
from alpa_ir.runtime.interpreter import RuntimeEvent
from alpa_ir.runtime.program import StepProgram


def measured_timeline(
    events: Sequence[RuntimeEvent],
    program: StepProgram,
    stage_of_function: Mapping[str, tuple[int, str]],
    stage_of_mesh: Mapping[str, int],
    mesh_of: Sequence[int] = (),
) -> SimResult:
    """Tasks from RUN events (stage and phase from the called function); a
    transfer from each SEND to its RECV (start of the send to end of the
    receive); times from the first event. ``mesh_of``: each stage's mesh index
    (for :meth:`SimResult.bubble_fraction`; several stages may share a mesh)."""
    origin = min((e.start for e in events), default=0.0)
    tasks, transfers = [], []
    sends = {(e.target, e.micro_batch): e for e in events if e.kind == "send"}
    for e in events:
        if e.kind == "run":
            stage, phase = stage_of_function[program.calls[e.target].function]
            tasks.append(SimTask(stage, phase, e.micro_batch, e.start - origin, e.end - origin))
        elif e.kind == "recv" and (e.target, e.micro_batch) in sends:
            send = sends[(e.target, e.micro_batch)]
            src, dst = stage_of_mesh[send.mesh], stage_of_mesh[e.mesh]
            if src != dst:
                transfers.append(
                    SimTransfer(src, dst, e.micro_batch, send.start - origin, e.end - origin)
                )
    end = max((t.end for t in tasks), default=0.0)
    return SimResult(end, (), (), tuple(tasks), tuple(transfers), tuple(mesh_of))
