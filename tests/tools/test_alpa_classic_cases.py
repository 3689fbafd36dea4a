"""``tools/alpa_classic_cases.py``: on Alpa's classic shapes where its plan is
the optimum of its formulas (data parallel, Megatron MLP), the ILP's
objective equals Alpa's expected objective; where the plan may use an
all-to-all (priced by Alpa at half the bytes it sends), it is no higher."""

from __future__ import annotations

import pytest

from alpa_ir.tools.alpa_classic_cases import cases, main, run_case

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
