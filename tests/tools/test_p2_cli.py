"""The alpa-p2 command line: JSON shape, readable table, and one-line errors."""

import json
import subprocess
import sys

import pytest

from alpa_ir.tools.alpa_p2 import main


def run_json(capsys: pytest.CaptureFixture, *args: str) -> dict:
    assert main([*args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_json_shape(capsys: pytest.CaptureFixture) -> None:
    out = run_json(capsys, "--system", "gcp-a100-16x4", "--axes", "4,16", "--reduce", "1")
    assert out["total_programs"] == 97
    assert len(out["matrices"]) == 3
    assert sum(len(m["programs"]) for m in out["matrices"]) == 97
    first = out["matrices"][0]
    assert first["matrix"] == [[4, 1], [1, 16]]  # reduction inside a node: fastest
    for m in out["matrices"]:
        assert isinstance(m["allreduce_time"], float) and m["allreduce_time"] > 0
        times = [p["time"] for p in m["programs"]]
        assert times == sorted(times)
        for p in m["programs"]:
            assert p["instructions"] and all(isinstance(i, str) for i in p["instructions"])
    best = [m["programs"][0]["time"] for m in out["matrices"]]
    assert best == sorted(best)


def test_options_change_the_result(capsys: pytest.CaptureFixture) -> None:
    base = ["--system", "gcp-v100-8x2", "--axes", "4,4", "--reduce", "1"]
    ring = run_json(capsys, *base)
    tree = run_json(capsys, *base, "--algorithm", "tree")
    small = run_json(capsys, *base, "--max-size", "2", "--bytes", "1e6", "--verify")
    assert ring["matrices"][0]["allreduce_time"] != tree["matrices"][0]["allreduce_time"]
    assert small["total_programs"] < ring["total_programs"]
    assert small["matrices"][0]["allreduce_time"] < ring["matrices"][0]["allreduce_time"]
    assert small["bytes_per_device"] == 1e6


def test_readable_table(capsys: pytest.CaptureFixture) -> None:
    assert main(["--system", "gcp-a100-16x2", "--axes", "2,16", "--reduce", "1", "--top", "2"]) == 0
    text = capsys.readouterr().out
    assert "matrix [[2 1] [1 16]]" in text and "AllReduce" in text and "... 45 more" in text


@pytest.mark.parametrize(
    "args",
    [
        ["--system", "gcp-a100-16x4", "--axes", "4,8", "--reduce", "1"],
        ["--system", "gcp-a100-16x4", "--axes", "4,16", "--reduce", "2"],
        ["--system", "gcp-a100-16x4", "--axes", "4,16", "--reduce", "1", "--max-size", "0"],
        ["--system", "gcp-a100-16x4", "--axes", "4,16", "--reduce", "1", "--max-size", "50"],
        ["--system", "gcp-h100", "--axes", "4,16", "--reduce", "1"],
        ["--system", "gcp-a100-16x4", "--axes", "four", "--reduce", "1"],
        ["--system", "gcp-a100-16x4", "--axes", "4,16"],
        ["--system", "gcp-a100-16x4", "--axes", "4,16", "--reduce", "1", "--bytes", "0"],
    ],
)
def test_bad_input_is_one_line_and_exit_2(capsys: pytest.CaptureFixture, args: list[str]) -> None:
    assert main(args) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("alpa-p2: error:")


def test_console_entry_point_has_no_traceback() -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "alpa_ir.tools.alpa_p2",
            "--system",
            "nope",
            "--axes",
            "2",
            "--reduce",
            "0",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr and "gcp-a100-16x2" in proc.stderr
