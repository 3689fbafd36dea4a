"""Logical device meshes as Python values, and their ``mesh.logical_mesh`` ops."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from xdsl.dialects.builtin import ArrayAttr, DenseArrayBase, StringAttr, f64

from alpa_ir.dialects.lax_attrs import ints_attr, ints_of
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
        shape = check_mesh_shape(tuple(self.shape), "LogicalDeviceMesh")
        object.__setattr__(self, "shape", shape)
        if not shape:
            raise AlpaError("LogicalDeviceMesh: mesh shape must be non-empty")
        n = len(shape)
        defaults_beta = (1.0, 0.1) + (0.1,) * (n - 2) if n >= 2 else (1.0,)
        for field, default in (("alpha", (1.0,) * n), ("beta", defaults_beta[:n])):
            value = getattr(self, field)
            value = default if value is None else tuple(float(v) for v in value)
            if len(value) != n:
                raise AlpaError(f"mesh {field} needs {n} values (one per axis), got {len(value)}")
            object.__setattr__(self, field, value)
        devices = (
            tuple(range(self.size))
            if self.devices is None
            else tuple(_device_id(d) for d in self.devices)
        )
        if len(devices) != self.size:
            raise AlpaError(
                f"a mesh of shape {list(shape)} needs {self.size} devices, got {len(devices)}"
            )
        if len(set(devices)) != len(devices):
            repeated = sorted({d for d in devices if devices.count(d) > 1})
            raise AlpaError(f"mesh devices {list(devices)} list device {repeated[0]} twice")
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

    def all_gather_cost(self, num_bytes: float, mesh_dim: int) -> float:
        """Alpa's α-β price of an all-gather of ``num_bytes`` along ``mesh_dim``
        (the formulas of Alpa's ``LogicalDeviceMesh``, with which its users and
        tests write expected ILP objectives)."""
        n, alpha, beta = self._axis(mesh_dim)
        return alpha + beta * (n - 1) / n * num_bytes + 0.1

    def all_reduce_cost(self, num_bytes: float, mesh_dim: int) -> float:
        """Alpa's α-β price of an all-reduce along ``mesh_dim``."""
        n, alpha, beta = self._axis(mesh_dim)
        return alpha + beta * 2 * (n - 1) / n * num_bytes + 0.01

    def reduce_scatter_cost(self, num_bytes: float, mesh_dim: int) -> float:
        """Alpa's α-β price of a reduce-scatter along ``mesh_dim``."""
        n, alpha, beta = self._axis(mesh_dim)
        return alpha + beta * (n - 1) / n * num_bytes + 0.001

    def all_to_all_cost(self, num_bytes: float, mesh_dim: int) -> float:
        """Alpa's α-β price of an all-to-all along ``mesh_dim``."""
        n, alpha, beta = self._axis(mesh_dim)
        return alpha + beta * (n - 1) / (n * n) * num_bytes * (n / 2.0) + 0.001

    def flatten(self) -> LogicalDeviceMesh:
        """Alpa's ``flatten()``: the devices as one axis, shape ``(n, 1)``, α the
        largest and β the smallest of the axes' (as Alpa prices its flattened
        mesh; :meth:`flattened` is the planner's ``(1, n)`` view, priced by the
        slowest axis)."""
        assert self.alpha is not None and self.beta is not None
        alpha, beta = max(self.alpha), min(self.beta)
        return LogicalDeviceMesh((self.size, 1), (alpha, alpha), (beta, beta), self.devices)

    def _axis(self, mesh_dim: int) -> tuple[int, float, float]:
        assert self.alpha is not None and self.beta is not None
        if not 0 <= mesh_dim < self.rank:
            raise AlpaError(f"mesh_dim {mesh_dim} is not an axis of mesh {list(self.shape)}")
        return self.shape[mesh_dim], self.alpha[mesh_dim], self.beta[mesh_dim]

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
    from alpa_ir.ir.module_utils import symbol_op

    ref = function.attributes.get(MESH_ATTR)  # type: ignore[attr-defined]
    if ref is None:
        return None
    op = symbol_op(module, ref.root_reference.data, LogicalMeshOp)  # type: ignore[arg-type]
    assert isinstance(op, LogicalMeshOp)
    return LogicalDeviceMesh.from_op(op)


def _device_id(device: object) -> int:
    """A device id (a JAX ``Device`` becomes its index in ``jax.devices()``)."""
    if hasattr(device, "platform"):
        return device_index(device, "LogicalDeviceMesh")
    if isinstance(device, bool) or not isinstance(device, int | np.integer):
        raise AlpaError(f"LogicalDeviceMesh: device {device!r} is not an id or a JAX device")
    if int(device) < 0:
        raise AlpaError(f"LogicalDeviceMesh: device id {int(device)} is negative")
    return int(device)


def device_index(device: object, where: str = "devices") -> int:
    """The index in ``jax.devices()`` of a device given as an id or a JAX ``Device``."""
    import jax

    if isinstance(device, bool):
        raise AlpaError(f"{where}: {device!r} is not a device id or a JAX device")
    if isinstance(device, int) or (
        hasattr(device, "__index__") and not hasattr(device, "platform")
    ):
        index = int(device)  # type: ignore[call-overload]
        available = len(jax.devices())
        if not 0 <= index < available:
            raise AlpaError(
                f"{where}: device id {index} is out of range: {available} devices exist "
                "(more CPU devices: XLA_FLAGS=--xla_force_host_platform_device_count=N before "
                "jax is imported)"
            )
        return index
    devices = jax.devices()
    for k, d in enumerate(devices):
        if d == device:
            return k
    raise AlpaError(f"{where}: {device!r} is not one of this process's devices")


