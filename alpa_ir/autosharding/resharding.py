"""Resharding: the steps that turn a value laid out as spec ``src`` into spec
``dst`` on a mesh, and their cost (Alpa's Table 2, generalized).

The steps, in order:

1. pending partial sums are completed: a reduce-scatter when the destination
   splits one dimension over exactly the reduced axes, else an all-reduce;
2. a mesh axis that is the innermost split of one dimension and is next
   needed on another moves there with an all-to-all (``S0R -> RS0``), and so
   does a split over several axes that moves whole (``S01R -> RS01``);
3. every dimension keeps the longest common prefix of its source and
   destination axes and all-gathers the rest (``S0S1 -> S0R``);
4. what remains only adds splits or partial sums: a local slice, free
   (``RR -> S0S1``).

A destination that is partial over axes the source is not (a scatter-add's
operand) is made so locally: the value stays on the devices of index 0 along
those axes and is zero elsewhere.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from alpa_ir.autosharding.cost_model import CommCostModel
from alpa_ir.dialects.sharding import ShardingSpec
from alpa_ir.hardware.device_mesh import LogicalDeviceMesh

INF = float("inf")


@dataclass(frozen=True)
class ReshardStep:
    """One step: ``kind`` in all_reduce, reduce_scatter, all_to_all,
    all_gather, slice (local; includes making partial), with the spec after it."""

    kind: str
    axes: tuple[int, ...]
    after: ShardingSpec
    dim: int | None = None
    src_dim: int | None = None
    dst_dim: int | None = None
    reduce: str = "sum"


@dataclass(frozen=True)
class ReshardOptions:
    allow_all_gather: bool = True
    allow_all_to_all: bool = True


def reshard_steps(src: ShardingSpec, dst: ShardingSpec, reduce: str = "sum") -> list[ReshardStep]:
    """The steps from ``src`` to ``dst`` (see the module docstring)."""
    steps: list[ReshardStep] = []
    dims = list(src.dims)
    to_reduce = tuple(a for a in src.partial if a not in dst.partial)
    kept_partial = tuple(a for a in src.partial if a in dst.partial)
    if to_reduce:
        scatter_dim = next(
            (
                d
                for d in range(len(dims))
                if not dims[d]
                and dst.dims[d]
                and sorted(dst.dims[d]) == sorted(to_reduce)
                and reduce == "sum"
            ),
            None,
        )
        if scatter_dim is not None:
            dims[scatter_dim] = dst.dims[scatter_dim]
            steps.append(
                ReshardStep(
                    "reduce_scatter",
                    dst.dims[scatter_dim],
                    ShardingSpec(tuple(dims), kept_partial),
                    dim=scatter_dim,
                )
            )
        else:
            steps.append(
                ReshardStep(
                    "all_reduce", to_reduce, ShardingSpec(tuple(dims), kept_partial), reduce=reduce
                )
            )
    for d in range(len(dims)):
        # a split over several axes moving whole to a dim not split yet
        # (S01R -> RS01: an expert-parallel dispatch on a 2-d mesh): one
        # all-to-all over those axes
        target = next(
            (t for t in range(len(dims)) if t != d and not dims[t] and dst.dims[t] == dims[d]),
            None,
        )
        if len(dims[d]) < 2 or target is None:
            continue
        axes, dims[d], dims[target] = dims[d], (), dims[d]
        steps.append(
            ReshardStep(
                "all_to_all",
                axes,
                ShardingSpec(tuple(dims), kept_partial),
                src_dim=d,
                dst_dim=target,
            )
        )
    moved = True
    while moved:
        moved = False
        for d in range(len(dims)):
            if not dims[d]:
                continue
            axis = dims[d][-1]
            target = next((t for t in range(len(dims)) if axis in dst.dims[t]), None)
            if target is None or target == d:
                continue
            want = dst.dims[target]
            if dims[target] != want[: want.index(axis)]:
                continue
            dims[d] = dims[d][:-1]
            dims[target] = (*dims[target], axis)
            steps.append(
                ReshardStep(
                    "all_to_all",
                    (axis,),
                    ShardingSpec(tuple(dims), kept_partial),
                    src_dim=d,
                    dst_dim=target,
                )
            )
            moved = True
    for d in range(len(dims)):
        common = 0
        while (
            common < min(len(dims[d]), len(dst.dims[d])) and dims[d][common] == dst.dims[d][common]
        ):
            common += 1
        if len(dims[d]) > common:
            gathered = dims[d][common:]
            dims[d] = dims[d][:common]
            steps.append(
                ReshardStep("all_gather", gathered, ShardingSpec(tuple(dims), kept_partial), dim=d)
            )
    current = ShardingSpec(tuple(dims), kept_partial)
    if current != dst:
        steps.append(ReshardStep("slice", (), dst))
    return steps


def local_nbytes(
    shape: Sequence[int], itemsize: int, spec: ShardingSpec, mesh_shape: Sequence[int]
) -> int:
    return math.prod(spec.local_shape(shape, mesh_shape)) * itemsize


@dataclass
class ReshardCoster:
    """Prices reshards on one mesh with one cost model; memoized per
    (src, dst, shape, itemsize)."""

    mesh: LogicalDeviceMesh
    cost_model: CommCostModel
    options: ReshardOptions = field(default_factory=ReshardOptions)
    _cache: dict[tuple[object, ...], float] = field(default_factory=dict)
    _steps: dict[tuple[ShardingSpec, ShardingSpec, str], list[ReshardStep]] = field(
        default_factory=dict
    )
    """The steps of each (src, dst, reduce): the same for every shape."""

    def step_cost(
        self, step: ReshardStep, before: ShardingSpec, shape: Sequence[int], itemsize: int
    ) -> float:
        mesh, model = self.mesh, self.cost_model
        if step.kind == "slice":
            return 0.0
        if step.kind == "all_reduce":
            return model.all_reduce(
                mesh, local_nbytes(shape, itemsize, before, mesh.shape), step.axes
            )
        if step.kind == "reduce_scatter":
            return model.reduce_scatter(
                mesh, local_nbytes(shape, itemsize, before, mesh.shape), step.axes
            )
        if step.kind == "all_gather":
            if not self.options.allow_all_gather:
                return INF
            return model.all_gather(
                mesh, local_nbytes(shape, itemsize, step.after, mesh.shape), step.axes
            )
        if step.kind == "all_to_all":
            if not self.options.allow_all_to_all:
                return INF
            return model.all_to_all(
                mesh, local_nbytes(shape, itemsize, before, mesh.shape), step.axes
            )
        raise ValueError(step.kind)

    def cost(
        self,
        src: ShardingSpec,
        dst: ShardingSpec,
        shape: Sequence[int],
        itemsize: int,
        reduce: str = "sum",
    ) -> float:
        if src == dst:
            return 0.0
        key = (src, dst, tuple(shape), itemsize, reduce)
        cached = self._cache.get(key)
        if cached is not None:
            return cached
        steps = self._steps.get((src, dst, reduce))
        if steps is None:
            steps = self._steps[(src, dst, reduce)] = reshard_steps(src, dst, reduce)
        total, before = 0.0, src
        for step in steps:
            total += self.step_cost(step, before, shape, itemsize)
            before = step.after
        self._cache[key] = total
        return total
