"""``cross-mesh-resharding`` (Alpa §6): plan every tensor that crosses meshes.

Works on the outlined pipeline form (see the pipeline IR contract): for every
operand of a ``func.call`` in ``@main`` produced by a call whose callee runs
on another mesh (``mesh.mesh``), the pass writes one ``pipeline.transfer``
per (value, destination mesh, destination spec)::

    pipeline.transfer @t0 {value = "stage0_forward:0", src_mesh = @mesh0,
      dst_mesh = @mesh1, src_spec = #sharding.spec<[S0, R]>,
      dst_spec = #sharding.spec<[R, R]>,
      tiles = [{src = 0 : i64, dst = array<i64: 4>,
                slice = [array<i64: 0, 2>, array<i64: 0, 8>], bytes = 64 : i64}, ...],
      pipeline.cross_bytes = 256 : i64, pipeline.recv_spec = #sharding.spec<[S0, S1]>}

The source spec is the producer's ``sharding.spec`` result attribute, the
destination spec the consumer's argument attribute (replicated if absent).
``tiles`` is the plan of :func:`alpa_ir.pipeline.cross_mesh.plan_transfer`: one entry
per point-to-point send (source device, destination devices, global index
slice ``[start, stop)`` per tensor axis, bytes per destination).
``pipeline.cross_bytes`` is the bytes crossing between the meshes.

With ``local-all-gather=true`` (the default) the destination devices receive
their tiles of ``pipeline.recv_spec`` (written only where it differs from
``dst_spec``) and then all-gather, over the mesh axes each tensor dimension
of ``recv_spec`` has beyond ``dst_spec``, to ``dst_spec``; with ``false``
every destination device receives its whole ``dst_spec`` tile.

Running the pass again replans the transfers it finds (same symbols).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from xdsl.context import Context
from xdsl.dialects import func
from xdsl.dialects.builtin import (
    FlatSymbolRefAttr,
    IntegerAttr,
    ModuleOp,
    StringAttr,
    i64,
)
from xdsl.ir import Attribute, OpResult, SSAValue
from xdsl.passes import ModulePass
from xdsl.rewriter import InsertPoint, Rewriter

from alpa_ir.dialects.attrs import CROSS_BYTES_ATTR
from alpa_ir.dialects.mesh import MESH_ATTR, mesh_name_of
from alpa_ir.dialects.pipeline import TransferOp
from alpa_ir.dialects.sharding import ShardingSpec, signature_spec
from alpa_ir.dialects.types import dtype_of, shape_of
from alpa_ir.errors import AlpaError
from alpa_ir.ir.module_utils import main_function
from alpa_ir.pipeline.cross_mesh import TransferPlan, plan_transfer
from alpa_ir.pipeline.transfer_attrs import (
    RECV_SPEC_ATTR,
    mesh_layout,
    tiles_attr,
)


def _functions(module: ModuleOp) -> dict[str, func.FuncOp]:
    return {op.sym_name.data: op for op in module.ops if isinstance(op, func.FuncOp)}


def _mesh_name(function: func.FuncOp) -> str:
    name = mesh_name_of(function)
    if name is None:
        raise AlpaError(f"cross-mesh-resharding: @{function.sym_name.data} has no {MESH_ATTR}")
    return name


@dataclass(frozen=True)
class _Crossing:
    value: str
    src_mesh: str
    dst_mesh: str
    src_spec: ShardingSpec
    dst_spec: ShardingSpec
    shape: tuple[int, ...]
    itemsize: int


def _crossings(module: ModuleOp) -> list[_Crossing]:
    """Every (value, destination mesh, destination spec) crossing meshes in @main."""
    functions = _functions(module)
    main = main_function(module)
    found: dict[tuple[str, str, ShardingSpec], _Crossing] = {}
    for call in main.body.walk():
        if not isinstance(call, func.CallOp):
            continue
        consumer = functions.get(call.callee.string_value())
        if consumer is None:
            raise AlpaError(f"cross-mesh-resharding: @main calls unknown @{call.callee}")
        for k, operand in enumerate(call.arguments):
            crossing = _crossing(functions, consumer, k, operand)
            if crossing is not None:
                found.setdefault((crossing.value, crossing.dst_mesh, crossing.dst_spec), crossing)
    return list(found.values())


def _crossing(
    functions: dict[str, func.FuncOp], consumer: func.FuncOp, k: int, operand: SSAValue
) -> _Crossing | None:
    if not isinstance(operand, OpResult) or not isinstance(operand.op, func.CallOp):
        return None  # an argument of @main: the driver places it
    producer = functions.get(operand.op.callee.string_value())
    if producer is None:
        raise AlpaError(f"cross-mesh-resharding: @main calls unknown @{operand.op.callee}")
    value = f"{producer.sym_name.data}:{operand.index}"
    src_mesh, dst_mesh = _mesh_name(producer), _mesh_name(consumer)
    if src_mesh == dst_mesh:
        return None
    src_ty = producer.function_type.outputs.data[operand.index]
    dst_ty = consumer.function_type.inputs.data[k]
    shape, dtype = shape_of(src_ty), dtype_of(src_ty)
    if shape != shape_of(dst_ty) or dtype != dtype_of(dst_ty):
        raise AlpaError(
            f"cross-mesh-resharding: value {value} is {dtype}{list(shape)} but "
            f"@{consumer.sym_name.data} argument {k} expects "
            f"{dtype_of(dst_ty)}{list(shape_of(dst_ty))}"
        )
    return _Crossing(
        value,
        src_mesh,
        dst_mesh,
        signature_spec(producer, operand.index, result=True),
        signature_spec(consumer, k),
        shape,
        dtype.itemsize,
    )


@dataclass(frozen=True)
class CrossMeshResharding(ModulePass):
    """Write a ``pipeline.transfer`` with its tile plan per tensor crossing meshes."""

    name = "cross-mesh-resharding"

    local_all_gather: bool = field(
        default=True,
        metadata={
            "help": "send each destination tile piece across once, then all-gather it over "
            "the destination mesh's replicated axes (Alpa's local all-gather rewrite)"
        },
    )

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        existing = {
            (t.value.data, t.dst_mesh.root_reference.data, t.dst_spec.spec): t
            for t in op.ops
            if isinstance(t, TransferOp)
        }
        names = {t.sym_name.data for t in existing.values()}
        anchor = next((o for o in op.ops if isinstance(o, func.FuncOp)), None)
        counter = 0
        for c in _crossings(op):
            try:
                src = mesh_layout(op, c.src_mesh, c.src_spec)
                dst = mesh_layout(op, c.dst_mesh, c.dst_spec)
                plan = plan_transfer(
                    c.shape, c.itemsize, src, dst, local_all_gather=self.local_all_gather
                )
            except AlpaError as err:
                raise AlpaError(f"cross-mesh-resharding: value {c.value}: {err}") from None
            old = existing.get((c.value, c.dst_mesh, c.dst_spec))
            if old is not None:
                sym = old.sym_name.data
            else:
                while f"t{counter}" in names:
                    counter += 1
                sym = f"t{counter}"
                names.add(sym)
            new = self._transfer_op(sym, c, plan)
            if old is not None:
                Rewriter.replace_op(old, new)
            elif anchor is not None:
                Rewriter.insert_op(new, InsertPoint.before(anchor))
            else:
                op.body.block.add_op(new)

    @staticmethod
    def _transfer_op(sym: str, c: _Crossing, plan: TransferPlan) -> TransferOp:
        attrs: dict[str, Attribute] = {CROSS_BYTES_ATTR: IntegerAttr(plan.cross_bytes, i64)}
        if plan.recv_spec != plan.dst.spec:
            attrs[RECV_SPEC_ATTR] = plan.recv_spec.to_attr()
        return TransferOp.create(
            properties={
                "sym_name": StringAttr(sym),
                "value": StringAttr(c.value),
                "src_mesh": FlatSymbolRefAttr(c.src_mesh),
                "dst_mesh": FlatSymbolRefAttr(c.dst_mesh),
                "src_spec": c.src_spec.to_attr(),
                "dst_spec": c.dst_spec.to_attr(),
                "tiles": tiles_attr(plan),
            },
            attributes=attrs,
        )
