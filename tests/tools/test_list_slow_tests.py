"""list-slow-tests picks the slowest tests until the rest fits the fast tier's budget."""

from __future__ import annotations

from pathlib import Path

import pytest

from alpa_ir.tools.list_slow_tests import durations, main, slow_tests

REPORT = """
============================= slowest durations ==============================
30.00s call     tests/a.py::test_big
5.00s setup    tests/a.py::test_big
4.00s call     tests/b.py::test_mid[x-1]
1.50s teardown tests/b.py::test_mid[x-1]
2.00s call     tests/c.py::test_small
(12 durations < 0.5s hidden.  Use -vv to show these durations.)
"""


def test_durations_add_the_phases_of_each_test() -> None:
    assert durations(REPORT) == {
        "tests/a.py::test_big": 35.0,
        "tests/b.py::test_mid[x-1]": 5.5,
        "tests/c.py::test_small": 2.0,
    }


def test_the_slowest_go_until_the_rest_fits() -> None:
    seconds = durations(REPORT)
    assert slow_tests(seconds, 10.0) == ["tests/a.py::test_big"]
    assert slow_tests(seconds, 3.0) == ["tests/a.py::test_big", "tests/b.py::test_mid[x-1]"]
    assert slow_tests(seconds, 100.0) == []


def test_main_writes_the_list(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    report = tmp_path / "durations.txt"
    report.write_text(REPORT)
    assert main([str(report), "--budget", "10"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("# 1 slow tests") and lines[1:] == ["tests/a.py::test_big"]
    assert main([str(tmp_path / "missing.txt")]) == 2
    assert "cannot read" in capsys.readouterr().err
    (tmp_path / "empty.txt").write_text("nothing\n")
    assert main([str(tmp_path / "empty.txt")]) == 2


def test_the_listed_tests_exist() -> None:
    """Every test the fast tier leaves out is still in the suite (a renamed test
    would otherwise slip into the fast tier unnoticed)."""
    listed = Path(__file__).resolve().parents[1] / "slow_tests.txt"
    names = [ln for ln in listed.read_text().splitlines() if ln and not ln.startswith("#")]
    root = listed.parent.parent
    for name in names:
        path, _, test = name.partition("::")
        source = (root / path).read_text()
        assert f"def {test.split('[')[0].split('::')[-1]}(" in source, name
