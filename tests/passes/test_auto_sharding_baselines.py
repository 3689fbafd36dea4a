"""``auto-sharding{check-baselines=true}``: the data-parallel and heuristic
plans are priced in the ILP's own problem (statistics ``baseline-*``), and a
plan that costs more than either is reported loudly (the plan is kept)."""

from __future__ import annotations

import math
import types
from dataclasses import dataclass, replace
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import alpa_ir
from alpa_ir.passmanager.pass_manager import PassManager
from alpa_ir.plugins.hookspecs import hookimpl
from alpa_ir.plugins.registry import load_registry
from alpa_ir.solvers import MipSolver
from alpa_ir.solvers.ilp import ILPProblem, ILPSolution, evaluate


def _step(params: dict[str, jax.Array], batch: dict[str, jax.Array]) -> Any:
    def loss(p: dict[str, jax.Array]) -> jax.Array:
        h = jnp.tanh(batch["x"] @ p["w1"])
        return jnp.mean((h @ p["w2"] - batch["y"]) ** 2)

    grads = jax.grad(loss)(params)
    return jax.tree.map(lambda p, g: p - 0.1 * g, params, grads)


def _module() -> Any:
    rng = np.random.default_rng(0)
    params = {
        "w1": jnp.asarray(rng.normal(size=(16, 32)), jnp.float32),
        "w2": jnp.asarray(rng.normal(size=(32, 4)), jnp.float32),
    }
    batch = {
        "x": jnp.asarray(rng.normal(size=(64, 16)), jnp.float32),
        "y": jnp.asarray(rng.normal(size=(64, 4)), jnp.float32),
    }
    return alpa_ir.import_jax(_step, params, batch, batch_argnums=(1,))


@dataclass
class FirstAnswerWorst:
    """A solver plugin whose first answer is the most expensive feasible plan
    (every finite cost c turned into top - c), later answers exact."""

    name: str = "first-answer-worst"
    calls: int = 0

    def solve(self, problem: ILPProblem, time_limit: float | None = None) -> ILPSolution:
        self.calls += 1
        exact = MipSolver("cbc")
        if self.calls > 1:
            return exact.solve(problem, time_limit=time_limit)
        finite = [c[np.isfinite(c)] for c in problem.node_costs]
        finite += [e.cost[np.isfinite(e.cost)] for e in problem.edges]
        top = max(float(c.max()) for c in finite if c.size) + 1.0

        def flipped(c: np.ndarray) -> np.ndarray:
            return np.where(np.isfinite(c), top - c, np.inf)

        worst = replace(
            problem,
            node_costs=tuple(flipped(c) for c in problem.node_costs),
            edges=tuple(replace(e, cost=flipped(e.cost)) for e in problem.edges),
        )
        solution = exact.solve(worst, time_limit=time_limit)
        return replace(solution, objective=evaluate(problem, solution.choice))


def _registry(solver: FirstAnswerWorst) -> Any:
    plugin = types.SimpleNamespace(alpa_ir_solvers=hookimpl(lambda: {solver.name: lambda: solver}))
    return load_registry([plugin], entry_points=False)


def _plan(pipeline: str, registry: Any = None) -> tuple[Any, dict[str, float]]:
    module = _module()
    manager = PassManager(registry or load_registry(entry_points=False), pipeline)
    statistics = manager.execute(module).statistics
    stats = {s.name: s.value for s in statistics if s.pass_name == "auto-sharding"}
    return module, stats


def test_baselines_are_priced_in_the_same_problem() -> None:
    _, stats = _plan("builtin.module(auto-sharding{mesh-shape=2,4 check-baselines=true})")
    assert math.isfinite(stats["baseline-data-parallel"])
    assert math.isfinite(stats["baseline-heuristic"])
    # without the check, no extra solves and no prices
    _, stats = _plan("builtin.module(auto-sharding{mesh-shape=2,4})")
    assert not any(name.startswith("baseline-") for name in stats)


def test_data_parallel_is_not_in_a_space_without_mixed_specs() -> None:
    _, stats = _plan(
        "builtin.module(auto-sharding{mesh-shape=2,4 allow-mixed-mesh-shape=false "
        "check-baselines=true})"
    )
    assert math.isinf(stats["baseline-data-parallel"])


def test_a_plan_worse_than_a_baseline_is_reported() -> None:
    solver = FirstAnswerWorst()
    pipeline = (
        f"builtin.module(auto-sharding{{mesh-shape=2,4 solver={solver.name} check-baselines=true}})"
    )
    with pytest.warns(UserWarning, match=r"the ILP's plan costs .* but the data-parallel plan"):
        _, stats = _plan(pipeline, _registry(solver))
    assert solver.calls == 3  # the plan, then one solve per baseline
    assert stats["baseline-data-parallel"] < math.inf
