"""The ``mesh`` dialect: the cluster (a P²-style hierarchy) and logical device
meshes on it.

A cluster is a hierarchy of levels, outermost first, each with a cardinality
and the interconnect that joins the units of that level (bandwidth in bytes/s,
latency in s; ``shared`` when one link per parent unit is shared by all the
devices below it, like a node's NIC), plus each device's memory and peak
FLOP/s::

    mesh.cluster @aws {levels = [#mesh.level<"node" x 8, bandwidth = 3.125e+09, latency = 5.0e-05, shared>,
                                 #mesh.level<"gpu" x 8, bandwidth = 1.5e+11, latency = 5.0e-06>],
                       device_memory = 1.6e+10, peak_flops = 1.25e+14}

A logical mesh is an n-d view of some of its devices, with α/β per axis and,
optionally, the placement of its axes on the hardware levels (P²'s
parallelism matrix: rows = mesh axes, columns = levels)::

    mesh.logical_mesh @m {shape = array<i64: 2, 4>, devices = array<i64: 0, 1, 2, 3, 4, 5, 6, 7>,
                          alpha = array<f64: 1.0, 1.0>, beta = array<f64: 1.0, 0.1>}

A function runs on the mesh its ``mesh.mesh`` attribute names.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from xdsl.dialects.builtin import (
    ArrayAttr,
    DenseArrayBase,
    FlatSymbolRefAttr,
    FloatAttr,
    IntAttr,
    StringAttr,
    SymbolRefAttr,
    UnitAttr,
    f64,
)
from xdsl.ir import Attribute, Dialect, ParametrizedAttribute
from xdsl.irdl import irdl_attr_definition, irdl_op_definition, opt_prop_def, prop_def, traits_def
from xdsl.parser import AttrParser
from xdsl.printer import Printer
from xdsl.traits import SymbolOpInterface
from xdsl.utils.exceptions import VerifyException

from alpa_ir.dialects.lax_attrs import ints_of
from alpa_ir.dialects.syntax import PropertiesSymbolOp, format_float

MESH_ATTR = "mesh.mesh"
"""Function attribute: the symbol of the logical mesh the function runs on."""


def mesh_name_of(function: object) -> str | None:
    """The name of the logical mesh ``function`` runs on (its ``mesh.mesh``), if any."""
    ref = getattr(function, "attributes", {}).get(MESH_ATTR)
    if isinstance(ref, SymbolRefAttr):
        return ref.root_reference.data
    return ref.data if isinstance(ref, StringAttr) else None


@irdl_attr_definition
class LevelAttr(ParametrizedAttribute):
    """One level of a cluster hierarchy: ``#mesh.level<"gpu" x 8, bandwidth = B, latency = L[, shared]>``."""

    name = "mesh.level"
    level_name: StringAttr
    size: IntAttr
    bandwidth: FloatAttr
    latency: FloatAttr
    shared: IntAttr

    @staticmethod
    def make(
        name: str, size: int, bandwidth: float, latency: float, shared: bool = False
    ) -> LevelAttr:
        return LevelAttr(
            StringAttr(name),
            IntAttr(size),
            FloatAttr(bandwidth, f64),
            FloatAttr(latency, f64),
            IntAttr(int(shared)),
        )

    @classmethod
    def parse_parameters(cls, parser: AttrParser) -> Sequence[Attribute]:
        parser.parse_punctuation("<")
        name = parser.parse_str_literal()
        parser.parse_keyword("x")
        size = parser.parse_integer()
        values: dict[str, float] = {}
        shared = False
        while parser.parse_optional_punctuation(",") is not None:
            key = parser.parse_identifier()
            if key == "shared":
                shared = True
                continue
            if key not in ("bandwidth", "latency"):
                parser.raise_error(f"unknown level field '{key}'")
            parser.parse_punctuation("=")
            values[key] = float(parser.parse_number())
        parser.parse_punctuation(">")
        if set(values) != {"bandwidth", "latency"}:
            parser.raise_error("a level needs bandwidth and latency")
        made = LevelAttr.make(name, size, values["bandwidth"], values["latency"], shared)
        return made.parameters

    def print_parameters(self, printer: Printer) -> None:
        printer.print_string("<")
        printer.print_string_literal(self.level_name.data)
        printer.print_string(
            f" x {self.size.data}, bandwidth = {format_float(self.bandwidth.value.data)}"
        )
        printer.print_string(f", latency = {format_float(self.latency.value.data)}")
        if self.shared.data:
            printer.print_string(", shared")
        printer.print_string(">")

    def verify(self) -> None:
        if self.size.data < 1:
            raise VerifyException(f"level '{self.level_name.data}' needs a positive size")
        if not self.bandwidth.value.data > 0:
            raise VerifyException(f"level '{self.level_name.data}' needs a positive bandwidth")
        if self.latency.value.data < 0:
            raise VerifyException(f"level '{self.level_name.data}' has a negative latency")


