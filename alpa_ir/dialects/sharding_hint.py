"""User sharding hints: ``jax.lax.with_sharding_constraint`` as the lax dialect keeps it.

A hint names JAX mesh axes per tensor dimension (``P("data", "model")`` on a mesh
``("data": 2, "model": 4)``). The op ``lax.sharding_constraint`` keeps it as its ``sharding``
property, ``[axis names, axis sizes, per-dimension axis names]``::

    %y = "lax.sharding_constraint"(%x) <{sharding = [["data", "model"], array<i64: 2, 4>,
                                          [["data"], ["model"]]], unconstrained_dims = ...}>

The op is an identity on values. ``auto-sharding`` keeps the hint as a constraint on the
plan's logical mesh (:mod:`alpa_ir.autosharding.hints` maps the names onto its axes); the
hinted value then carries exactly that spec. Bound back to JAX (one device, or a planned
program whose specs are enforced by the plan) it is the identity.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from xdsl.dialects.builtin import ArrayAttr, StringAttr
from xdsl.ir import Attribute

from alpa_ir.dialects.lax_attrs import ints_attr, ints_of
from alpa_ir.dialects.lax_params import Codec
from alpa_ir.errors import AlpaError

FREE = "*"
"""The axes of a dimension the hint leaves to the planner (``P.UNCONSTRAINED``)."""


@dataclass(frozen=True)
class ShardingHint:
    """A hint: the JAX mesh's axes (names and sizes) and the axes each dimension is split
    over (major to minor; empty: whole; ``(FREE,)``: the planner's choice)."""

    mesh_axes: tuple[str, ...]
    mesh_sizes: tuple[int, ...]
    dims: tuple[tuple[str, ...], ...]

    @staticmethod
    def of(sharding: Any) -> ShardingHint:
        """The hint of a ``NamedSharding`` (dimensions past its spec's are whole)."""
        mesh, spec = getattr(sharding, "mesh", None), getattr(sharding, "spec", None)
        if mesh is None or spec is None:
            raise AlpaError(
                f"a sharding hint must be a NamedSharding or a PartitionSpec, got "
                f"{type(sharding).__name__}"
            )
        dims: list[tuple[str, ...]] = []
        for entry in spec:
            if entry is getattr(type(spec), "UNCONSTRAINED", object()):
                dims.append((FREE,))
            elif entry is None:
                dims.append(())
            elif isinstance(entry, str):
                dims.append((entry,))
            else:
                dims.append(tuple(str(a) for a in entry))
        names = tuple(str(a) for a in mesh.axis_names)
        sizes = tuple(int(s) for s in mesh.axis_sizes)
        return ShardingHint(names, sizes, tuple(dims))

    def text(self) -> str:
        """As the user wrote it: ``P('data', None)``."""

        def dim(axes: tuple[str, ...]) -> str:
            if not axes:
                return "None"
            if axes == (FREE,):
                return "P.UNCONSTRAINED"
            return repr(axes[0]) if len(axes) == 1 else repr(axes)

        return "P(" + ", ".join(dim(d) for d in self.dims) + ")"

    def mesh_text(self) -> str:
        return ", ".join(f"{n} ({s})" for n, s in zip(self.mesh_axes, self.mesh_sizes, strict=True))

    def to_attr(self) -> ArrayAttr:
        return ArrayAttr(
            [
                ArrayAttr([StringAttr(n) for n in self.mesh_axes]),
                ints_attr(self.mesh_sizes),
                ArrayAttr([ArrayAttr([StringAttr(a) for a in d]) for d in self.dims]),
            ]
        )

    @staticmethod
    def from_attr(attr: Attribute) -> ShardingHint:
        assert isinstance(attr, ArrayAttr) and len(attr.data) == 3
        names, sizes, dims = attr.data
        assert isinstance(names, ArrayAttr) and isinstance(dims, ArrayAttr)
        return ShardingHint(
            tuple(n.data for n in names.data),  # type: ignore[attr-defined]
            ints_of(sizes),
            tuple(tuple(a.data for a in d.data) for d in dims.data),  # type: ignore[attr-defined]
        )


@dataclass(frozen=True)
class HintC(Codec):
    """The ``sharding`` of ``sharding_constraint``: kept as a :class:`ShardingHint`;
    decoded as ``None`` (the op binds as the identity)."""

    attr_type = ArrayAttr

    def encode(self, value: Any) -> Attribute | None:
        return ShardingHint.of(value).to_attr()

    def decode(self, attr: Attribute | None) -> Any:
        return None


HINT = HintC()
