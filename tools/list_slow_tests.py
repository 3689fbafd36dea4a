"""list-slow-tests: choose the tests the fast tier (``pytest -m "not slow"``) leaves out.

Reads the report of a full run made with ``pytest -n 2 --dist loadgroup --durations=0``
(setup, call and teardown seconds per test), adds the three phases per test, and lists the
slowest tests, one node id per line, until what is left takes at most ``--budget`` seconds
of worker time (two workers: twice the wall time). ``tests/conftest.py`` marks the listed
tests ``slow``::

    pytest -n 2 --dist loadgroup --durations=0 > durations.txt
    python -m alpa_ir.tools.list_slow_tests durations.txt > tests/slow_tests.txt

A shared compilation (a module-scoped fixture) is paid by the first test that needs it, so
the measured split is approximate; the tier's own wall time is what to check.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

_LINE = re.compile(r"^\s*(\d+(?:\.\d+)?)s\s+(setup|call|teardown)\s+(\S.*?)\s*$")


def durations(text: str) -> dict[str, float]:
    """Seconds per test node id (setup + call + teardown) in a ``--durations`` report."""
    total: dict[str, float] = defaultdict(float)
    for line in text.splitlines():
        match = _LINE.match(line)
        if match:
            total[match.group(3)] += float(match.group(1))
    return dict(total)


def slow_tests(seconds: dict[str, float], budget: float) -> list[str]:
    """The slowest tests, until the others take at most ``budget`` seconds in all."""
    order = sorted(seconds, key=lambda k: -seconds[k])
    left = sum(seconds.values())
    chosen = []
    for name in order:
        if left <= budget:
            break
        chosen.append(name)
        left -= seconds[name]
    return sorted(chosen)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="list-slow-tests", description=__doc__.splitlines()[0])
    parser.add_argument("report", type=Path, help="output of pytest --durations=0")
    parser.add_argument(
        "--budget",
        type=float,
        default=420.0,
        help="seconds of worker time the fast tier may take (default: 420, about 3.5 "
        "minutes on two workers)",
    )
    args = parser.parse_args(argv)
    try:
        text = args.report.read_text()
    except OSError as exc:
        print(f"list-slow-tests: cannot read {args.report}: {exc.strerror}", file=sys.stderr)
        return 2
    seconds = durations(text)
    if not seconds:
        print(f"list-slow-tests: {args.report} has no --durations lines", file=sys.stderr)
        return 2
    chosen = slow_tests(seconds, args.budget)
    kept = sum(seconds.values()) - sum(seconds[k] for k in chosen)
    print(
        f"# {len(chosen)} slow tests ({sum(seconds[k] for k in chosen):.0f} s of worker time); "
        f"the rest: {len(seconds) - len(chosen)} measured tests, {kept:.0f} s. "
        "Written by tools/list_slow_tests.py."
    )
    for name in chosen:
        print(name)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
