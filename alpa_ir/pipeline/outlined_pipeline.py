"""The outlined pipeline module read as one typed structure.

:func:`read_pipeline` reads the form ``outline-stages``/``construct-stages``
write and ``cross-mesh-resharding`` completes: the one ``pipeline.plan``, its
``pipeline.stage`` ops in order and each stage's functions by phase, ``@main``
as a list of ``func.call`` ops (each a :class:`StageCall`: its stage, phase,
mesh and value names, ``"callee:k"`` for result ``k``), and the
``pipeline.transfer`` ops by value and destination mesh. It checks the
contract (one plan; every stage and function named exists; a function runs on
its stage's mesh; ``@main`` holds only calls, each of a stage function, each
once) and raises :class:`~alpa_ir.errors.AlpaError` naming what breaks it.
:func:`transfer_for` finds the transfer that brings a value to a consumer's
mesh, and :func:`needs_broadcast` whether the destination all-gathers it.

It is the one reader of that form: ``emit-instructions``
(:mod:`alpa_ir.pipeline.program_emission`), the runtime's
:func:`~alpa_ir.runtime.program.step_program` and the simulator's
:func:`~alpa_ir.backends.simulate.plan_from_module` read the module through it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from xdsl.dialects import func
from xdsl.dialects.builtin import ModuleOp, SymbolRefAttr
from xdsl.ir import Block, SSAValue

from alpa_ir.dialects.mesh import MESH_ATTR, LogicalMeshOp
from alpa_ir.dialects.pipeline import PlanOp, StageOp, TransferOp
from alpa_ir.dialects.sharding import ShardingSpec, signature_spec
from alpa_ir.errors import AlpaError
from alpa_ir.ir.module_utils import main_function, top_level_ops
from alpa_ir.pipeline.schedule import Phase
from alpa_ir.pipeline.transfer_attrs import RECV_SPEC_ATTR


def needs_broadcast(transfer: TransferOp, module: ModuleOp) -> bool:
    """Whether a transfer's tiles are all-gathered on the destination mesh after the
    receive (Alpa's send-once + local all-gather).

    A transfer planned by ``cross-mesh-resharding`` says so itself: it carries
    ``pipeline.recv_spec`` exactly when its destination devices receive parts of
    their tiles and all-gather them; planned ``tiles`` without it mean every
    device receives its whole tile. An unplanned transfer (no ``tiles``) needs
    one when the destination spec replicates over a destination mesh axis (of
    size > 1) on which the source is not replicated (same axis index of the
    source mesh; an axis the source mesh lacks counts as not replicated). The
    pass takes the rule as a parameter (:func:`emit_programs`), so another one
    can replace this.
    """
    if RECV_SPEC_ATTR in transfer.attributes:
        return True
    if transfer.tiles is not None:
        return False
    src_shape = mesh_shape(module, transfer.src_mesh.root_reference.data)
    dst_shape = mesh_shape(module, transfer.dst_mesh.root_reference.data)
    src_used = set(transfer.src_spec.spec.used_axes())
    dst_used = set(transfer.dst_spec.spec.used_axes())
    src_replicated = {a for a, n in enumerate(src_shape) if n > 1 and a not in src_used}
    dst_replicated = {a for a, n in enumerate(dst_shape) if n > 1 and a not in dst_used}
    return bool(dst_replicated - src_replicated)


def mesh_shape(module: ModuleOp, name: str) -> tuple[int, ...]:
    for op in top_level_ops(module, LogicalMeshOp):
        assert isinstance(op, LogicalMeshOp)
        if op.sym_name.data == name:
            return op.mesh_shape
    raise AlpaError(f"emit-instructions: module has no mesh.logical_mesh @{name}")


BroadcastRule = Callable[[TransferOp, ModuleOp], bool]


@dataclass(frozen=True)
class StageCall:
    """One ``func.call`` of @main: its stage function and value names."""

    callee: str
    stage: int
    phase: Phase
    mesh: str
    operands: tuple[str, ...]
    results: tuple[str, ...]
    arg_specs: tuple[ShardingSpec, ...]
    """Each argument's spec in the callee's signature (replicated where none is written)."""

    @property
    def per_micro_batch(self) -> bool:
        return self.phase != "apply_grad"


@dataclass
class OutlinedPipeline:
    """What :func:`read_pipeline` reads from the module."""

    plan: PlanOp
    meshes: list[str]
    """Each stage's mesh."""
    functions: list[dict[Phase, list[str]]]
    calls: dict[str, StageCall]
    producer: dict[str, StageCall]
    returned: set[str]
    transfers: dict[tuple[str, str], list[TransferOp]]
    consumers: dict[str, list[StageCall]] = field(default_factory=dict)
    outputs: tuple[str, ...] = ()
    """What @main returns, in order (value names)."""
    where: str = "emit-instructions"
    """Who reads: the start of every error."""


def one_plan(module: ModuleOp, where: str = "emit-instructions") -> PlanOp:
    plans = [op for op in top_level_ops(module, PlanOp) if isinstance(op, PlanOp)]
    if len(plans) != 1:
        raise AlpaError(f"{where}: expected one pipeline.plan, found {len(plans)}")
    return plans[0]


def _stages(module: ModuleOp, plan: PlanOp, where: str) -> list[StageOp]:
    by_name = {op.sym_name.data: op for op in top_level_ops(module, StageOp)}  # type: ignore[attr-defined]
    stages = []
    for ref in plan.stages.data:
        name = ref.root_reference.data
        if name not in by_name:
            raise AlpaError(f"{where}: plan @{plan.sym_name.data} names no stage @{name}")
        stage = by_name[name]
        assert isinstance(stage, StageOp)
        stages.append(stage)
    return stages


def _functions(module: ModuleOp) -> dict[str, func.FuncOp]:
    return {op.sym_name.data: op for op in module.ops if isinstance(op, func.FuncOp)}


def _value_name(value: SSAValue, main: func.FuncOp) -> str:
    owner = value.owner
    if isinstance(owner, Block):
        return f"{main.sym_name.data}:{value.index}"  # type: ignore[attr-defined]
    assert isinstance(owner, func.CallOp)
    return f"{owner.callee.root_reference.data}:{value.index}"  # type: ignore[attr-defined]


def read_pipeline(module: ModuleOp, where: str = "emit-instructions") -> OutlinedPipeline:
    """The plan, stages, @main's calls and the transfers, checked for the
    contract (errors start with ``where``, the reader's caller)."""
    plan = one_plan(module, where)
    stages = _stages(module, plan, where)
    functions = _functions(module)
    meshes: list[str] = []
    phase_functions: list[dict[Phase, list[str]]] = []
    owner: dict[str, tuple[int, Phase]] = {}
    for i, stage in enumerate(stages):
        mesh = stage.mesh.root_reference.data
        meshes.append(mesh)
        phases: dict[Phase, list[str]] = {}
        for phase, name in stage.phase_functions():
            if name not in functions:
                raise AlpaError(f"{where}: stage @{stage.sym_name.data} names no function @{name}")
            fn_mesh = functions[name].attributes.get(MESH_ATTR)
            if isinstance(fn_mesh, SymbolRefAttr) and fn_mesh.root_reference.data != mesh:
                raise AlpaError(
                    f"{where}: @{name} runs on @{fn_mesh.root_reference.data} but its "
                    f"stage @{stage.sym_name.data} is on @{mesh}"
                )
            phases.setdefault(phase, []).append(name)  # type: ignore[call-overload]
            owner[name] = (i, phase)  # type: ignore[assignment]
        phase_functions.append(phases)

    main = main_function(module)
    calls: dict[str, StageCall] = {}
    producer: dict[str, StageCall] = {}
    outputs: tuple[str, ...] = ()
    for op in main.body.ops:
        if isinstance(op, func.ReturnOp):
            outputs = tuple(_value_name(v, main) for v in op.operands)
            continue
        if not isinstance(op, func.CallOp):
            raise AlpaError(f"{where}: @main may hold only func.call ops, found {op.name}")
        callee = op.callee.root_reference.data
        if callee not in owner:
            raise AlpaError(f"{where}: @main calls @{callee}, which is no stage's function")
        if callee in calls:
            raise AlpaError(f"{where}: @main calls @{callee} twice")
        stage, phase = owner[callee]
        call = StageCall(
            callee,
            stage,
            phase,
            meshes[stage],
            tuple(_value_name(v, main) for v in op.operands),
            tuple(f"{callee}:{k}" for k in range(len(op.results))),
            tuple(signature_spec(functions[callee], k) for k in range(len(op.operands))),
        )
        calls[callee] = call
        for r in call.results:
            producer[r] = call

    transfers: dict[tuple[str, str], list[TransferOp]] = {}
    for op in top_level_ops(module, TransferOp):
        assert isinstance(op, TransferOp)
        key = (op.value.data, op.dst_mesh.root_reference.data)
        transfers.setdefault(key, []).append(op)

    order = {name: k for k, name in enumerate(calls)}
    for phases in phase_functions:  # apply-grad rounds run in @main's (dependency) order
        if "apply_grad" in phases:
            phases["apply_grad"].sort(key=lambda n: order.get(n, len(order)))
    pipeline = OutlinedPipeline(
        plan, meshes, phase_functions, calls, producer, set(outputs), transfers,
        outputs=outputs, where=where,
    )  # fmt: skip
    for call in calls.values():
        for v in dict.fromkeys(call.operands):
            if v in producer:
                pipeline.consumers.setdefault(v, []).append(call)
    return pipeline


def transfer_for(p: OutlinedPipeline, value: str, consumer: StageCall, index: int) -> TransferOp:
    """The transfer bringing ``value`` (operand ``index`` of ``consumer``) to its mesh."""
    src = p.producer[value].mesh
    candidates = p.transfers.get((value, consumer.mesh), [])
    if not candidates:
        raise AlpaError(
            f'{p.where}: value "{value}" read by @{consumer.callee} crosses from '
            f"@{src} to @{consumer.mesh} but no pipeline.transfer carries it "
            "(run cross-mesh-resharding first)"
        )
    if len(candidates) > 1:
        spec = consumer.arg_specs[index]
        candidates = [t for t in candidates if t.dst_spec.spec == spec]
        if len(candidates) != 1:
            raise AlpaError(
                f"{p.where}: {len(p.transfers[(value, consumer.mesh)])} transfers of "
                f'"{value}" to @{consumer.mesh}; none or several match the spec of '
                f"@{consumer.callee}'s argument {index}"
            )
    transfer = candidates[0]
    if transfer.src_mesh.root_reference.data != src:
        raise AlpaError(
            f'{p.where}: transfer @{transfer.sym_name.data} sends "{value}" from '
            f"@{transfer.src_mesh.root_reference.data}, but it is produced on @{src}"
        )
    return transfer


__all__ = [
    "BroadcastRule",
    "OutlinedPipeline",
    "StageCall",
    "mesh_shape",
    "needs_broadcast",
    "one_plan",
    "read_pipeline",
    "transfer_for",
]
