"""``alpa-bench --measured``: every simulated method beside Alpa's measured
figure (:mod:`alpa_ir.models.measurements`), and how well the two agree.

A method's figure is its per-GPU TFLOPS in the convention of
:data:`alpa_ir.models.measurements.CONVENTION` (the simulated PFLOPS × 1000 /
GPUs; the artifact's figures converted to it). The ratio is simulated /
measured; its error, ratio − 1. Over all entries with both figures: the
median and the largest |error| and Spearman's rank correlation. Per size,
the order of the methods: every pair the artifact measured apart (a method
that did not run counts as 0, as does a method with no simulated plan) must
be ordered alike by the simulator (strictly; and again with pairs measured
within :data:`ORDER_TOLERANCE` counted as ties).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from alpa_ir.models.measurements import CONVENTION, SOURCE, TESTBED, measurement

ORDER_TOLERANCE = 0.05
"""Besides the strict order: pairs measured within 5 % of each other counted as
ties (on one GPU every method is the same plan here, while the artifact
measured them up to 7.5 % apart: implementations, micro-batch counts)."""
COMPARED = {"alpa+comm": "alpa"}
"""Methods shown beside another method's measurement (not counted in the statistics)."""


@dataclass(frozen=True)
class Entry:
    """One (model, GPUs, method): the simulated and the measured per-GPU TFLOPS."""

    model: str
    gpus: int
    method: str
    simulated: float | None
    """None: no simulated plan (none fits)."""
    measured: float | None
    """None: the artifact has no figure (not measured, or it did not run)."""
    in_artifact: bool
    """The artifact has a row for it (measured, or recorded as not running)."""

    @property
    def ratio(self) -> float | None:
        if self.simulated is None or self.measured is None:
            return None
        return self.simulated / self.measured


@dataclass(frozen=True)
class SizeOrder:
    model: str
    gpus: int
    matches: bool
    measured_order: tuple[str, ...]
    simulated_order: tuple[str, ...]
    swapped: tuple[tuple[str, str], ...]
    """Pairs (a, b) measured a > b but simulated a <= b."""
    measured: tuple[tuple[str, float], ...] = ()
    """Each method's measured figure (0: it did not run)."""

    def matches_within(self, tolerance: float) -> bool:
        """As measured, counting pairs measured within ``tolerance`` of each other as ties."""
        return all(self.gap(a, b) <= tolerance for a, b in self.swapped)

    def gap(self, a: str, b: str) -> float:
        """How much more ``a`` measured than ``b`` (a fraction of ``b``; inf over 0)."""
        values = dict(self.measured)
        return values[a] / values[b] - 1 if values[b] else float("inf")


@dataclass(frozen=True)
class Summary:
    entries: int
    median_abs_error: float
    max_abs_error: float
    max_error_entry: str
    spearman: float
    orders: tuple[SizeOrder, ...]

    @property
    def orders_matched(self) -> int:
        return sum(o.matches for o in self.orders)

    @property
    def orders_matched_within_tolerance(self) -> int:
        """Sizes ordered as measured, pairs measured within :data:`ORDER_TOLERANCE` tied."""
        return sum(o.matches_within(ORDER_TOLERANCE) for o in self.orders)


def tflops_per_gpu(outcome: dict[str, Any], gpus: int) -> float | None:
    """A simulated outcome's per-GPU TFLOPS; None where it has no plan."""
    if outcome.get("error") or not outcome.get("pflops"):
        return None
    return float(outcome["pflops"]) * 1e3 / gpus


def entries(result: dict[str, Any]) -> list[Entry]:
    """Every method of one ``alpa-bench`` result beside its measurement."""
    out = []
    for o in result["outcomes"]:
        method = o["method"]
        row = measurement(result["model"], result["gpus"], COMPARED.get(method, method))
        out.append(
            Entry(
                result["model"],
                result["gpus"],
                method,
                tflops_per_gpu(o, result["gpus"]),
                None if row is None else row.tflops,
                row is not None,
            )
        )
    return out