@irdl_op_definition
class ClusterOp(PropertiesSymbolOp):
    """A cluster: its hierarchy levels (outermost first) and device capabilities."""

    name = "mesh.cluster"
    sym_name = prop_def(StringAttr)
    levels = prop_def(ArrayAttr[LevelAttr])
    device_memory = prop_def(FloatAttr)
    peak_flops = prop_def(FloatAttr)
    device_name = opt_prop_def(StringAttr)
    traits = traits_def(SymbolOpInterface())
    PROPERTY_ORDER: ClassVar[tuple[str, ...]] = (
        "levels",
        "device_memory",
        "peak_flops",
        "device_name",
    )

    def num_devices(self) -> int:
        n = 1
        for level in self.levels.data:
            n *= level.size.data
        return n


@irdl_op_definition
class LogicalMeshOp(PropertiesSymbolOp):
    """A logical device mesh: shape, device ids (row-major), α and β per axis,
    optional axis names, cluster and placement (parallelism matrix)."""

    name = "mesh.logical_mesh"
    sym_name = prop_def(StringAttr)
    shape = prop_def(DenseArrayBase)
    devices = prop_def(DenseArrayBase)
    alpha = prop_def(DenseArrayBase)
    beta = prop_def(DenseArrayBase)
    axis_names = opt_prop_def(ArrayAttr[StringAttr])
    cluster = opt_prop_def(FlatSymbolRefAttr)
    placement = opt_prop_def(ArrayAttr[DenseArrayBase])
    traits = traits_def(SymbolOpInterface())
    PROPERTY_ORDER: ClassVar[tuple[str, ...]] = (
        "shape",
        "devices",
        "alpha",
        "beta",
        "axis_names",
        "cluster",
        "placement",
    )

    @property
    def mesh_shape(self) -> tuple[int, ...]:
        return ints_of(self.shape)

    @property
    def device_ids(self) -> tuple[int, ...]:
        return ints_of(self.devices)

    def verify_(self) -> None:
        shape = self.mesh_shape
        if any(s < 1 for s in shape):
            raise VerifyException(
                f"mesh @{self.sym_name.data}: shape {list(shape)} must be positive"
            )
        size = 1
        for s in shape:
            size *= s
        if len(self.device_ids) != size:
            raise VerifyException(
                f"mesh @{self.sym_name.data}: shape {list(shape)} needs {size} devices, "
                f"got {len(self.device_ids)}"
            )
        if len(set(self.device_ids)) != size:
            raise VerifyException(f"mesh @{self.sym_name.data}: device ids repeat")
        for field in ("alpha", "beta"):
            if len(getattr(self, field).get_values()) != len(shape):
                raise VerifyException(
                    f"mesh @{self.sym_name.data}: {field} needs one value per mesh axis"
                )
        if self.placement is not None:
            for row, s in zip(self.placement.data, shape, strict=False):
                prod = 1
                for v in ints_of(row):
                    prod *= v
                if prod != s:
                    raise VerifyException(
                        f"mesh @{self.sym_name.data}: placement row {list(ints_of(row))} "
                        f"does not multiply to the axis size {s}"
                    )


Mesh = Dialect("mesh", [ClusterOp, LogicalMeshOp], [LevelAttr])

__all__ = ["MESH_ATTR", "ClusterOp", "LevelAttr", "LogicalMeshOp", "Mesh"]

_ = UnitAttr
