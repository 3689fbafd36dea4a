"""Logical device meshes as Python values, and their ``mesh.logical_mesh`` ops."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from xdsl.dialects.builtin import ArrayAttr, DenseArrayBase, StringAttr, f64

from alpa_ir.dialects.lax_params import ints_attr, ints_of
from alpa_ir.dialects.mesh import LogicalMeshOp
from alpa_ir.errors import AlpaError


@dataclass(frozen=True)
class LogicalDeviceMesh:
    """An n-d view of devices with a latency ``alpha`` and an inverse bandwidth
    ``beta`` per axis (Alpa's defaults: α = 1, β = 1 on the first axis and 0.1
    on the second, i.e. a (hosts, gpus) mesh). ``devices`` are device ids in
    row-major mesh order (default ``0..n-1``)."""

    shape: tuple[int, ...]
    alpha: tuple[float, ...] | None = None
    beta: tuple[float, ...] | None = None
    devices: tuple[int, ...] | None = None
    axis_names: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        shape = tuple(int(s) for s in self.shape)
        object.__setattr__(self, "shape", shape)
        if not shape or any(s < 1 for s in shape):
            raise AlpaError(f"mesh shape {list(shape)} must be non-empty and positive")
        n = len(shape)
        defaults_beta = (1.0, 0.1) + (0.1,) * (n - 2) if n >= 2 else (1.0,)
        for field, default in (("alpha", (1.0,) * n), ("beta", defaults_beta[:n])):
            value = getattr(self, field)
            value = default if value is None else tuple(float(v) for v in value)
            if len(value) != n:
                raise AlpaError(f"mesh {field} needs {n} values (one per axis), got {len(value)}")
            object.__setattr__(self, field, value)
        devices = (
            tuple(range(self.size)) if self.devices is None else tuple(int(d) for d in self.devices)
        )
        if len(devices) != self.size or len(set(devices)) != len(devices):
            raise AlpaError(
                f"a mesh of shape {list(shape)} needs {self.size} distinct devices, got {len(devices)}"
            )
        object.__setattr__(self, "devices", devices)
        names = self.axis_names or tuple(f"m{k}" for k in range(n))
        if len(names) != n:
            raise AlpaError(f"mesh axis_names needs {n} names, got {len(names)}")
        object.__setattr__(self, "axis_names", tuple(names))

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def rank(self) -> int:
        return len(self.shape)

    def axes_size(self, axes: Sequence[int]) -> int:
        return math.prod(self.shape[a] for a in axes)

    def flattened(self) -> LogicalDeviceMesh:
        """The same devices as one ring, ``(1, n)``, priced by the slowest axis
        (a collective over all devices of this mesh is bottlenecked by it)."""
        assert self.alpha is not None and self.beta is not None
        alpha, beta = max(self.alpha), max(self.beta)
        return LogicalDeviceMesh((1, self.size), (alpha, alpha), (beta, beta), self.devices)

    def to_op(self, name: str = "mesh") -> LogicalMeshOp:
        assert self.devices is not None and self.alpha is not None and self.beta is not None
        props = {
            "sym_name": StringAttr(name),
            "shape": ints_attr(self.shape),
            "devices": ints_attr(self.devices),
            "alpha": DenseArrayBase.from_list(f64, list(self.alpha)),
            "beta": DenseArrayBase.from_list(f64, list(self.beta)),
            "axis_names": ArrayAttr([StringAttr(a) for a in self.axis_names or ()]),
        }
        return LogicalMeshOp.create(properties=props)

    @staticmethod
    def from_op(op: LogicalMeshOp) -> LogicalDeviceMesh:
        names = tuple(a.data for a in op.axis_names.data) if op.axis_names is not None else None
        return LogicalDeviceMesh(
            op.mesh_shape,
            tuple(float(v) for v in op.alpha.get_values()),
            tuple(float(v) for v in op.beta.get_values()),
            ints_of(op.devices),
            names,
        )


def function_mesh(module: object, function: object) -> LogicalDeviceMesh | None:
    """The logical mesh ``function`` runs on (its ``mesh.mesh`` attribute), or None."""
    from alpa_ir.dialects.mesh import MESH_ATTR
    from alpa_ir.module_utils import symbol_op

    ref = function.attributes.get(MESH_ATTR)  # type: ignore[attr-defined]
    if ref is None:
        return None
    op = symbol_op(module, ref.root_reference.data, LogicalMeshOp)  # type: ignore[arg-type]
    assert isinstance(op, LogicalMeshOp)
    return LogicalDeviceMesh.from_op(op)
