"""Benchmark of the intra-op costing of one stage: the auto-sharding ILP of one
automatic layer of a benchmark model on a logical mesh (what ``construct-stages``
solves per (layer range, logical mesh) pair).

``dump`` traces the model (abstractly, as ``alpa-bench`` does), outlines the
chosen layer range, builds its ILP for each logical mesh and writes it as a
``.npz`` of plain arrays (no pickles: loading one runs no code);
``solve`` runs the solver on dumped problems and reports time, objective,
optimality and the number of variables (after tying repeated layers), so that
solver changes can be compared on the same instances; ``plan`` times the
whole ``plan_function`` (graph, ILP, plan written into the IR).

Run: ``python -m alpa_ir.tools.bench_stage_ilp dump gpt3-1.3b --out ilps --meshes 1x8 2x4``
then ``python -m alpa_ir.tools.bench_stage_ilp solve ilps/*.npz``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings
from dataclasses import dataclass
from typing import Any


@dataclass
class Instance:
    """One dumped stage ILP and where it came from."""

    model: str
    mesh: tuple[int, ...]
    layers: int
    first: int
    last: int
    num_ops: int
    problem: Any  # alpa_ir.solvers.ilp.ILPProblem


class _Captured(Exception):
    def __init__(self, problem: Any) -> None:
        super().__init__("captured")
        self.problem = problem


def _parse_mesh(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split("x"))


def _layer_function(model: str, layers: int, first: int, last: int) -> Any:
    import jax

    jax.config.update("jax_platforms", "cpu")
    from alpa_ir.ir.module_utils import main_function
    from alpa_ir.pipeline.layer_ranges import LayerRanges
    from alpa_ir.tools.bench_suite import trace

    module = trace(model, 16, layers)
    return LayerRanges(main_function(module)).function(first, last).function


def _mesh(shape: tuple[int, ...]) -> Any:
    from alpa_ir.tools.bench_suite import bench_cluster

    size = shape[0] * shape[1]
    return bench_cluster("alpa-testbed", size).logical_mesh(shape, tuple(range(size)))


def save_instance(path: str, inst: Instance) -> None:
    """``inst`` as plain arrays in one ``.npz`` (no pickled objects)."""
    import numpy as np

    problem = inst.problem
    arrays: dict[str, Any] = {
        "meta": np.array(
            json.dumps(
                {
                    "model": inst.model,
                    "mesh": list(inst.mesh),
                    "layers": inst.layers,
                    "first": inst.first,
                    "last": inst.last,
                    "num_ops": inst.num_ops,
                    "nodes": len(problem.node_costs),
                    "edges": [[e.u, e.v] for e in problem.edges],
                    "liveness": [list(s) for s in problem.liveness],
                    "memory_budget": problem.memory_budget,
                    "memory": problem.node_memory is not None,
                    "names": list(problem.node_names or ()),
                }
            )
        )
    }
    for k, cost in enumerate(problem.node_costs):
        arrays[f"cost{k}"] = cost
    for k, edge in enumerate(problem.edges):
        arrays[f"edge{k}"] = edge.cost
    for k, mem in enumerate(problem.node_memory or ()):
        arrays[f"memory{k}"] = mem
    np.savez(path, **arrays)


def load_instance(path: str) -> Instance:
    """The instance :func:`save_instance` wrote (``allow_pickle=False``)."""
    import numpy as np

    from alpa_ir.solvers.ilp import Edge, ILPProblem

    try:
        data = np.load(path, allow_pickle=False)
        meta = json.loads(str(data["meta"]))
        problem = ILPProblem(
            node_costs=tuple(data[f"cost{k}"] for k in range(meta["nodes"])),
            edges=tuple(Edge(u, v, data[f"edge{k}"]) for k, (u, v) in enumerate(meta["edges"])),
            node_memory=tuple(data[f"memory{k}"] for k in range(meta["nodes"]))
            if meta["memory"]
            else None,
            liveness=tuple(tuple(s) for s in meta["liveness"]),
            memory_budget=meta["memory_budget"],
            node_names=tuple(meta["names"]) or None,
        )
    except (OSError, KeyError, ValueError, TypeError) as err:
        raise SystemExit(f"bench_stage_ilp: {path} is not a dumped stage ILP: {err}") from None
    return Instance(
        meta["model"],
        tuple(meta["mesh"]),
        meta["layers"],
        meta["first"],
        meta["last"],
        meta["num_ops"],
        problem,
    )


def dump(args: argparse.Namespace) -> None:
    import alpa_ir.autosharding.planner as auto_sharding
    from alpa_ir.costs.function_plan import plan_function
    from alpa_ir.costs.stage_cost import StageCostOptions

    function = _layer_function(args.model, args.layers, args.first, args.last)
    num_ops = sum(1 for _ in function.walk())
    real = auto_sharding.build_problem

    def capture(*a: Any, **k: Any) -> Any:
        raise _Captured(real(*a, **k))

    os.makedirs(args.out, exist_ok=True)
    auto_sharding.build_problem = capture  # type: ignore[assignment]
    try:
        for text in args.meshes:
            shape = _parse_mesh(text)
            try:
                plan_function(function, _mesh(shape), StageCostOptions())
            except _Captured as got:
                problem = got.problem
            else:
                raise SystemExit("the ILP was not built")
            inst = Instance(args.model, shape, args.layers, args.first, args.last, num_ops, problem)
            path = os.path.join(args.out, f"{args.model}_L{args.layers}_{args.first}_{text}.npz")
            save_instance(path, inst)
            print(path, problem.num_nodes, "nodes", len(problem.edges), "edges", flush=True)
    finally:
        auto_sharding.build_problem = real  # type: ignore[assignment]


def solve(args: argparse.Namespace) -> None:
    from alpa_ir.solvers import MipSolver
    from alpa_ir.solvers.ilp import evaluate
    from alpa_ir.solvers.repeated import tie_repeated

    rows = []
    for path in args.files:
        inst = load_instance(path)
        problem = inst.problem
        start = time.perf_counter()
        tied = tie_repeated(problem) if args.tie else None
        solver = MipSolver(
            args.solver, exact_elimination=not args.no_elimination, lp_first=not args.no_lp
        )
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            if tied is None:
                solution = solver.solve(problem, time_limit=args.time_limit)
                objective = solution.objective
            else:
                solution = solver.solve(tied.problem, time_limit=args.time_limit)
                objective = evaluate(problem, tied.expand(solution.choice))
        row = {
            "model": inst.model,
            "mesh": "x".join(map(str, inst.mesh)),
            "nodes": problem.num_nodes,
            "variables": tied.problem.num_nodes if tied is not None else problem.num_nodes,
            "seconds": round(time.perf_counter() - start, 3),
            "objective": objective,
            "optimal": solution.optimal,
            "warnings": [str(w.message) for w in caught],
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


def plan(args: argparse.Namespace) -> None:
    from alpa_ir.costs.function_plan import plan_function
    from alpa_ir.costs.stage_cost import StageCostOptions
    from alpa_ir.passmanager.pass_statistics import PassStatistic, statistic

    function = _layer_function(args.model, args.layers, args.first, args.last)
    for text in args.meshes:
        start = time.perf_counter()
        stats: list[PassStatistic] = []
        planned = plan_function(
            function,
            _mesh(_parse_mesh(text)),
            StageCostOptions(time_limit=args.time_limit),
            statistics=stats,
        )
        attrs = planned.attributes
        print(
            json.dumps(
                {
                    "model": args.model,
                    "mesh": text,
                    "seconds": round(time.perf_counter() - start, 3),
                    "objective": attrs["sharding.objective"].value.data,  # type: ignore[attr-defined]
                    "variables": int(statistic(stats, "auto-sharding", "num-variables")),
                    "nodes": int(statistic(stats, "auto-sharding", "num-nodes")),
                }
            ),
            flush=True,
        )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("dump", "plan"):
        p = sub.add_parser(name)
        p.add_argument("model")
        p.add_argument("--layers", type=int, default=8, help="automatic layers")
        p.add_argument("--first", type=int, default=1, help="first layer of the range")
        p.add_argument("--last", type=int, default=1, help="last layer of the range")
        p.add_argument("--meshes", nargs="+", default=["1x8", "2x4", "4x2", "8x1"])
        if name == "dump":
            p.add_argument("--out", required=True, help="directory for the .npz files")
        else:
            p.add_argument("--time-limit", type=float, default=60.0)
    s = sub.add_parser("solve")
    s.add_argument("files", nargs="+")
    s.add_argument("--solver", default="cbc")
    s.add_argument("--time-limit", type=float, default=60.0)
    s.add_argument("--tie", action="store_true", help="tie repeated layers first")
    s.add_argument("--no-elimination", action="store_true")
    s.add_argument(
        "--no-lp", action="store_true", help="no LP relaxation first (the solver before it)"
    )
    s.add_argument("--json", default="")
    args = parser.parse_args(argv)
    {"dump": dump, "solve": solve, "plan": plan}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