def spearman(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Spearman's rank correlation (ties get their mean rank); nan below 2 points."""
    if len(xs) != len(ys):
        raise ValueError(f"spearman: {len(xs)} values against {len(ys)}")
    if len(xs) < 2:
        return float("nan")
    from scipy.stats import spearmanr

    return float(spearmanr(xs, ys).statistic)


def size_order(sized: Sequence[Entry]) -> SizeOrder:
    """Whether the simulator orders the methods of one size as measured."""
    counted = [e for e in sized if e.in_artifact and e.method not in COMPARED]
    meas = {e.method: e.measured or 0.0 for e in counted}
    sim = {e.method: e.simulated or 0.0 for e in counted}
    swapped = tuple((a, b) for a in meas for b in meas if meas[a] > meas[b] and not sim[a] > sim[b])
    first = sized[0] if sized else Entry("", 0, "", None, None, False)
    return SizeOrder(
        first.model,
        first.gpus,
        not swapped,
        tuple(sorted(meas, key=lambda m: -meas[m])),
        tuple(sorted(sim, key=lambda m: -sim[m])),
        swapped,
        tuple(meas.items()),
    )


def summarize(all_entries: Sequence[Entry]) -> Summary:
    """The statistics over every entry with both figures, and each size's order."""
    paired = [e for e in all_entries if e.ratio is not None and e.method not in COMPARED]
    errors = [abs(e.ratio - 1) for e in paired]  # type: ignore[operator]
    worst = max(paired, key=lambda e: abs(e.ratio - 1), default=None)  # type: ignore[operator]
    sizes: dict[tuple[str, int], list[Entry]] = {}
    for e in all_entries:
        sizes.setdefault((e.model, e.gpus), []).append(e)
    return Summary(
        entries=len(paired),
        median_abs_error=statistics.median(errors) if errors else float("nan"),
        max_abs_error=max(errors, default=float("nan")),
        max_error_entry=f"{worst.model} on {worst.gpus}, {worst.method}" if worst else "",
        spearman=spearman(
            [e.simulated for e in paired],  # type: ignore[misc]
            [e.measured for e in paired],  # type: ignore[misc]
        ),
        orders=tuple(size_order(group) for group in sizes.values()),
    )


def _figure(value: float | None, absent: str) -> str:
    return absent if value is None else f"{value:.2f}"


def format_entries(result: dict[str, Any]) -> str:
    """One result's methods: simulated and measured per-GPU TFLOPS and the ratio."""
    lines = [f"  {'method':<10} {'sim TF/GPU':>10} {'measured':>9} {'ratio':>6}"]
    for e in entries(result):
        measured = _figure(e.measured, "did not run" if e.in_artifact else "-")
        ratio = "-" if e.ratio is None else f"{e.ratio:.2f}"
        lines.append(
            f"  {e.method:<10} {_figure(e.simulated, 'no plan'):>10} {measured:>9} {ratio:>6}"
        )
    order = size_order(entries(result))
    lines.append(
        f"  order {'as measured' if order.matches else 'NOT as measured'}: measured "
        f"{' > '.join(order.measured_order)}; simulated {' > '.join(order.simulated_order)}"
    )
    if order.swapped:
        lines.append(
            "  measured apart, simulated not: "
            + ", ".join(f"{a} > {b} by {order.gap(a, b):.1%}" for a, b in order.swapped)
        )
    return "\n".join(lines)


def format_summary(summary: Summary) -> str:
    lines = [
        f"measured: {SOURCE}; {TESTBED}",
        f"  figures: {CONVENTION}",
        f"  {summary.entries} entries: median |error| {summary.median_abs_error:.1%}, "
        f"max |error| {summary.max_abs_error:.1%} ({summary.max_error_entry}), "
        f"Spearman {summary.spearman:.3f}",
        f"  method order as measured in {summary.orders_matched} of {len(summary.orders)} sizes "
        f"({summary.orders_matched_within_tolerance} counting pairs measured within "
        f"{ORDER_TOLERANCE:.0%} as ties)",
    ]
    for o in summary.orders:
        if not o.matches:
            pairs = ", ".join(f"{a} > {b} by {o.gap(a, b):.1%}" for a, b in o.swapped)
            lines.append(f"    {o.model} on {o.gpus}: measured {pairs}, simulated not")
    return "\n".join(lines)


def summary_json(summary: Summary) -> dict[str, Any]:
    return {
        "source": SOURCE,
        "testbed": TESTBED,
        "convention": CONVENTION,
        **asdict(summary),
        "orders_matched": summary.orders_matched,
        "order_tolerance": ORDER_TOLERANCE,
        "orders_matched_within_tolerance": summary.orders_matched_within_tolerance,
    }


def entries_json(result: dict[str, Any]) -> list[dict[str, Any]]:
    return [{**asdict(e), "ratio": e.ratio} for e in entries(result)]
