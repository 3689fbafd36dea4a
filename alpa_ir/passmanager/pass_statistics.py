"""Pass statistics (MLIR's ``-mlir-pass-statistics``): counters and times a
pass reports about its run, kept out of the IR so that two runs of a
pipeline print the same module.

A pass calls :func:`record_statistic` with its context; the pass manager
collects what was recorded during its run (``PassRunResult.statistics``),
and ``alpa-opt --pass-statistics`` prints the report on stderr.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class PassStatistic:
    pass_name: str
    name: str
    value: float
    help: str = ""


def record_statistic(ctx: object, pass_name: str, name: str, value: float, help: str = "") -> None:
    """Record ``value`` for ``name`` if ``ctx`` is collecting (a pass manager's run)."""
    collected = getattr(ctx, "statistics", None)
    if isinstance(collected, list):
        collected.append(PassStatistic(pass_name, name, float(value), help))


def statistic(stats: Sequence[PassStatistic], pass_name: str, name: str) -> float:
    """The sum of ``name``'s values recorded by ``pass_name`` (0 if none)."""
    return sum(s.value for s in stats if s.pass_name == pass_name and s.name == name)


def format_statistics_report(stats: Sequence[PassStatistic]) -> str:
    """The report: per pass, each statistic summed over its records."""
    bar = "===" + "-" * 73 + "==="
    lines = [bar, "Pass statistics report".center(len(bar)).rstrip(), bar]
    order: dict[str, dict[str, tuple[float, str]]] = {}
    for s in stats:
        entries = order.setdefault(s.pass_name, {})
        total, _ = entries.get(s.name, (0.0, s.help))
        entries[s.name] = (total + s.value, s.help)
    for pass_name, entries in order.items():
        lines.append(pass_name)
        for name, (total, text) in entries.items():
            shown = f"{int(total)}" if float(total).is_integer() else f"{total:.4g}"
            lines.append(f"  (S) {shown:>10} {name}" + (f" - {text}" if text else ""))
    return "\n".join(lines) + "\n"
