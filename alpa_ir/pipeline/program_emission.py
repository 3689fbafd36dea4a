"""The static instruction list of each mesh (Alpa §6), the library of
``emit-instructions``.

:func:`emit_programs` reads the outlined module
(:func:`~alpa_ir.pipeline.outlined_pipeline.read_pipeline`) and returns each
mesh's list; :func:`program_op` wraps one in a ``pipeline.program``.

Each mesh's list follows the schedule's task order
(:class:`~alpa_ir.pipeline.task_order.TaskOrder`); for each function of each
task of its stage (a task's functions: its phase's; a schedule that does not
split the backward runs a stage's ``backward_weight`` function right after its
``backward`` one, in the backward task; a zero-bubble schedule needs
``split-backward`` first):

1. ``recv`` each transfer the function's call reads that this mesh has not
   received yet for this micro-batch (per-step values: once), followed by
   ``broadcast`` when :func:`needs_broadcast` says so (the transfer carries
   ``pipeline.recv_spec``: a local all-gather was planned);
2. ``run`` the function (``micro_batch`` absent for apply-grad);
3. ``send`` each transfer of its results with a consumer on another mesh:
   per micro-batch after each run, and, for accumulated values read by
   another mesh's apply-grad, once after the function's last run;
4. ``free`` the buffers whose last use on this mesh was one of the above.

Buffers are named as values are (``"stage0_forward:1"``, with ``micro_batch``
for a per-micro-batch buffer, without for a per-step one); a received buffer
is named by its transfer (``"t0"``), as it holds the value in the destination
layout. Accumulation is implied: a forward/backward result that is
accumulated (read by an apply-grad call or returned by ``@main``) is added in
place into its per-step buffer by each run (the mean; a result that the
outliner's ``pipeline.per_micro_batch`` marks as not varying is kept once,
the runtime's choice), which keeps that buffer live from
the first run to its last reader; a per-micro-batch buffer exists only for a
result that is also read per micro-batch, or that nothing reads (freed right
after the run). Arguments of ``@main`` are the driver's (placed on the mesh
before the step, never freed here), and so are the buffers of values
``@main`` returns.

Semantics the lists are written for (and that tests simulate): ``send`` does
not block (the runtime keeps the buffer until the send completes, also past a
``free``), ``recv`` blocks until the matching send was issued. The task orders
are deadlock-free (:func:`~alpa_ir.pipeline.task_order.linear_order` orders all
tasks consistently with every list), and every value a task reads is produced
by a task earlier in that order, or earlier in the same task (checked), so
each ``recv``'s send is issued before it: by induction every list runs to its
end.

Decisions (the contract is silent): every operand of a call that another
mesh's call produces needs a ``pipeline.transfer`` of that value to this mesh
(an error names the value and suggests ``cross-mesh-resharding`` otherwise);
with several transfers of a value to one mesh, the one whose ``dst_spec`` is
the consumer's argument spec is used. Several stages may share a mesh
(virtual stages): the schedule must place them there too (``interleaved-1f1b``:
stage ``s`` on mesh ``s mod p``; ``zb-v``: the V), and a result of an apply-grad
call may only be returned, never read by another call.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from xdsl.dialects.builtin import (
    ArrayAttr,
    FlatSymbolRefAttr,
    IntegerAttr,
    ModuleOp,
    StringAttr,
    i64,
)
from xdsl.ir import Block, Operation, Region

from alpa_ir.dialects.pipeline import (
    BroadcastOp,
    FreeOp,
    ProgramOp,
    RecvOp,
    RunOp,
    SendOp,
    TransferOp,
)
from alpa_ir.errors import AlpaError
from alpa_ir.pipeline.instructions import Instruction
from alpa_ir.pipeline.outlined_pipeline import (
    BroadcastRule,
    OutlinedPipeline,
    StageCall,
    needs_broadcast,
    read_pipeline,
    transfer_for,
)
from alpa_ir.pipeline.schedule import Task
from alpa_ir.pipeline.schedule_kinds import ScheduleBuilder, order_of_plan
from alpa_ir.pipeline.task_order import TaskOrder, linear_order

Buffer = tuple[str, int | None]
"""A buffer on a mesh: its name and micro-batch (None: per step)."""


@dataclass
class _ListBuilder:
    """Builds one mesh's list and records each buffer's definition and uses."""

    instructions: list[Instruction] = field(default_factory=list)
    defined: dict[Buffer, int] = field(default_factory=dict)
    last_use: dict[Buffer, int] = field(default_factory=dict)

    def add(
        self, ins: Instruction, uses: Iterable[Buffer] = (), defs: Iterable[Buffer] = ()
    ) -> None:
        at = len(self.instructions)
        self.instructions.append(ins)
        for b in uses:
            self.last_use[b] = at
        for b in defs:
            self.defined.setdefault(b, at)
            self.last_use[b] = at

    def with_frees(self, keep: set[Buffer]) -> list[Instruction]:
        """The list with a ``free`` after each instruction that last used a buffer."""
        freed: dict[int, list[Buffer]] = {}
        for b in sorted(self.defined, key=lambda b: self.defined[b]):
            if b not in keep:
                freed.setdefault(self.last_use[b], []).append(b)
        out: list[Instruction] = []
        for at, ins in enumerate(self.instructions):
            out.append(ins)
            by_mb: dict[int | None, list[str]] = {}
            for name, mb in freed.get(at, []):
                by_mb.setdefault(mb, []).append(name)
            out += [Instruction("free", "", mb, tuple(names)) for mb, names in by_mb.items()]
        return out


def _task_functions(p: OutlinedPipeline, order: TaskOrder, task: Task) -> list[str]:
    """The functions a task runs, in order: a schedule that does not split the
    backward runs W right after B in the backward task."""
    phases = p.functions[task.stage]
    if task.phase == "backward" and not order.split_backward:
        return phases.get("backward", []) + phases.get("backward_weight", [])
    return list(phases.get(task.phase, []))


def _call_task(p: OutlinedPipeline, order: TaskOrder, call: StageCall, mb: int | None) -> Task:
    phase = call.phase
    if phase == "backward_weight" and not order.split_backward:
        phase = "backward"
    return Task(call.stage, mb if call.per_micro_batch else None, phase)


def _mesh_runs(p: OutlinedPipeline, order: TaskOrder, mesh: int) -> list[tuple[Task, str]]:
    """The functions mesh ``mesh`` runs, with their tasks, in order. Its stages'
    apply-grad functions run last, in @main's (dependency) order across the
    stages: with several stages on the mesh, every stage's first round before
    any stage's second (a round may read another stage's earlier round)."""
    runs = [
        (t, fn)
        for t in order.orders[mesh]
        if t.phase != "apply_grad"
        for fn in _task_functions(p, order, t)
    ]
    position = {name: k for k, name in enumerate(p.calls)}
    applies = [
        (Task(s, None, "apply_grad"), fn)
        for s in order.stages_of(mesh)
        for fn in p.functions[s].get("apply_grad", [])
    ]
    applies.sort(key=lambda run: position.get(run[1], len(position)))
    return runs + applies


def _check_order(p: OutlinedPipeline, order: TaskOrder, at: dict[Task, int]) -> None:
    """Every value a call reads is produced by an earlier task, or earlier in the same
    task, for every micro-batch (``at``: a deadlock-free order of all tasks)."""

    def when(call: StageCall, mb: int) -> tuple[int, int]:
        task = _call_task(p, order, call, mb)
        return at[task], _task_functions(p, order, task).index(call.callee)

    for call in p.calls.values():
        for v in call.operands:
            prod = p.producer.get(v)
            if prod is None:
                continue
            if not prod.per_micro_batch:
                if call.per_micro_batch:
                    raise AlpaError(
                        f'emit-instructions: @{call.callee} reads "{v}", a result of apply-grad '
                        f"function @{prod.callee}; apply-grad results may only be returned or "
                        "read by a later apply-grad function"
                    )
                continue
            if not call.per_micro_batch:
                continue
            for b in range(order.num_micro_batches):
                if when(prod, b) >= when(call, b):
                    raise AlpaError(
                        f"emit-instructions: schedule '{order.kind}' runs @{call.callee} no "
                        f'later than @{prod.callee}, whose result "{v}" it reads (micro-batch {b})'
                    )


def emit_programs(
    module: ModuleOp,
    schedule: str | None = None,
    broadcast: BroadcastRule = needs_broadcast,
    schedules: Mapping[str, ScheduleBuilder] | None = None,
) -> dict[str, list[Instruction]]:
    """The instruction list of each mesh (in stage order), without touching the
    module. ``schedules``: the builders by name (default: the built-in ones)."""
    p = read_pipeline(module)
    kind = schedule or p.plan.schedule.data
    num_mb = int(p.plan.num_micro_batches.value.data)
    caps = p.plan.in_flight_caps()
    distinct = list(dict.fromkeys(p.meshes))
    try:
        order = order_of_plan(
            kind, p.meshes, num_mb, caps, p.plan.stage_phase_times(), schedules=schedules
        )
    except AlpaError as error:
        raise AlpaError(f"emit-instructions: {error}") from error
    if order.split_backward and not any("backward_weight" in f for f in p.functions):
        raise AlpaError(
            f"emit-instructions: schedule '{kind}' runs the backward as two tasks (B and W), "
            "but no stage's backward is split; run split-backward first (a step without weight "
            "gradients has nothing to split: use 1f1b)"
        )
    at = linear_order(order)
    _check_order(p, order, at)

    accumulated = {
        v
        for v, prod in p.producer.items()
        if prod.per_micro_batch
        and (v in p.returned or any(not c.per_micro_batch for c in p.consumers.get(v, [])))
    }
    # the transfers each call receives, and each value's sends (per micro-batch / per step)
    reads: dict[str, list[tuple[str, TransferOp | None]]] = {}
    sends_mb: dict[str, list[TransferOp]] = {}
    sends_step: dict[str, list[TransferOp]] = {}
    for call in p.calls.values():
        reads[call.callee] = []
        for k, v in enumerate(call.operands):
            prod = p.producer.get(v)
            if prod is None:
                continue
            t = transfer_for(p, v, call, k) if prod.mesh != call.mesh else None
            reads[call.callee].append((v, t))
            if t is not None:
                target = sends_mb if call.per_micro_batch else sends_step
                if t not in target.setdefault(v, []):
                    target[v].append(t)
    last_run: dict[str, Task | None] = {}
    for call in p.calls.values():
        runs = [_call_task(p, order, call, b) for b in range(num_mb)]
        last_run[call.callee] = max(runs, key=lambda t: at[t]) if call.per_micro_batch else None

    programs: dict[str, list[Instruction]] = {}
    for k, mesh in enumerate(distinct):
        lb = _ListBuilder()
        received: set[Buffer] = set()
        keep: set[Buffer] = {(v, None) for v in p.returned if v in p.producer}
        for task, fn in _mesh_runs(p, order, k):
            if fn not in p.calls:
                continue
            call = p.calls[fn]
            mb = task.micro_batch
            uses: list[Buffer] = []
            for v, t in reads[fn]:
                if t is None:  # produced on this mesh
                    uses.append((v, mb) if call.per_micro_batch else (v, None))
                    continue
                buf = (t.sym_name.data, mb)
                if buf not in received:
                    received.add(buf)
                    lb.add(Instruction("recv", t.sym_name.data, mb), defs=[buf])
                    if broadcast(t, module):
                        lb.add(Instruction("broadcast", t.sym_name.data, mb), uses=[buf])
                uses.append(buf)
            defs: list[Buffer] = []
            for v in call.results:
                if v not in accumulated:
                    defs.append((v, mb))
                    continue
                defs.append((v, None))  # the per-step buffer, accumulated in place
                if any(c.per_micro_batch for c in p.consumers.get(v, [])) or v in sends_mb:
                    defs.append((v, mb))
            lb.add(Instruction("run", fn, mb), uses=uses, defs=defs)
            for v in call.results:
                for t in sends_mb.get(v, []):
                    lb.add(Instruction("send", t.sym_name.data, mb), uses=[(v, mb)])
            if task == last_run[fn] or not call.per_micro_batch:
                for v in call.results:
                    for t in sends_step.get(v, []):
                        lb.add(Instruction("send", t.sym_name.data, None), uses=[(v, None)])
        programs[mesh] = lb.with_frees(keep)
    return programs


def _op(ins: Instruction) -> Operation:
    props: dict[str, object] = {}
    if ins.kind == "run":
        props["function"] = FlatSymbolRefAttr(ins.target)
    elif ins.kind == "free":
        props["buffers"] = ArrayAttr([StringAttr(b) for b in ins.buffers])
    else:
        props["transfer"] = FlatSymbolRefAttr(ins.target)
    if ins.micro_batch is not None:
        props["micro_batch"] = IntegerAttr(ins.micro_batch, i64)
    kinds = {"run": RunOp, "send": SendOp, "recv": RecvOp, "broadcast": BroadcastOp, "free": FreeOp}
    return kinds[ins.kind].create(properties=props)  # type: ignore[arg-type]


def program_op(mesh: str, instructions: list[Instruction]) -> ProgramOp:
    """The ``pipeline.program`` holding ``instructions`` for ``mesh``."""
    return ProgramOp.create(
        properties={"mesh": FlatSymbolRefAttr(mesh)},
        regions=[Region(Block([_op(i) for i in instructions]))],
    )


__all__ = ["Buffer", "emit_programs", "program_op"]
