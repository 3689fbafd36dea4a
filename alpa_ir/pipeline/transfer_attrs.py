"""Cross-mesh transfer plans as IR: ``cross-mesh-resharding`` writes each plan
into its ``pipeline.transfer`` op (the tiles each source device sends, the
spec the destination receives before its local all-gather); the runtime and
the simulator read it back as a :class:`~alpa_ir.pipeline.cross_mesh.TransferPlan`."""

from __future__ import annotations

from xdsl.dialects import func
from xdsl.dialects.builtin import (
    ArrayAttr,
    DenseArrayBase,
    DictionaryAttr,
    IntegerAttr,
    ModuleOp,
    i64,
)
from xdsl.ir import Attribute

from alpa_ir.dialects.lax_attrs import ints_attr, ints_of
from alpa_ir.dialects.mesh import LogicalMeshOp
from alpa_ir.dialects.pipeline import TransferOp
from alpa_ir.dialects.sharding import ShardingSpec, ShardingSpecAttr
from alpa_ir.dialects.types import dtype_of, shape_of
from alpa_ir.errors import AlpaError
from alpa_ir.ir.module_utils import symbol_op
from alpa_ir.pipeline.cross_mesh import Box, MeshLayout, Send, TransferPlan, gather_steps

RECV_SPEC_ATTR = "pipeline.recv_spec"
"""Transfer attribute: the spec the destination receives before its local all-gather."""


def _functions(module: ModuleOp) -> dict[str, func.FuncOp]:
    return {op.sym_name.data: op for op in module.ops if isinstance(op, func.FuncOp)}


def mesh_layout(module: ModuleOp, mesh: str, spec: ShardingSpec) -> MeshLayout:
    op = symbol_op(module, mesh, LogicalMeshOp)
    assert isinstance(op, LogicalMeshOp)
    return MeshLayout(spec, op.mesh_shape, op.device_ids)


def _box_attr(box: Box) -> ArrayAttr[DenseArrayBase]:
    return ArrayAttr([ints_attr(list(b)) for b in box])


def tiles_attr(plan: TransferPlan) -> ArrayAttr[DictionaryAttr]:
    """The plan's sends as the transfer's ``tiles``."""
    return ArrayAttr(
        [
            DictionaryAttr(
                {
                    "src": IntegerAttr(s.src, i64),
                    "dst": ints_attr(s.dsts),
                    "slice": _box_attr(s.box),
                    "bytes": IntegerAttr(s.nbytes, i64),
                }
            )
            for s in plan.sends
        ]
    )


def _sends_of(tiles: ArrayAttr[DictionaryAttr]) -> tuple[Send, ...]:
    sends = []
    for entry in tiles.data:
        d = entry.data
        src, dsts, box, nbytes = d["src"], d["dst"], d["slice"], d["bytes"]
        assert isinstance(src, IntegerAttr) and isinstance(nbytes, IntegerAttr)
        assert isinstance(box, ArrayAttr)
        pairs = tuple(ints_of(b) for b in box.data)
        sends.append(
            Send(
                int(src.value.data),
                ints_of(dsts),  # type: ignore[arg-type]
                tuple((lo, hi) for lo, hi in pairs),
                int(nbytes.value.data),
            )
        )
    return tuple(sends)


def _value_type(module: ModuleOp, value: str) -> Attribute:
    callee, _, index = value.rpartition(":")
    function = _functions(module).get(callee)
    if function is None or not index.isdigit():
        raise AlpaError(f"transfer of '{value}': no function @{callee} with that result")
    return function.function_type.outputs.data[int(index)]


def plan_of_transfer(module: ModuleOp, op: TransferOp) -> TransferPlan:
    """The plan a ``pipeline.transfer`` op holds, as a :class:`TransferPlan`
    (its value's shape and dtype from the producing function)."""
    ty = _value_type(module, op.value.data)
    src = mesh_layout(module, op.src_mesh.root_reference.data, op.src_spec.spec)
    dst = mesh_layout(module, op.dst_mesh.root_reference.data, op.dst_spec.spec)
    recv = op.attributes.get(RECV_SPEC_ATTR)
    recv_spec = recv.spec if isinstance(recv, ShardingSpecAttr) else dst.spec
    if op.tiles is None:
        raise AlpaError(f"transfer @{op.sym_name.data} has no tiles")
    return TransferPlan(
        shape_of(ty),
        dtype_of(ty).itemsize,
        src,
        dst,
        recv_spec,
        gather_steps(recv_spec, dst.spec),
        _sends_of(op.tiles),
    )
