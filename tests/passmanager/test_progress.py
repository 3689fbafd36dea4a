"""Progress display: drawn with rich on a terminal, nothing in logs and pipes."""

from __future__ import annotations

import io
import time

from alpa_ir.passmanager.progress import ProgressBar, Spinner


def test_bar_draws_on_a_terminal_only() -> None:
    shown = io.StringIO()
    with ProgressBar("costing stage-mesh pairs", 4, stream=shown, force_terminal=True) as bar:
        for k in range(1, 5):
            bar.update(k)
    assert bar.shown and "costing stage-mesh pairs" in shown.getvalue()
    assert "4/4" in shown.getvalue()
    for kwargs in ({}, {"force_terminal": True, "enabled": False}):
        silent = io.StringIO()
        with ProgressBar("costing", 4, stream=silent, **kwargs) as bar:  # type: ignore[arg-type]
            bar.update(4)
        assert not bar.shown and silent.getvalue() == ""


def test_spinner_only_for_work_that_takes_a_while() -> None:
    slow, fast = io.StringIO(), io.StringIO()
    with Spinner("solving the ILP", delay=0.05, stream=slow, force_terminal=True):
        time.sleep(0.5)
    with Spinner("solving the ILP", delay=5.0, stream=fast, force_terminal=True):
        pass
    assert "solving the ILP" in slow.getvalue()
    assert "solving the ILP" not in fast.getvalue()
