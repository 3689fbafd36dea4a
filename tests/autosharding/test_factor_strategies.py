"""The generic strategy enumeration of factor rules: heavy ops split their
work over every mesh axis that can split one of their factors."""

from __future__ import annotations

from alpa_ir.autosharding.factors import FactorKind, FactorRule, enumerate_strategies

P, R = FactorKind.PASS_THROUGH, FactorKind.REDUCTION


def _matmul(m: int, k: int, n: int) -> FactorRule:
    """C[m, n] = A[m, k] @ B[k, n] with factors (m, n, k)."""
    return FactorRule(
        (m, n, k), (P, P, R), (((0,), (2,)), ((2,), (1,))), (((0,), (1,)),), heavy=True
    )


def _used_axes(rule: FactorRule, mesh: tuple[int, ...]) -> list[set[int]]:
    out = []
    for s in enumerate_strategies(rule, mesh):
        specs = [*s.operand_specs, *s.result_specs]
        out.append({a for spec in specs for d in spec.dims for a in d} | set(s.partial_axes))
    return out


def test_a_heavy_op_uses_every_axis() -> None:
    used = _used_axes(_matmul(8, 16, 32), (2, 4))
    assert used and all(u == {0, 1} for u in used)


def test_an_axis_that_divides_no_factor_is_not_required() -> None:
    # no factor of this matmul divides by 3: axis 0 stays unused, axis 1 must
    # still split the work (no replicated matmul)
    used = _used_axes(_matmul(8, 16, 32), (3, 2))
    assert used and all(u == {1} for u in used)
    assert _used_axes(_matmul(8, 16, 32), (3, 2)) == _used_axes(_matmul(8, 16, 32), (1, 2))


def test_replicated_only_when_no_usable_axes_fit_together() -> None:
    # one factor of 2 and two axes of 2: each axis alone divides it, both
    # together do not; the rule falls back to every assignment
    rule = FactorRule((2,), (P,), (((0,),),), (((0,),),), heavy=True)
    used = _used_axes(rule, (2, 2))
    assert set() in used and {0} in used and {1} in used
