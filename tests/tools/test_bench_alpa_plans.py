"""Alpa's published plans: the data matches the suites and the artifact's
settings, a manual plan is simulated from the cost table, bad plans are
one-line errors."""

from __future__ import annotations

import math

import pytest

from alpa_ir.api.pipeshard import ManualStageOption
from alpa_ir.errors import AlpaError
from alpa_ir.models.measurements import ARTIFACT_MICRO_BATCHES, measurement
from alpa_ir.models.registry import get_config
from alpa_ir.tools.bench_alpa_plans import (
    PUBLISHED,
    AlpaPlan,
    bench_published,
    format_row,
    main,
    summary,
)


def test_published_plans_match_the_suites() -> None:
    assert len(PUBLISHED) == 16  # GPT 6, MoE 5, Wide-ResNet 5
    for name, plan in PUBLISHED.items():
        assert plan.gpus == get_config(name).num_gpus, name
        assert plan.micro_batches == ARTIFACT_MICRO_BATCHES[name], name
        assert get_config(name).batch_size % plan.micro_batches == 0
        row = measurement(name, plan.gpus, "alpa")
        assert row is not None and row.latency is not None and row.latency > 0
    gpt = PUBLISHED["gpt3-2.6b"]
    assert gpt.stage.forward_stage_layer_ids == [[0, 1], [2, 3], [4, 5, 6, 7]]
    assert gpt.physical == ((1, 2), (1, 2), (1, 4))
    assert gpt.stage.submesh_logical_shapes == [(2, 1), (2, 1), (4, 1)]
    assert gpt.force_batch_dim == (0, None, None)


def test_a_bad_plan_is_a_one_line_error() -> None:
    with pytest.raises(AlpaError, match=r"layers \[0, 2\] are not 0..1 in order"):
        AlpaPlan(2, 4, ManualStageOption([[0], [2]], [(1, 1)] * 2), ((1, 1),) * 2, (None,) * 2, "")
    with pytest.raises(AlpaError, match=r"logical mesh \(2, 2\) does not have the devices"):
        AlpaPlan(1, 4, ManualStageOption([[0]], [(2, 2)]), ((1, 2),), (None,), "")
    with pytest.raises(AlpaError, match="differ in number"):
        AlpaPlan(1, 4, ManualStageOption([[0]], [(1, 1)]), ((1, 1),), (None, 0), "")


def test_a_manual_plan_is_simulated_from_the_table() -> None:
    plan = AlpaPlan(
        2, 2, ManualStageOption([[0], [1]], [(1, 1), (1, 1)]), ((1, 1),) * 2, (None,) * 2, "test"
    )
    row = bench_published("mlp-tiny", "local-cpu", plan=plan, coarse=True)
    sim = row["simulated"]
    assert sim["error"] == "" and math.isfinite(sim["iteration_time"])
    assert [s["layers"] for s in sim["stages"]] == [[0, 0], [1, 1]]
    assert [s["devices"] for s in sim["stages"]] == [[0, 0], [1, 1]]
    assert row["measured_latency"] is None and row["ratio"] is None  # no artifact row
    assert "published: L0-0 1x1->1x1 | L1-1 1x1->1x1" in format_row(row)
    # a plan across two devices of one stage, its batch forced onto mesh axis 0
    odd = AlpaPlan(2, 2, ManualStageOption([[0, 1]], [(2, 1)]), ((1, 2),), (0,), "test")
    shown = format_row(bench_published("mlp-tiny", "local-cpu", plan=odd, coarse=True))
    assert "1x2->2x1 fb0" in shown


def test_stages_are_scaled_onto_finer_layers() -> None:
    gpt = PUBLISHED["gpt3-1.3b"]  # 6 artifact layers, two stages of 3
    assert gpt.stage_ranges(6) == [(0, 2), (3, 5)]
    assert gpt.stage_ranges(25) == [(0, 11), (12, 24)]  # round(3 * 25 / 6) = 12
    wide = PUBLISHED["wresnet-4b"]  # 16 layers: 0-4, 5-8, 9-15
    assert wide.stage_ranges(17) == [(0, 4), (5, 9), (10, 16)]
    with pytest.raises(AlpaError, match="8 stages do not fit 4 traced layers"):
        PUBLISHED["gpt3-39b"].stage_ranges(4)


def test_summary_counts_plans_within_tolerance() -> None:
    rows = [{"ratio": 1.1}, {"ratio": 0.8}, {"ratio": None}, {"ratio": 1.0}]
    total = summary(rows)
    assert total["compared"] == 3 and total["within_tolerance"] == 2
    assert total["median_abs_error"] == pytest.approx(0.1)
    assert total["max_abs_error"] == pytest.approx(0.2)


def test_unknown_model_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--models", "gpt3-1.3b,gpt3-76b"])
    assert "no published plan of 'gpt3-76b'" in capsys.readouterr().err


def test_json_shows_each_row_on_stderr_as_it_is_done(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    import alpa_ir.tools.bench_alpa_plans as tool

    done: list[str] = []

    def fake_bench(name: str, *args: object, **kwargs: object) -> dict[str, object]:
        done.append(name)
        return {"name": name, "ratio": 1.0}

    monkeypatch.setattr(tool, "bench_published", fake_bench)
    monkeypatch.setattr(tool, "format_row", lambda row: f"row {row['name']}")
    assert main(["--models", "gpt3-350m,gpt3-1.3b", "--json"]) == 0
    out, err = capsys.readouterr()
    assert err.splitlines() == ["row gpt3-350m", "row gpt3-1.3b"]
    assert [r["name"] for r in json.loads(out)["rows"]] == done == ["gpt3-350m", "gpt3-1.3b"]
