"""Shardings a user writes by hand, as ``jax.sharding.PartitionSpec`` trees.

:class:`ManualShardingOption` (Alpa's) names the mesh axes and gives the
specs of the inputs (``in_axis_resources``) and outputs
(``out_axis_resources``) of a step: each a pytree like the arguments (or the
outputs) whose leaves are ``PartitionSpec``, ``NamedSharding`` (as ``jax.jit``'s
``in_shardings``; its mesh axes map onto the plan's by name, else by position)
or ``None`` (left to the planner), or a prefix of it (a spec for a whole
argument). With
auto-sharding the ILP keeps the given input specs and the outputs are
delivered in the given ones; with ``AutoShardingOption(enable_auto_sharding=False)``
no ILP runs and XLA's SPMD partitioner propagates the given specs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec
from xdsl.dialects import func
from xdsl.dialects.builtin import ArrayAttr, DictionaryAttr

from alpa_ir.dialects.sharding import SPEC_ATTR, ShardingSpec
from alpa_ir.errors import AlpaError


@dataclass(frozen=True)
class ManualShardingOption:
    """Alpa's ``ManualShardingOption`` (its fields in its order): mesh axis
    names and input/output specs."""

    mesh_axis_names: tuple[str, ...] | None = None
    submesh_axis_names: tuple[tuple[str, ...], ...] | None = None
    """:class:`~alpa_ir.api.pipeshard.PipeshardParallel` only: the axis names
    of each stage's mesh, in the stages' order (None: ``mesh_axis_names`` for
    every mesh)."""
    in_axis_resources: Any = None
    out_axis_resources: Any = None
    pipeline_intermediate_axes: tuple[tuple[str, int], ...] | None = None
    """:class:`~alpa_ir.api.pipeshard.PipeshardParallel` only: ``(mesh axis,
    dimension)`` pairs splitting every activation of rank 2 or more that a
    stage's forward receives from another stage's forward (Alpa's data
    parallelism across stages for values that are not step inputs)."""


@dataclass(frozen=True)
class LeafSpecs:
    """One spec (or None) per input array, in the order of the flattened
    arguments: specs without the arguments' tree (whose static fields, e.g.
    an optimizer, need not pickle), as a saved plan keeps them."""

    specs: tuple[Any, ...]


def _is_spec(x: object) -> bool:
    return x is None or isinstance(x, PartitionSpec | NamedSharding)


def as_partition_spec(spec: Any, names: Sequence[str]) -> PartitionSpec | None:
    """A spec leaf as a PartitionSpec over the plan's mesh axis ``names``: a
    ``NamedSharding`` (``jax.jit``-style ``in_shardings``) gives its spec, its
    mesh's axes mapped by name when the plan's mesh has them all, else by
    position when both meshes have as many axes."""
    if not isinstance(spec, NamedSharding):
        return spec  # type: ignore[no-any-return]
    from alpa_ir.autosharding.hints import axis_map

    theirs = tuple(str(a) for a in spec.mesh.axis_names)
    used = {a for entry in spec.spec if entry is not None for a in _axes(entry)}
    found = axis_map(used, theirs, names)
    if found is None:
        raise AlpaError(
            f"NamedSharding {spec.spec} names mesh axes {', '.join(sorted(used - set(names)))} "
            f"that the plan's mesh does not have (its axes: {', '.join(names)})"
        )
    return PartitionSpec(
        *(
            None if e is None else tuple(names[found[a]] for a in e) if isinstance(e, tuple)
            else names[found[e]]
            for e in spec.spec
        )
    )  # fmt: skip


def _axes(entry: Any) -> tuple[str, ...]:
    return tuple(entry) if isinstance(entry, tuple) else (entry,)


def expand_prefix(
    prefix: Any, tree: Any, what: str, *, none_subtrees: bool = True
) -> list[PartitionSpec | None]:
    """One spec (or None) per leaf of ``tree``, from a spec tree that is ``tree``
    or a prefix of it. Without ``none_subtrees``, a None must stand for one leaf
    (``ManualShardParallel``: a whole subtree left out is a mistake, not a plan)."""
    if not none_subtrees:
        _check_no_none_subtrees(prefix, tree, what)
    if _is_spec(prefix):
        return [prefix] * len(jax.tree.leaves(tree))
    try:
        expanded = jax.tree.map(
            lambda spec, sub: jax.tree.map(lambda _: spec, sub), prefix, tree, is_leaf=_is_spec
        )
    except (ValueError, TypeError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise AlpaError(f"{what} does not match the structure it describes: {first}") from None
    leaves = jax.tree.leaves(expanded, is_leaf=_is_spec)
    if len(leaves) != len(jax.tree.leaves(tree)):
        raise AlpaError(
            f"{what} has {len(leaves)} leaves, the structure has {len(jax.tree.leaves(tree))}"
        )
    return leaves


def _check_no_none_subtrees(prefix: Any, tree: Any, what: str) -> None:
    """A one-line error for the first None of ``prefix`` that stands for a subtree."""
    if prefix is None:
        if len(jax.tree.leaves(tree)) != 1 or jax.tree.leaves(tree)[0] is not tree:
            raise AlpaError(f"{what} is None for all the arguments; give a PartitionSpec per leaf")
        return
    found: list[str] = []

    def visit(path: Any, spec: Any, sub: Any) -> None:
        if spec is None and not found and not (jax.tree.leaves(sub) == [sub]):
            leaves = len(jax.tree.leaves(sub))
            found.append(f"{jax.tree_util.keystr(path)} ({leaves} leaves)")

    try:
        jax.tree_util.tree_map_with_path(visit, prefix, tree, is_leaf=_is_spec)
    except (ValueError, TypeError):
        return  # the structure check below names the mismatch
    if found:
        raise AlpaError(
            f"{what} is None for the whole subtree {found[0]}; only a leaf may be None "
            "(left to the planner): give a PartitionSpec for the subtree, or one per leaf"
        )


def spec_from_partition_spec(
    pspec: PartitionSpec, rank: int, names: Sequence[str], mesh_shape: Sequence[int] | None = None
) -> ShardingSpec:
    """Our spec for a JAX PartitionSpec; mesh axes of size 1 (given ``mesh_shape``)
    split nothing and are dropped, as in JAX."""
    if len(pspec) > rank:
        raise AlpaError(f"PartitionSpec {pspec} has {len(pspec)} entries for a rank-{rank} array")
    dims: list[tuple[int, ...]] = []
    for entry in tuple(pspec) + (None,) * (rank - len(pspec)):
        if entry is None:
            dims.append(())
            continue
        axes = entry if isinstance(entry, tuple) else (entry,)
        try:
            picked = tuple(names.index(a) for a in axes)
        except ValueError:
            raise AlpaError(
                f"PartitionSpec {pspec} names a mesh axis not in {list(names)}"
            ) from None
        if mesh_shape is not None:
            picked = tuple(a for a in picked if mesh_shape[a] > 1)
        dims.append(picked)
    return ShardingSpec(tuple(dims))


def spec_entries(
    specs: Sequence[PartitionSpec | None],
    shapes: Sequence[tuple[int, ...]],
    names: Sequence[str],
    mesh_shape: Sequence[int],
) -> ArrayAttr:
    """Argument or result attribute dictionaries carrying the given specs."""
    entries = []
    for spec, shape in zip(specs, shapes, strict=True):
        if spec is None:
            entries.append(DictionaryAttr({}))
            continue
        s = spec_from_partition_spec(spec, len(shape), names, mesh_shape)
        for d, axes in enumerate(s.dims):
            ways = int(np.prod([mesh_shape[a] for a in axes])) if axes else 1
            if shape[d] % ways:
                raise AlpaError(
                    f"PartitionSpec {spec} splits dimension {d} of size {shape[d]} {ways} ways"
                )
        entries.append(DictionaryAttr({SPEC_ATTR: s.to_attr()}))
    return ArrayAttr(entries)


def annotate_inputs(
    function: func.FuncOp,
    args: Any,
    in_specs: Any,
    names: Sequence[str],
    mesh_shape: Sequence[int],
    what: str = "in_axis_resources",
    none_subtrees: bool = True,
) -> None:
    """User PartitionSpecs of the arguments become argument specs the planner
    keeps; ``in_specs`` may also be :class:`LeafSpecs` (one per input array)."""
    shapes = [tuple(np.shape(x)) for x in jax.tree.leaves(args)]
    if isinstance(in_specs, LeafSpecs):
        if len(in_specs.specs) != len(shapes):
            raise AlpaError(
                f"{what} gives {len(in_specs.specs)} specs for the {len(shapes)} input arrays"
            )
        leaf_specs = list(in_specs.specs)  # one per array (a None subtree holds none)
    else:
        leaf_specs = expand_prefix(in_specs, args, what, none_subtrees=none_subtrees)
    specs = [as_partition_spec(s, names) for s in leaf_specs]
    function.arg_attrs = spec_entries(specs, shapes, names, mesh_shape)


def annotate_outputs(
    function: func.FuncOp,
    out_tree: Any,
    out_specs: Any,
    names: Sequence[str],
    mesh_shape: Sequence[int],
) -> list[PartitionSpec | None]:
    """User PartitionSpecs of the outputs as result specs of ``function``; returns them per leaf."""
    template = jax.tree.unflatten(out_tree, [0] * out_tree.num_leaves)
    specs = [
        as_partition_spec(s, names)
        for s in expand_prefix(out_specs, template, "out_axis_resources")
    ]
    shapes = [tuple(t.get_shape()) for t in function.function_type.outputs.data]  # type: ignore[attr-defined]
    function.res_attrs = spec_entries(specs, shapes, names, mesh_shape)
    return specs


def annotate_user_axes(function: func.FuncOp, args: Any, in_specs: Any) -> None:
    """The arguments' user specs as mesh axis names (``sharding.user_axes``), for
    a pipeline whose stages' meshes are not known yet: each stage function
    that takes an argument gets its spec on its own mesh
    (:func:`alpa_ir.pipeline.manual_stage_specs.constrain_user_axes`). As in
    Alpa's pipelines (pjit's convention), a None leaf or subtree is
    replicated."""
    from alpa_ir.pipeline.manual_stage_specs import set_user_axes

    axes = []
    for spec in expand_prefix(in_specs, args, "in_axis_resources"):
        if isinstance(spec, NamedSharding):
            spec = spec.spec
        entries = () if spec is None else tuple(spec)
        axes.append(tuple(() if e is None else _axes(e) for e in entries))
    set_user_axes(function, axes)
