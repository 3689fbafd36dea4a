"""alpa-bench --measured: the statistics on a hand-made table, the entries of a
result beside the artifact's rows, the artifact's defaults, and the flag on a
tiny run."""

from __future__ import annotations

import json
import math

import pytest

from alpa_ir.models.measurements import ARTIFACT_MICRO_BATCHES, measurement
from alpa_ir.models.registry import get_config
from alpa_ir.tools.alpa_bench import dtype_of, main, micro_batches_of
from alpa_ir.tools.bench_measured import (
    Entry,
    entries,
    format_entries,
    size_order,
    spearman,
    summarize,
)
from alpa_ir.tools.bench_suite import SUITES


def _entry(model: str, method: str, sim: float | None, meas: float | None) -> Entry:
    return Entry(model, 8, method, sim, meas, True)


def test_statistics_of_a_hand_made_table() -> None:
    table = [
        _entry("a", "alpa", 9.0, 10.0),  # -10 %
        _entry("a", "intra-op", 24.0, 20.0),  # +20 %
        _entry("a", "inter-op", 30.0, 40.0),  # -25 %
        _entry("b", "alpa", 31.5, 30.0),  # +5 %
        _entry("b", "alpa+comm", 100.0, 30.0),  # shown beside alpa, not counted
        _entry("b", "megatron", None, 5.0),  # no plan: no ratio
        _entry("b", "inter-op", 1.0, None),  # did not run: no ratio
    ]
    summary = summarize(table)
    assert summary.entries == 4
    assert summary.median_abs_error == pytest.approx(0.15)  # of 5, 10, 20, 25 %
    assert summary.max_abs_error == pytest.approx(0.25)
    assert summary.max_error_entry == "a on 8, inter-op"
    # ranks: simulated 9 < 24 < 30 < 31.5 against measured 10 < 20 < 40 > 30
    assert summary.spearman == pytest.approx(0.8)
    orders = {o.model: o for o in summary.orders}
    assert orders["a"].matches  # inter-op > intra-op > alpa, both measured and simulated
    assert orders["a"].measured_order == ("inter-op", "intra-op", "alpa")
    # b: megatron measured 5 but has no plan (0), inter-op did not run (0) but has one
    assert not orders["b"].matches
    assert orders["b"].swapped == (("megatron", "inter-op"),)
    assert orders["b"].measured_order == ("alpa", "megatron", "inter-op")
    assert summary.orders_matched == 1 and summary.orders_matched_within_tolerance == 1


def test_order_of_methods() -> None:
    good = size_order([_entry("m", "alpa", 3.0, 30.0), _entry("m", "megatron", 2.0, 20.0)])
    assert good.matches and good.measured_order == ("alpa", "megatron")
    bad = size_order([_entry("m", "alpa", 2.0, 30.0), _entry("m", "megatron", 3.0, 20.0)])
    assert not bad.matches and bad.swapped == (("alpa", "megatron"),)
    assert bad.gap("alpa", "megatron") == pytest.approx(0.5)
    assert not bad.matches_within(0.49) and bad.matches_within(0.5)
    # a method that did not run counts as 0: a plan the simulator finds for it is
    # ordered above it only wrongly if it beats a method that did run
    failed = size_order([_entry("m", "alpa", 3.0, 30.0), _entry("m", "pp-dp", 1.0, None)])
    assert failed.matches
    no_plan = size_order([_entry("m", "alpa", None, 30.0), _entry("m", "pp-dp", 1.0, 5.0)])
    assert not no_plan.matches
    # equal measured figures need no order
    tie = size_order([_entry("m", "alpa", 1.0, 8.3), _entry("m", "inter-op", 2.0, 8.3)])
    assert tie.matches


def test_spearman() -> None:
    assert spearman([1, 2, 3], [10, 20, 30]) == pytest.approx(1.0)
    assert spearman([1, 2, 3], [30, 20, 10]) == pytest.approx(-1.0)
    assert math.isnan(spearman([1.0], [2.0]))
    with pytest.raises(ValueError, match="3 values against 2"):
        spearman([1, 2, 3], [1, 2])


def test_entries_of_a_result_beside_the_artifact() -> None:
    result = {
        "model": "gpt3-1.3b",
        "gpus": 4,
        "outcomes": [
            {"method": "alpa", "pflops": 0.16, "error": ""},
            {"method": "alpa+comm", "pflops": 0.16, "error": ""},
            {"method": "intra-op", "pflops": 0.0, "error": "out of memory"},
            {"method": "megatron", "pflops": 0.12, "error": ""},
        ],
    }
    alpa, comm, intra, megatron = entries(result)
    measured = measurement("gpt3-1.3b", 4, "alpa")
    assert measured is not None
    assert alpa.simulated == pytest.approx(40.0)  # 0.16 PFLOPS over 4 GPUs
    assert alpa.measured == measured.tflops and comm.measured == measured.tflops
    assert alpa.ratio == pytest.approx(40.0 / measured.tflops)  # type: ignore[operator]
    assert intra.simulated is None and intra.ratio is None and intra.measured is not None
    assert megatron.simulated == pytest.approx(30.0)
    text = format_entries(result)
    assert "no plan" in text and "order NOT as measured" in text


def test_artifact_defaults_cover_every_suite_size() -> None:
    for suite, names in SUITES.items():
        for name in names:
            micro = micro_batches_of(name, "artifact")
            assert micro == ARTIFACT_MICRO_BATCHES[name]
            assert get_config(name).batch_size % micro == 0  # type: ignore[operator]
            assert dtype_of(name, "artifact") == ("float32" if suite == "wresnet" else "float16")
    assert micro_batches_of("mlp-tiny", "artifact") == 16
    assert dtype_of("mlp-tiny", "artifact") is None
    assert dtype_of("mlp-tiny", "float32") == "float32"
    assert micro_batches_of("gpt3-1.3b", 8) == 8


def test_measured_flag_on_a_tiny_run(capsys: pytest.CaptureFixture[str]) -> None:
    argv = [
        "--models=mlp-tiny",
        "--cluster=local-cpu",
        "--gpus=2",
        "--layers=2",
        "--micro-batches=2",
        "--measured",
        "--quiet",
        "--workers=1",
    ]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "sim TF/GPU  measured  ratio" in out
    assert "0 entries: median |error| nan" in out  # no artifact row for a tiny model
    assert "results_e2e_ref.tsv" in out
    assert main([*argv, "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["measured"]["entries"] == 0
    assert "72·B·s·l·h²" in shown["measured"]["convention"]
    (result,) = shown["results"]
    assert {e["method"] for e in result["measured"]} >= {"alpa", "intra-op", "inter-op"}
    assert all(e["measured"] is None and not e["in_artifact"] for e in result["measured"])