def device_indices(devices: Sequence[object], where: str = "devices") -> tuple[int, ...]:
    """Indices of ``devices`` (ids or JAX devices), checked distinct."""
    import jax

    available = len(jax.devices())
    ints = [int(d) for d in devices if isinstance(d, int | np.integer) and not isinstance(d, bool)]
    if ints and max(ints) >= available:
        raise AlpaError(
            f"{where}: the plan needs {max(ints) + 1} devices but only {available} local devices "
            "exist (more CPU devices: XLA_FLAGS=--xla_force_host_platform_device_count=N "
            "before jax is imported)"
        )
    ids = tuple(device_index(d, where) for d in devices)
    if len(set(ids)) != len(ids):
        repeated = sorted({i for i in ids if ids.count(i) > 1})
        raise AlpaError(f"{where}: device {repeated[0]} is listed more than once")
    if not ids:
        raise AlpaError(f"{where}: no devices given")
    return ids


class PhysicalDeviceMesh:
    """A set of this process's devices, as Alpa's ``LocalPhysicalDeviceMesh``:
    ``get_logical_mesh(shape, alpha, beta)`` views them as a logical mesh.
    Methods take it (or its logical meshes) as ``devices``."""

    def __init__(self, devices: Sequence[object] | None = None) -> None:
        import jax

        chosen = jax.devices() if devices is None else devices
        self.device_ids = device_indices(chosen, "PhysicalDeviceMesh")

    @property
    def devices(self) -> list[object]:
        import jax

        return [jax.devices()[i] for i in self.device_ids]

    @property
    def num_devices(self) -> int:
        return len(self.device_ids)

    @property
    def mesh_id(self) -> int:
        """Alpa's id of the mesh (placement specs name their meshes by it):
        the global mesh's, 0."""
        return 0

    @property
    def shape(self) -> tuple[int, int]:
        """Alpa's (hosts, devices per host): one host here."""
        return (1, self.num_devices)

    def get_logical_mesh(
        self,
        mesh_shape: Sequence[int] | None = None,
        mesh_alpha: Sequence[float] | None = None,
        mesh_beta: Sequence[float] | None = None,
        axis_names: Sequence[str] | None = None,
    ) -> LogicalDeviceMesh:
        """These devices as a logical mesh of ``mesh_shape`` (default ``(1, n)``)
        with α/β per axis (Alpa's defaults when omitted)."""
        shape = tuple(mesh_shape) if mesh_shape is not None else self.shape
        check_mesh_shape(shape, "get_logical_mesh")
        if math.prod(shape) != self.num_devices:
            raise AlpaError(
                f"get_logical_mesh: shape {list(shape)} holds {math.prod(shape)} devices, the "
                f"physical mesh has {self.num_devices}"
            )
        return LogicalDeviceMesh(
            shape,
            None if mesh_alpha is None else tuple(mesh_alpha),
            None if mesh_beta is None else tuple(mesh_beta),
            self.device_ids,
            None if axis_names is None else tuple(axis_names),
        )

    def __repr__(self) -> str:
        return f"PhysicalDeviceMesh(devices={list(self.device_ids)})"


def check_mesh_shape(shape: Sequence[object], where: str) -> tuple[int, ...]:
    """``shape`` as positive ints; a float, bool or non-positive entry is an error."""
    out = []
    for s in shape:
        if isinstance(s, bool) or not isinstance(s, int | np.integer):
            raise AlpaError(f"{where}: mesh shape {list(shape)} must hold ints, got {s!r}")
        if int(s) < 1:
            raise AlpaError(f"{where}: mesh shape {list(shape)} must be positive")
        out.append(int(s))
    return tuple(out)


def get_global_physical_mesh(create_if_not_exist: bool = True) -> PhysicalDeviceMesh | None:
    """All local devices as a :class:`PhysicalDeviceMesh` (Alpa's
    ``get_global_physical_mesh``; nothing is kept between calls)."""
    return PhysicalDeviceMesh() if create_if_not_exist else None


Devices = LogicalDeviceMesh | PhysicalDeviceMesh | Sequence[Any] | None


def resolve_mesh(devices: Devices, cluster_devices: int | None = None) -> LogicalDeviceMesh:
    """The logical mesh a method runs on: all local devices as (1, n) by default
    (Alpa's (hosts, devices) view, α = (1, 1), β = (1, 0.1)); a
    :class:`PhysicalDeviceMesh`, or a list of device ids or JAX devices, as (1, n).
    ``cluster_devices``: the devices of the Ray cluster the step runs on (the
    ray backend), which count instead of this process's."""
    import jax

    available = len(jax.devices()) if cluster_devices is None else cluster_devices
    if devices is None:
        mesh = LogicalDeviceMesh((1, available))
    elif isinstance(devices, LogicalDeviceMesh):
        mesh = devices
    elif isinstance(devices, PhysicalDeviceMesh):
        mesh = devices.get_logical_mesh()
    elif isinstance(devices, str) or not isinstance(devices, Sequence):
        raise AlpaError(
            f"devices must be a LogicalDeviceMesh, a PhysicalDeviceMesh or a list of device "
            f"ids or JAX devices, got {type(devices).__name__}"
        )
    else:
        ids = device_indices(devices)
        mesh = LogicalDeviceMesh((1, len(ids)), devices=ids)
    assert mesh.devices is not None
    if max(mesh.devices) >= available:
        have = (
            f"only {available} local devices exist (more CPU devices: "
            "XLA_FLAGS=--xla_force_host_platform_device_count=N before jax is imported)"
            if cluster_devices is None
            else f"the Ray cluster's hosts have {available}"
        )
        raise AlpaError(
            f"the mesh needs {max(mesh.devices) + 1} devices (shape {list(mesh.shape)}) but {have}"
        )
    return mesh
