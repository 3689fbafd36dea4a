"""Alpa's artifact measurements: the data loads, matches the suites, and is
converted to one FLOP convention consistently."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from alpa_ir.errors import AlpaError
from alpa_ir.models.measurements import (
    SUITE_METHODS,
    gpt_artifact_flops,
    load_measurements,
    measurement,
    moe_artifact_flops,
)
from alpa_ir.models.registry import get_config
from alpa_ir.models.train_step import train_step_flops
from alpa_ir.tools.bench_suite import SUITES


def test_every_suite_size_has_every_method_of_its_suite() -> None:
    rows = load_measurements()
    assert len(rows) == 84  # 3 suites x 7 GPU counts x 4 methods
    for suite, names in SUITES.items():
        for name in names:
            gpus = get_config(name).num_gpus
            methods = {m.method for m in rows if m.model == name}
            assert methods == set(SUITE_METHODS[suite]), name
            for m in rows:
                if m.model == name:
                    assert (m.suite, m.gpus) == (suite, gpus), m
    # the artifact's 2-GPU sizes are in no suite here
    assert {m.size for m in rows if not m.model} == {"760M", "690M", "500M"}
    assert all(m.gpus == 2 for m in rows if not m.model)


def test_param_counts_match_the_configs() -> None:
    from alpa_ir.models.train_step import param_count

    for name in ("gpt3-1.3b", "moe-2.4b"):
        m = measurement(name, get_config(name).num_gpus, "intra-op")
        assert m is not None and m.params_b is not None
        assert param_count(name) / 1e9 == pytest.approx(m.params_b, rel=0.05)


def test_failed_runs_have_no_figure() -> None:
    ds = measurement("moe-70b", 64, "deepspeed")
    assert ds is not None and ds.failed and ds.tflops is None and ds.latency is None
    assert not measurement("moe-70b", 64, "alpa").failed  # type: ignore[union-attr]


def test_measured_latency_gives_the_exact_figure() -> None:
    m = measurement("gpt3-350m", 1, "intra-op")
    assert m is not None and m.latency_measured
    latency = sum(m.latencies) / len(m.latencies)
    assert m.latency == pytest.approx(latency)
    assert m.tflops == pytest.approx(train_step_flops("gpt3-350m") / latency / 1e12)
    # the artifact's own figure is its 96 count over the same latency
    artifact = gpt_artifact_flops(get_config("gpt3-350m")) / latency / 1e12
    assert m.artifact_tflops == pytest.approx(artifact, rel=1e-3)


def test_gpt_conversion_is_72_over_96_of_the_layers() -> None:
    m = measurement("gpt3-2.6b", 8, "alpa")
    assert m is not None and not m.latency_measured
    config = get_config("gpt3-2.6b")
    ratio = train_step_flops("gpt3-2.6b") / gpt_artifact_flops(config)
    assert m.tflops == pytest.approx(m.artifact_tflops * ratio)  # type: ignore[operator]
    assert 0.75 < ratio < 0.76  # 72/96, the head counted once in both
    assert m.latency == pytest.approx(gpt_artifact_flops(config) / (61.61e12 * 8))


def test_every_measured_latency_is_one_global_batch() -> None:
    """TFLOPS × GPUs × latency is the artifact's FLOP count of one step of the
    suite's global batch (1024 sequences), for every GPT and MoE row that gives
    latencies: the rows and the formulas agree."""
    for m in load_measurements():
        if not (m.model and m.latencies and m.artifact_tflops) or m.suite == "wresnet":
            continue
        config = get_config(m.model)
        if m.suite == "gpt3":
            count = gpt_artifact_flops(config)
        else:
            count = moe_artifact_flops(config, m.moe_group_size or 2048)
        mean = sum(m.latencies) / len(m.latencies)
        batches = m.artifact_tflops * 1e12 * m.gpus * mean / count  # type: ignore[operator]
        if m.model == "moe-70b" and m.method == "intra-op":  # the one exception: half a batch
            assert batches == pytest.approx(0.5, abs=0.01) and not m.latency_measured
            assert "0.50 of the global batch" in m.note
            continue
        assert batches == pytest.approx(1.0, abs=0.06) and m.latency_measured, m


def test_wresnet_intra_op_count_is_close_to_ours() -> None:
    """Intra-op only ran Wide-ResNet without remat: XLA's count of its step is
    within 7 % of this repository's (convolutions and the classifier)."""
    for name in SUITES["wresnet"]:
        m = measurement(name, get_config(name).num_gpus, "intra-op")
        assert m is not None and not m.remat and m.latency_measured
        xla = m.artifact_tflops * 1e12 * m.gpus * m.latency  # type: ignore[operator]
        assert xla / train_step_flops(name) == pytest.approx(1.0, abs=0.07), name


def test_every_converted_figure_is_positive_and_below_v100_peak() -> None:
    for m in load_measurements():
        if m.tflops is not None:
            assert 0 < m.tflops < 125 and math.isfinite(m.latency)  # type: ignore[arg-type]


def test_a_malformed_file_is_a_one_line_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text(
        "# comment\nsuite,size,model,gpus,method,artifact_method,tflops,latencies_s,"
        "params_b,peak_mem_gb,remat,moe_group_size\n"
        "gpt3,1.3B,gpt3-1.3b,4,alpa,parax.auto,fast,,1.3,,1,\n"
    )
    with pytest.raises(AlpaError, match=r"bad.csv, data row 1, tflops: not a number: 'fast'"):
        load_measurements(bad)
