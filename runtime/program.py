"""The per-mesh programs of an outlined pipeline module, as plain picklable data.

An outlined module (the pipeline IR contract, see :mod:`alpa_ir.pipeline.stage_outline`)
names its stage functions, their meshes and, after ``emit-instructions``, one
``pipeline.program`` per mesh. :func:`step_program` reads all of that into a
:class:`StepProgram`: the calls of ``@main`` with their operands named as in
the contract (``"main:<k>"``, ``"<callee>:<k>"``), the transfers, and one
instruction list per mesh. This is what a mesh worker is sent once, and what
the instruction interpreter (:mod:`alpa_ir.runtime.interpreter`) executes.

Buffers are named as ``emit-instructions`` names them: a value's name on
the mesh that computes it (``"stage0_forward:1"``), a transfer's name on the
mesh that receives it (``"t0"``), each with its micro-batch (None: per
step; a forward/backward result needed once per step is accumulated into its
per-step buffer). A module without ``pipeline.program`` ops is an error:
run ``cross-mesh-resharding`` and ``emit-instructions`` first (the runtime
never plans).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from xdsl.dialects import func
from xdsl.dialects.builtin import DenseArrayBase, IntegerAttr, ModuleOp

from alpa_ir.dialects.attrs import BATCH_ATTR, CONCATENATED_ATTR, PER_MICRO_BATCH_ATTR
from alpa_ir.dialects.mesh import LogicalMeshOp
from alpa_ir.dialects.pipeline import (
    BroadcastOp,
    FreeOp,
    PlanOp,
    ProgramOp,
    RecvOp,
    RunOp,
    SendOp,
    TransferOp,
)
from alpa_ir.errors import AlpaError
from alpa_ir.ir.module_utils import main_function, symbol_op, top_level_ops
from alpa_ir.pipeline.cross_mesh import TransferPlan
from alpa_ir.pipeline.instructions import Instruction, Key, Kind
from alpa_ir.pipeline.outlined_pipeline import OutlinedPipeline, read_pipeline, transfer_for
from alpa_ir.pipeline.transfer_attrs import plan_of_transfer


@dataclass(frozen=True)
class Call:
    """One ``func.call`` of ``@main``."""

    function: str
    mesh: str
    operands: tuple[str, ...]
    results: tuple[str, ...]
    sources: tuple[str, ...]
    """Per operand, the buffer it is read from on this mesh: the value's name
    (an argument of ``@main`` or a result computed here) or the name of the
    transfer that brings it from another mesh."""
    per_step: bool
    """Runs once per step (an apply-grad function), not once per micro-batch."""
    per_micro_batch: frozenset[int]
    """Result indices that depend on the batch: their accumulation is a mean;
    the others are the same for every micro-batch and are taken once."""


@dataclass(frozen=True)
class Transfer:
    """A value crossing from ``src_mesh`` to ``dst_mesh``; ``dst_dims`` is the
    destination spec (mesh axes per tensor axis).

    With a tile plan (``cross-mesh-resharding``'s ``tiles``): ``plan`` is it,
    the value arrives in ``recv_dims`` (the receive spec of the local
    all-gather rewrite) and BROADCAST all-gathers it over ``gather`` ((tensor
    dim, mesh axes) pairs) into ``dst_dims``. Without one it arrives whole."""

    name: str
    value: str
    src_mesh: str
    dst_mesh: str
    dst_dims: tuple[tuple[int, ...], ...]
    recv_dims: tuple[tuple[int, ...], ...] | None = None
    gather: tuple[tuple[int, tuple[int, ...]], ...] = ()
    plan: TransferPlan | None = None

    @property
    def arrival_dims(self) -> tuple[tuple[int, ...], ...]:
        """The spec the value has on the destination mesh after RECV."""
        return self.dst_dims if self.recv_dims is None else self.recv_dims


@dataclass(frozen=True)
class MeshInfo:
    name: str
    shape: tuple[int, ...]
    device_ids: tuple[int, ...]
    axis_names: tuple[str, ...]

    @property
    def size(self) -> int:
        return len(self.device_ids)


@dataclass(frozen=True)
class StepProgram:
    """Everything a driver and its mesh workers need to run one step."""

    meshes: dict[str, MeshInfo]
    calls: dict[str, Call]
    transfers: dict[str, Transfer]
    instructions: dict[str, tuple[Instruction, ...]]
    outputs: tuple[str, ...]
    """The value names ``@main`` returns, in order."""
    num_inputs: int
    batch_args: frozenset[int]
    num_micro_batches: int
    accumulated: frozenset[str] = field(default_factory=frozenset)
    """Forward/backward results needed once per step (by an apply-grad
    function or as an output): accumulated into their per-step buffer."""
    read_per_micro_batch: frozenset[str] = field(default_factory=frozenset)
    """Accumulated results that are also read or sent per micro-batch."""
    once_per_step: dict[str, tuple[int, ...]] = field(default_factory=dict)
    """Per function run once per micro-batch, the indices of its results that
    are accumulated and read only once per step (with several micro-batches):
    the sums over the mesh that reach only them may run once per step on the
    accumulated partial sums (:mod:`alpa_ir.pipeline.deferred_sums`)."""
    concatenated: frozenset[str] = field(default_factory=frozenset)
    """Accumulated results that ``@main`` returns batch-shaped
    (``pipeline.concatenated_results``): concatenated over the micro-batches
    along axis 0, not averaged."""

    def producer(self, value: str) -> Call | None:
        return self.calls.get(value.rsplit(":", 1)[0])

    def mesh_of(self, value: str) -> str | None:
        call = self.producer(value)
        return call.mesh if call is not None else None

    def summed_in_place(self, call: Call) -> tuple[int, ...]:
        """The result indices of ``call`` that its program sums over the
        micro-batches itself (its running sums are its first parameters,
        donated, as Alpa's backward programs): with several micro-batches,
        each accumulated result of a per-micro-batch call that depends on the
        batch and is read only once per step (not concatenated)."""
        if self.num_micro_batches <= 1 or call.per_step:
            return ()
        return tuple(
            k
            for k, v in enumerate(call.results)
            if v in self.accumulated
            and k in call.per_micro_batch
            and v not in self.read_per_micro_batch
            and v not in self.concatenated
        )

    def operand_keys(self, call: Call, micro_batch: int | None) -> list[Key]:
        """The buffers a RUN of ``call`` at ``micro_batch`` reads."""
        keys: list[Key] = []
        for source in call.sources:
            if source.startswith("main:"):
                keys.append(self.argument_key(source, micro_batch))
            else:
                keys.append((source, micro_batch))
        return keys

    def argument_key(self, value: str, micro_batch: int | None) -> Key:
        index = int(value.split(":")[1])
        if index in self.batch_args and self.num_micro_batches > 1:
            return (value, 0 if micro_batch is None else micro_batch)
        return (value, None)

    def mesh_inputs(self, mesh: str) -> list[Key]:
        """The argument buffers of ``@main`` the driver places on ``mesh``."""
        keys: list[Key] = []
        for ins in self.instructions[mesh]:
            if ins.kind == "run":
                call = self.calls[ins.target]
                for key in self.operand_keys(call, ins.micro_batch):
                    if key[0].startswith("main:") and key not in keys:
                        keys.append(key)
        return keys

    def mesh_outputs(self, mesh: str) -> list[str]:
        return [v for v in dict.fromkeys(self.outputs) if self.mesh_of(v) == mesh]


def _ints(attr: object) -> list[int]:
    return [int(x) for x in attr.get_values()] if isinstance(attr, DenseArrayBase) else []


def _mesh_info(op: LogicalMeshOp) -> MeshInfo:
    from alpa_ir.runtime.devices import mesh_axis_names

    return MeshInfo(op.sym_name.data, op.mesh_shape, op.device_ids, mesh_axis_names(op))


def _transfer(module: ModuleOp, op: TransferOp) -> Transfer:
    name, value = op.sym_name.data, op.value.data
    src, dst = op.src_mesh.root_reference.data, op.dst_mesh.root_reference.data
    if op.tiles is None:
        return Transfer(name, value, src, dst, op.dst_spec.spec.dims)
    plan = plan_of_transfer(module, op)
    return Transfer(
        name, value, src, dst, op.dst_spec.spec.dims, plan.recv_spec.dims, plan.gather, plan
    )


def _calls(module: ModuleOp, pipeline: OutlinedPipeline) -> dict[str, Call]:
    """@main's calls as the runtime runs them: each operand read where
    emit-instructions reads it (the value on its own mesh, else the transfer
    that brings it: :func:`~alpa_ir.pipeline.outlined_pipeline.transfer_for`)."""
    calls: dict[str, Call] = {}
    for callee, call in pipeline.calls.items():
        function = symbol_op(module, callee, func.FuncOp)
        assert isinstance(function, func.FuncOp)
        if PER_MICRO_BATCH_ATTR in function.attributes:
            varying = frozenset(_ints(function.attributes[PER_MICRO_BATCH_ATTR]))
        else:
            varying = frozenset(range(len(call.results)))
        sources = tuple(
            v
            if v not in pipeline.producer or pipeline.producer[v].mesh == call.mesh
            else transfer_for(pipeline, v, call, k).sym_name.data
            for k, v in enumerate(call.operands)
        )
        per_step = call.phase == "apply_grad"
        calls[callee] = Call(
            callee, call.mesh, call.operands, call.results, sources, per_step, varying
        )
    return calls


def _micro_batch(op: object) -> int | None:
    attr = getattr(op, "micro_batch", None)
    return int(attr.value.data) if isinstance(attr, IntegerAttr) else None


def _read_programs(module: ModuleOp) -> dict[str, tuple[Instruction, ...]]:
    kinds: dict[type, Kind] = {
        RunOp: "run",
        SendOp: "send",
        RecvOp: "recv",
        BroadcastOp: "broadcast",
        FreeOp: "free",
    }
    programs: dict[str, tuple[Instruction, ...]] = {}
    for program in top_level_ops(module, ProgramOp):
        assert isinstance(program, ProgramOp)
        mesh = program.mesh.root_reference.data
        out: list[Instruction] = []
        for op in program.body.block.ops:
            kind = kinds.get(type(op))
            if kind is None:
                raise AlpaError(
                    f"pipeline.program {{mesh = @{mesh}}}: unknown instruction {op.name}"
                )
            mb = _micro_batch(op)
            if isinstance(op, RunOp):
                out.append(Instruction(kind, op.function.root_reference.data, mb))
            elif isinstance(op, FreeOp):
                out.append(Instruction(kind, "", mb, tuple(s.data for s in op.buffers.data)))
            else:
                out.append(Instruction(kind, op.transfer.root_reference.data, mb))  # type: ignore[attr-defined]
        programs[mesh] = tuple(out)
    return programs


def step_program(module: ModuleOp) -> StepProgram:
    """The step of an outlined pipeline module, with one instruction list per mesh."""
    main = main_function(module)
    plan = next(iter(top_level_ops(module, PlanOp)), None)
    if not isinstance(plan, PlanOp):
        raise AlpaError("the module has no pipeline.plan; outline its stages first")
    b = int(plan.num_micro_batches.value.data)
    pipeline = read_pipeline(module, where="pipeline program")
    transfers: dict[str, Transfer] = {}
    for op in top_level_ops(module, TransferOp):
        assert isinstance(op, TransferOp)
        transfers[op.sym_name.data] = _transfer(module, op)
    calls, outputs = _calls(module, pipeline), pipeline.outputs
    meshes: dict[str, MeshInfo] = {}
    for name in dict.fromkeys(c.mesh for c in calls.values()):
        mesh_op = symbol_op(module, name, LogicalMeshOp)
        assert isinstance(mesh_op, LogicalMeshOp)
        meshes[name] = _mesh_info(mesh_op)
    programs = _read_programs(module)
    if not programs:
        raise AlpaError(
            "the module has no pipeline.program instruction lists; run emit-instructions first"
        )
    for mesh in meshes:
        if mesh not in programs:
            raise AlpaError(f"no pipeline.program for mesh @{mesh}")
    for instructions in programs.values():
        for ins in instructions:
            if ins.kind in ("send", "recv", "broadcast") and ins.target not in transfers:
                raise AlpaError(f"instruction {ins} names no pipeline.transfer")
            if ins.kind == "run" and ins.target not in calls:
                raise AlpaError(f"instruction {ins} names no function that @main calls")
    per_mb = [c for c in calls.values() if not c.per_step]
    once = {v for c in calls.values() if c.per_step for v in c.operands} | set(outputs)
    accumulated = frozenset(r for c in per_mb for r in c.results if r in once)
    concatenated = _concatenated(main, outputs, accumulated, calls)
    read_per_mb = {
        v for c in per_mb for v, s in zip(c.operands, c.sources, strict=True) if v == s
    } | {
        transfers[i.target].value
        for instrs in programs.values()
        for i in instrs
        if i.kind == "send" and i.micro_batch is not None
    }
    return StepProgram(
        meshes,
        calls,
        transfers,
        programs,
        tuple(outputs),
        len(main.body.block.args),
        frozenset(_ints(main.attributes.get(BATCH_ATTR))),
        b,
        accumulated,
        frozenset(accumulated & read_per_mb),
        _once_per_step(calls, accumulated - read_per_mb - concatenated) if b > 1 else {},
        concatenated,
    )


def _once_per_step(calls: Mapping[str, Call], once: frozenset[str]) -> dict[str, tuple[int, ...]]:
    """Per per-micro-batch call, the indices of its results in ``once``."""
    out: dict[str, tuple[int, ...]] = {}
    for call in calls.values():
        indices = tuple(k for k, v in enumerate(call.results) if v in once)
        if indices and not call.per_step:
            out[call.function] = indices
    return out


def _concatenated(
    main: func.FuncOp,
    outputs: Sequence[str],
    accumulated: frozenset[str],
    calls: Mapping[str, Call],
) -> frozenset[str]:
    """The accumulated values ``@main`` returns at the indices of
    ``pipeline.concatenated_results``; none may be read by an apply-grad
    function, which reads a value once per step."""
    indices = _ints(main.attributes.get(CONCATENATED_ATTR))
    values = frozenset(outputs[k] for k in indices if outputs[k] in accumulated)
    for call in calls.values():
        if call.per_step and values & set(call.operands):
            (value, *_) = sorted(values & set(call.operands))
            raise AlpaError(
                f"{value} is returned batch-shaped (concatenated over the micro-batches) and "
                f"read once per step by @{call.function}; return a reduction of it instead"
            )
    return values
