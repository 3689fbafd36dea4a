"""``tools/alpa_classic_cases.py``: on Alpa's classic shapes where its plan is
the optimum of its formulas (data parallel, Megatron MLP), the ILP's
objective equals Alpa's expected objective; where the plan may use an
all-to-all (priced by Alpa at half the bytes it sends), it is no higher."""

from __future__ import annotations

import math
from collections import Counter

import jax
import numpy as np
import pytest

from alpa_ir.tools.alpa_classic_cases import alpa_price, cases, main, plan_case, run_case

CASES = {case.name: case for case in cases()}


@pytest.mark.parametrize(
    "name", ["mlp data parallel (4, 1)", "mlp model parallel (1, 4)", "bert data parallel (1, 4)"]
)
def test_objective_equals_alpas_closed_form(name: str) -> None:
    row = run_case(CASES[name])
    # Alpa's closed form has one more 0.01 per reduced loss scalar at most
    assert row["ours"] == pytest.approx(row["alpa"], rel=1e-3)


def test_two_d_mlp_is_no_worse_than_alpas_plan() -> None:
    row = run_case(CASES["mlp 2d mesh (2, 2)"])
    assert row["ours"] <= row["alpa"] * 1.001


def test_command_line_prints_a_row(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--only", "mlp model parallel (4, 1)"]) == 0
    out = capsys.readouterr().out
    assert "mlp model parallel (4, 1)" in out and "245,765.1" in out


def test_two_d_moe_layer_costs_less_than_alpas_plan_under_its_formulas() -> None:
    """Alpa's test_moe_layer_2d plan (experts over one axis, their gradients
    all-reduced over the other: 1,680,399 under Alpa's formulas) against ours
    (experts over both axes: 4 all-to-alls over 4 devices, no expert gradient
    all-reduce: 893,972), and ours equals one device."""
    case = CASES["moe layer 2d mesh (2, 2)"]
    executable, fn, args, mesh = plan_case(case)
    collectives = executable.predicted_collectives()
    kinds = Counter(c.kind for c in collectives)
    assert kinds["all-to-all"] == 4 and kinds["all-gather"] == 0
    assert all(c.group_size == 4 for c in collectives)
    # our plan in Alpa's closed form: the tokens' all-to-alls priced whole on the
    # flattened mesh, every non-expert weight all-reduced over all 4 devices
    flat = mesh.flattened()
    config = case.config
    tokens = config.batch_size * config.seq_len * config.hidden_size * 2 * 4
    params = args[0]["params"]["params"]
    dense = [leaf for name, sub in params.items() for leaf in jax.tree.leaves(sub)]
    dense = [leaf for leaf in dense if leaf.ndim < 3]  # wi and wo are (E, ., .)
    ours = 4 * flat.all_to_all_cost(tokens, 1) + sum(
        flat.all_reduce_cost(math.prod(leaf.shape) * 4, 1) for leaf in dense
    )
    assert alpa_price(executable.function, mesh) == pytest.approx(ours, rel=1e-5)
    assert ours < 0.6 * case.expected(mesh, args[0]["params"])
    reference = jax.jit(fn)(*args)
    out = executable(*args)
    wi = out["params"]["params"]["moe"]["wi"]
    assert {s.data.shape[0] for s in wi.addressable_shards} == {config.num_experts // 4}
    for a, b in zip(jax.tree.leaves(reference), jax.tree.leaves(out), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5)


def test_dot_all_to_all_plan_costs_less_than_any_all_to_all_plan_under_alpas_formulas() -> None:
    """Alpa's test_dot_all_to_all asserts an all-to-all on a (2, 2) mesh with
    β (1, 0.1). Ours has none: 10 all-reduces, 13,526.9 under Alpa's formulas
    (equal to our objective), against 15,984.5 for the cheapest all-to-all
    plan written by hand (experts over the fast axis). Our objective prices an
    all-to-all at most as Alpa does, so no plan with one is cheaper under
    Alpa's formulas than our optimum. Ours equals one device."""
    case = CASES["dot all-to-all 2d mesh (2, 2)"]
    executable, fn, args, mesh = plan_case(case)
    kinds = Counter(c.kind for c in executable.predicted_collectives())
    assert set(kinds) == {"all-reduce"}
    ours = alpa_price(executable.function, mesh)
    assert ours == pytest.approx(executable.auto_sharding_objective, rel=1e-6)
    assert ours < 0.9 * case.expected(mesh, args[0]["params"])
    reference = jax.jit(fn)(*args)
    out = executable(*args)
    for a, b in zip(jax.tree.leaves(reference), jax.tree.leaves(out), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5)
