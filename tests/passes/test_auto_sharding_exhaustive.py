"""The ILP of small real modules against enumeration: every assignment of
the strategy graph ``auto-sharding`` builds for a tiny step is priced, and
the solver's plan must reach the least price, with and without a memory
budget (random strategy graphs are in ``tests/solvers/test_ilp_solvers.py``)."""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import alpa_ir
import alpa_ir.autosharding.planner as auto_sharding
from alpa_ir.passmanager.pass_manager import PassManager
from alpa_ir.plugins.registry import default_registry
from alpa_ir.solvers import MipSolver
from alpa_ir.solvers.ilp import BRUTE_FORCE_LIMIT, ILPProblem, brute_force, evaluate, peak_memory


def _linear(params: dict[str, jax.Array], batch: dict[str, jax.Array]) -> Any:
    def loss(p: dict[str, jax.Array]) -> jax.Array:
        return jnp.mean((batch["x"] @ p["w"] - batch["y"]) ** 2)

    return jax.tree.map(lambda p, g: p - 0.1 * g, params, jax.grad(loss)(params))


def _two_layer(params: dict[str, jax.Array], batch: dict[str, jax.Array]) -> Any:
    def loss(p: dict[str, jax.Array]) -> jax.Array:
        return jnp.sum(jnp.tanh(batch["x"] @ p["w1"]) @ p["w2"])

    return jax.tree.map(lambda p, g: p - 0.1 * g, params, jax.grad(loss)(params))


def _problem(
    step: Any, shapes: dict[str, tuple[int, ...]], mesh: str, monkeypatch: Any, options: str = ""
) -> Any:
    """The ILP ``auto-sharding`` builds for ``step`` on ``mesh`` (merged ops)."""
    rng = np.random.default_rng(0)
    arrays = {k: jnp.asarray(rng.normal(size=s), jnp.float32) for k, s in shapes.items()}
    params = {k: v for k, v in arrays.items() if k.startswith("w")}
    batch = {k: v for k, v in arrays.items() if not k.startswith("w")}
    module = alpa_ir.import_jax(step, params, batch, batch_argnums=(1,))
    captured: list[ILPProblem] = []
    build = auto_sharding.build_problem

    def keep(*args: Any, **kwargs: Any) -> ILPProblem:
        captured.append(build(*args, **kwargs))
        return captured[-1]

    monkeypatch.setattr(auto_sharding, "build_problem", keep)
    pipeline = f"builtin.module(merge-trivial-ops,auto-sharding{{mesh-shape={mesh}{options}}})"
    PassManager(default_registry(), pipeline).execute(module)
    (problem,) = captured
    return module, problem


CASES = {
    "linear-1d": (_linear, {"w": (8, 4), "x": (16, 8), "y": (16, 4)}, "2"),
    "linear-2d": (_linear, {"w": (8, 4), "x": (16, 8), "y": (16, 4)}, "2,2"),
    "two-layer-1d": (_two_layer, {"w1": (8, 16), "w2": (16, 4), "x": (16, 8)}, "2"),
}


@pytest.mark.parametrize("name", list(CASES))
def test_real_module_plan_is_the_enumerated_optimum(name: str, monkeypatch: Any) -> None:
    step, shapes, mesh = CASES[name]
    module, problem = _problem(step, shapes, mesh, monkeypatch)
    combos = math.prod(len(c) for c in problem.node_costs)
    assert 1 < combos <= BRUTE_FORCE_LIMIT, combos
    reference = brute_force(problem)
    solution = MipSolver("cbc").solve(problem)
    assert solution.objective == pytest.approx(reference.objective, rel=1e-9, abs=1e-9)
    # what the pass wrote is that optimum (less the arguments' tie-breaks)
    from alpa_ir.ir.module_utils import main_function

    written = main_function(module).attributes["sharding.objective"].value.data
    assert written == pytest.approx(reference.objective, rel=1e-6, abs=1e-5)


@pytest.mark.parametrize("name", list(CASES))
def test_real_module_under_a_memory_budget_is_the_enumerated_optimum(
    name: str, monkeypatch: Any
) -> None:
    """With a budget between the least and the optimum's peak, the solver's
    plan is the cheapest plan that fits."""
    step, shapes, mesh = CASES[name]
    # a budget no plan reaches: the pass builds the memory terms and live sets
    _, problem = _problem(step, shapes, mesh, monkeypatch, " memory-budget=1e15")

    free = brute_force(problem)
    assert problem.node_memory is not None and problem.liveness
    peak = peak_memory(problem, free.choice)
    least = min(
        peak_memory(problem, choice)
        for choice in _sample_choices(problem, 2000)
        if math.isfinite(evaluate(problem, choice))
    )
    if least >= peak:
        pytest.skip("the unconstrained optimum already has the least peak")
    budget = (least + peak) / 2
    bounded = ILPProblem(
        problem.node_costs, problem.edges, problem.node_memory, problem.liveness, budget,
        problem.node_names,
    )  # fmt: skip
    reference = brute_force(bounded)
    solution = MipSolver("cbc").solve(bounded)
    assert peak_memory(bounded, solution.choice) <= budget + 1e-6
    assert solution.objective == pytest.approx(reference.objective, rel=1e-9, abs=1e-9)
    assert reference.objective >= free.objective


def _sample_choices(problem: ILPProblem, count: int) -> list[tuple[int, ...]]:
    rng = np.random.default_rng(1)
    sizes = [len(c) for c in problem.node_costs]
    return [tuple(int(rng.integers(s)) for s in sizes) for _ in range(count)]
