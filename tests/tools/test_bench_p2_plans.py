"""The core of ``tools/bench_p2_plans.py`` on a tiny model and 2 nodes of 4 devices."""

from __future__ import annotations

import pytest

from alpa_ir.tools.bench_p2_plans import VARIANTS, compare_plans, import_model, main


def test_compare_plans_on_mlp_tiny() -> None:
    """Every variant is measured on its own placement; the plan placed by the p2 model is
    the cheapest, and placing the flat plan does not make it dearer (its collectives are
    all-reduces, exactly what synthesize-placement prices)."""
    rows = compare_plans(import_model("mlp-tiny", 4), "custom-2x4", (2, 4), time_limit=30)
    assert list(rows) == list(VARIANTS)
    for row in rows.values():
        assert row.seconds == pytest.approx(sum(row.by_kind.values())) and row.seconds > 0
        assert set(row.by_kind) == {"all_gather", "all_reduce", "all_to_all", "reduce_scatter"}
    assert rows["flat"].matrix == rows["p2"].matrix == "[[2 1] [1 4]]"  # row-major
    assert rows["p2+place"].matrix != rows["flat"].matrix
    assert rows["flat+place"].seconds <= rows["flat"].seconds
    assert rows["p2+place"].seconds <= rows["p2"].seconds < rows["flat"].seconds
    assert rows["p2+place"].seconds < rows["flat+place"].seconds


def test_command_prints_a_row_per_model_and_mesh(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        [
            "--models",
            "mlp-tiny",
            "--layers",
            "4",
            "--meshes",
            "2x4",
            "--system",
            "custom-2x4",
            "--time-limit",
            "30",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0
    assert any(line.startswith("mlp-tiny   2x4") for line in out.splitlines())
