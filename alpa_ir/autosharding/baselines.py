"""The baselines an auto-sharding plan must never lose to.

Data parallelism (the batch split over every mesh axis, everything else
replicated; ZeRO-2 and ZeRO-3 are that plan rewritten after the solve, at the
same ILP objective) and Alpa's "Heuristic" plan (every argument split along
its largest dimension) are points of the ILP's own strategy space: the same
graph with each argument's strategies narrowed to the baseline's spec. Each
baseline is solved on that narrowed problem and priced on the full one; the
ILP's optimum must be at most every such price. When it is not, the solver
(or a reduction before it) lost the optimum: a bug to report, not a plan to
swap in silently.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np
from xdsl.ir import SSAValue

from alpa_ir.autosharding.graph import StrategyGraph
from alpa_ir.autosharding.resharding import INF
from alpa_ir.dialects.sharding import ShardingSpec
from alpa_ir.errors import AlpaError
from alpa_ir.hardware.device_mesh import LogicalDeviceMesh
from alpa_ir.solvers.ilp import ILPProblem, evaluate

BASELINES = ("data-parallel", "heuristic")
"""The baselines :func:`baseline_objectives` prices, by name."""


def heuristic_spec(arg: SSAValue, mesh: LogicalDeviceMesh) -> ShardingSpec:
    """Alpa's "Heuristic" baseline: split the largest dimension over every mesh
    axis it divides evenly (all of them if it can, else the largest one)."""
    shape = tuple(arg.type.get_shape())  # type: ignore[attr-defined]
    if not shape:
        return ShardingSpec(())
    dim = max(range(len(shape)), key=lambda d: shape[d])
    axes = tuple(a for a, n in enumerate(mesh.shape) if n > 1)
    candidates = [axes] + [(a,) for a in sorted(axes, key=lambda a: -mesh.shape[a])]
    for chosen in candidates:
        if chosen and shape[dim] % mesh.axes_size(chosen) == 0:
            dims = [()] * len(shape)
            dims[dim] = chosen
            return ShardingSpec(tuple(dims))
    return ShardingSpec.replicated(len(shape))


def data_parallel_spec(arg: SSAValue, mesh: LogicalDeviceMesh, is_batch: bool) -> ShardingSpec:
    """The data-parallel spec of an argument: a batch argument's rows split
    over every mesh axis (of size > 1), anything else replicated."""
    rank = len(arg.type.get_shape())  # type: ignore[attr-defined]
    if not is_batch or not rank:
        return ShardingSpec.replicated(rank)
    axes = tuple(a for a, n in enumerate(mesh.shape) if n > 1)
    return ShardingSpec((axes,) + ((),) * (rank - 1))


@dataclass(frozen=True)
class BaselinePrice:
    """A baseline priced in the ILP's problem (``inf``: not in the strategy
    space, or no plan under the problem's constraints)."""

    name: str
    objective: float


def narrowed(
    problem: ILPProblem,
    graph: StrategyGraph,
    spec_of_arg: Callable[[SSAValue], ShardingSpec | None],
) -> ILPProblem | None:
    """``problem`` with each argument node allowed only ``spec_of_arg(arg)``
    (None: left as it is); None when some argument cannot take its spec."""
    costs = list(problem.node_costs)
    for node in graph.nodes:
        if node.arg is None:
            continue
        want = spec_of_arg(node.arg)
        if want is None:
            continue
        keep = [k for k, s in enumerate(node.strategies) if s.value_specs[node.arg] == want]
        if not keep or not np.isfinite(costs[node.index][keep]).any():
            return None
        masked = np.full_like(costs[node.index], INF)
        masked[keep] = costs[node.index][keep]
        costs[node.index] = masked
    return replace(problem, node_costs=tuple(costs))


def baseline_objectives(
    problem: ILPProblem,
    graph: StrategyGraph,
    mesh: LogicalDeviceMesh,
    batch: Iterable[int],
    solve: Callable[[ILPProblem], Sequence[int]],
    fixed: Mapping[int, ShardingSpec] | None = None,
) -> list[BaselinePrice]:
    """Each baseline's best plan, priced on ``problem``. ``solve`` returns the
    choice of a problem (the caller's solver, sharing as the caller shares);
    arguments in ``fixed`` (a user's specs) keep them in every baseline."""
    batch, fixed = set(batch), dict(fixed or {})
    specs: dict[str, Callable[[SSAValue], ShardingSpec | None]] = {
        "data-parallel": lambda a: (
            None
            if a.index in fixed  # type: ignore[attr-defined]
            else data_parallel_spec(a, mesh, a.index in batch)
        ),  # type: ignore[attr-defined]
        "heuristic": lambda a: (
            None
            if a.index in fixed  # type: ignore[attr-defined]
            else heuristic_spec(a, mesh)
        ),
    }
    out = []
    for name in BASELINES:
        narrow = narrowed(problem, graph, specs[name])
        objective = INF
        if narrow is not None:
            try:
                objective = evaluate(problem, solve(narrow))
            except AlpaError:  # no plan under the problem's constraints
                objective = INF
        out.append(BaselinePrice(name, objective))
    return out


def worse_than(objective: float, prices: Sequence[BaselinePrice]) -> BaselinePrice | None:
    """The cheapest baseline that beats ``objective`` beyond rounding, if any."""
    beaten = [p for p in prices if objective > p.objective * (1 + 1e-6) + 1e-9]
    return min(beaten, key=lambda p: p.objective) if beaten else None
