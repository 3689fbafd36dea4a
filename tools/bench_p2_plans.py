"""Benchmark (beyond P²): placement-aware pricing and placement choice for whole plans.

For zoo models imported abstractly (shapes only) and a logical mesh on a P² system, the
predicted communication time of one training iteration for four plans:

(a) ``flat``: auto-sharding with Alpa's flat α-β model (α = 1, β = 1 on mesh axis 0 and 0.1
    on the others), on the default placement (row-major device order);
(b) ``flat+place``: the same plan, placed by ``synthesize-placement`` (the matrix of least
    predicted time for the plan's collectives);
(c) ``p2``: auto-sharding with the ``p2`` cost model on the default placement;
(d) ``p2+place``: ``synthesize-placement{objective=plan}``: a plan per placement with the
    ``p2`` model, the cheapest kept.

Every plan is measured with the same yardstick: the ``p2`` model's predicted seconds for
each explicit collective of the plan on its placement (``alpa_ir.p2.plan_time``), all-reduces
by their best synthesized program (as ``synthesize-reductions`` would run them). Compute is
left out (the same FLOPs in every plan up to recomputation of replicated ops).

Run: ``python -m alpa_ir.tools.bench_p2_plans [--models gpt3-39b moe-70b] [--layers 2]
[--meshes 4x16 8x8 16x4] [--system gcp-a100-16x4] [--time-limit 60] [--batch-size B]``.
Layers are cut to ``--layers`` so that each ILP solves in seconds; the other sizes are the
paper's.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass, replace

from xdsl.dialects.builtin import FlatSymbolRefAttr, ModuleOp

from alpa_ir.dialects.lax_attrs import ints_of
from alpa_ir.dialects.mesh import MESH_ATTR, LogicalMeshOp
from alpa_ir.hardware.device_mesh import LogicalDeviceMesh
from alpa_ir.ir.module_utils import main_function
from alpa_ir.ir.text import parse_module
from alpa_ir.p2.cost_model import P2CostModel
from alpa_ir.p2.placement import ParallelismMatrix, enumerate_matrices
from alpa_ir.p2.plan_time import plan_comm_seconds
from alpa_ir.p2.system import get_system
from alpa_ir.passmanager.pass_manager import PassManager
from alpa_ir.plugins.registry import default_registry

VARIANTS = ("flat", "flat+place", "p2", "p2+place")


@dataclass(frozen=True)
class PlanResult:
    """One variant's plan: predicted communication seconds per iteration (total and by
    collective kind), its placement and the wall seconds it took to plan."""

    seconds: float
    by_kind: dict[str, float]
    matrix: str
    plan_seconds: float


def _on_mesh(text: str, shape: tuple[int, ...]) -> ModuleOp:
    module = parse_module(text)
    function = main_function(module)
    module.body.block.insert_op_before(LogicalDeviceMesh(shape).to_op("mesh"), function)
    function.attributes[MESH_ATTR] = FlatSymbolRefAttr("mesh")
    return module


def _measure(module: ModuleOp, model: P2CostModel, wall: float) -> PlanResult:
    mesh_op = next(o for o in module.ops if isinstance(o, LogicalMeshOp))
    mesh = LogicalDeviceMesh.from_op(mesh_op)
    by_kind = plan_comm_seconds(main_function(module), mesh, model)
    if mesh_op.placement is not None:
        matrix = ParallelismMatrix(tuple(ints_of(r) for r in mesh_op.placement.data))
    else:
        matrix = model.matrix(mesh)  # type: ignore[assignment]
    return PlanResult(sum(by_kind.values()), by_kind, str(matrix), wall)


def compare_plans(
    text: str, system_name: str, shape: tuple[int, ...], time_limit: float = 60.0
) -> dict[str, PlanResult]:
    """The four variants (module doc) for the module ``text`` (not yet planned, no mesh)."""
    registry = default_registry()
    model = P2CostModel(get_system(system_name))
    planner = f"auto-sharding{{time-limit={time_limit}"
    pipelines = {
        "flat": f"merge-trivial-ops,{planner}}}",
        "p2": f"merge-trivial-ops,{planner} cost-model=p2 system={system_name}}}",
        "p2+place": (
            f"merge-trivial-ops,synthesize-placement{{system={system_name} objective=plan "
            f"time-limit={time_limit}}}"
        ),
    }
    results: dict[str, PlanResult] = {}
    for variant, pipeline in pipelines.items():
        module = _on_mesh(text, shape)
        start = time.perf_counter()
        PassManager(registry, f"builtin.module({pipeline})").run(module)
        results[variant] = _measure(module, model, time.perf_counter() - start)
        if variant == "flat":
            start = time.perf_counter()
            PassManager(registry, f"synthesize-placement{{system={system_name}}}").run(module)
            wall = results["flat"].plan_seconds + time.perf_counter() - start
            results["flat+place"] = _measure(module, model, wall)
    return {v: results[v] for v in VARIANTS}


def import_model(name: str, layers: int, batch_size: int = 0) -> str:
    """The zoo model ``name`` cut to ``layers`` layers (and ``batch_size`` if > 0), imported
    abstractly (shapes only)."""
    import alpa_ir
    from alpa_ir.models import get_config, make_train_step

    config = replace(get_config(name), num_layers=layers)
    if batch_size > 0:
        config = replace(config, batch_size=batch_size)
    fn, args = make_train_step(config, abstract=True)
    return str(alpa_ir.import_jax(fn, *args, donate_argnums=(0,), batch_argnums=(1,)))


def _shape(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split("x"))


def main(args: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench_p2_plans", description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", default=["gpt3-39b", "moe-70b"])
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--meshes", nargs="+", type=_shape, default=[(4, 16), (8, 8), (16, 4)])
    parser.add_argument("--system", default="gcp-a100-16x4")
    parser.add_argument("--time-limit", type=float, default=60.0)
    parser.add_argument("--batch-size", type=int, default=0, help="0: the config's")
    argv = parser.parse_args(args)
    system = get_system(argv.system)
    batch = f"batch {argv.batch_size}" if argv.batch_size else "the configs' batch"
    print(
        f"system {argv.system}; {argv.layers} layers per model, {batch}; predicted communication "
        "ms per iteration (p2 simulator; all-reduces by their best synthesized program)"
    )
    header = f"{'model':10} {'mesh':6} " + " ".join(f"{v:>11}" for v in VARIANTS)
    print(f"{header} {'a/d':>6}  {'placement (d)':22} {'plan s (a,d)':>12}")
    for name in argv.models:
        text = import_model(name, argv.layers, argv.batch_size)
        for shape in argv.meshes:
            label = "x".join(map(str, shape))
            count = len(enumerate_matrices(system.hierarchy, shape))
            rows = compare_plans(text, argv.system, shape, argv.time_limit)
            times = " ".join(f"{rows[v].seconds * 1e3:11.3f}" for v in VARIANTS)
            ratio = rows["flat"].seconds / max(rows["p2+place"].seconds, 1e-12)
            print(
                f"{name:10} {label:6} {times} {ratio:6.2f}  {rows['p2+place'].matrix:22} "
                f"{rows['flat'].plan_seconds:5.0f},{rows['p2+place'].plan_seconds:4.0f} "
                f"({count} matrices)",
                flush=True,
            )
            for variant in VARIANTS:
                kinds = ", ".join(
                    f"{k} {v * 1e3:.3f}" for k, v in rows[variant].by_kind.items() if v
                )
                print(f"{'':17} {variant:10} {rows[variant].matrix:22} {kinds}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
