"""alpa-bench on a tiny model and cluster: the plan, baselines, timings, JSON."""

from __future__ import annotations

import json

import pytest

from alpa_ir.tools.alpa_bench import batch_divisors, bench_cluster, main


def test_bench_cluster_below_one_node() -> None:
    cluster = bench_cluster("alpa-testbed", 4)
    assert cluster.num_devices == 4 and cluster.num_nodes == 1
    assert bench_cluster("alpa-testbed", 16).num_nodes == 2


def test_batch_divisors_are_powers_of_two() -> None:
    assert batch_divisors(24, 64) == [1, 2, 4, 8]


def test_tiny_bench_json(capsys: pytest.CaptureFixture[str]) -> None:
    argv = [
        "--models=mlp-tiny",
        "--cluster=local-cpu",
        "--gpus=2",
        "--layers=2",
        "--micro-batches=auto",
        "--max-micro-batches=2",
        "--json",
    ]
    assert main(argv) == 0
    (result,) = json.loads(capsys.readouterr().out)
    assert [t["num_micro_batches"] for t in result["micro_batch_search"]] == [1, 2]
    methods = {o["method"]: o for o in result["outcomes"]}
    assert set(methods) == {"alpa", "intra-op", "inter-op"}
    alpa = methods["alpa"]
    assert alpa["iteration_time"] > 0 and alpa["pflops"] > 0
    covered = [layer for s in alpa["stages"] for layer in range(s["layers"][0], s["layers"][1] + 1)]
    assert covered == [0, 1]
    assert sum(s["submesh"][0] * s["submesh"][1] for s in alpa["stages"]) == 2
    times = result["compile_time"]
    assert times["total"] == pytest.approx(
        times["clustering"] + times["costing"] + times["dp"] + times["other"]
    )


def test_tiny_bench_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(
            [
                "--models=mlp-tiny",
                "--cluster=local-cpu",
                "--gpus=2",
                "--layers=2",
                "--micro-batches=2",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "mlp-tiny on 2 GPUs" in out and "intra-op" in out and "compile time" in out
