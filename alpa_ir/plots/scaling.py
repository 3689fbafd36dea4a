"""The weak-scaling figure (the Alpa paper's Figure 7): PFLOPS against GPUs
for every method of ``alpa-bench`` results (``--json``), a line per method;
a plan that failed (out of memory, no plan) is a cross at the bottom.

``python -m alpa_ir.plots.scaling RESULTS.json OUT.png`` draws saved results.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from alpa_ir.errors import AlpaError
from alpa_ir.plots.figure import STAGE_COLOURS, new_figure, save


@dataclass(frozen=True)
class ScalingDrawing:
    path: Path
    points: dict[str, list[tuple[int, float]]]
    """Method -> (GPUs, PFLOPS) of its plans that ran."""
    failures: dict[str, list[int]]
    """Method -> GPU counts where it had no plan."""


def draw_scaling(
    results: Sequence[dict[str, Any]], path: str | os.PathLike[str], *, title: str = ""
) -> ScalingDrawing:
    if not results:
        raise AlpaError("scaling figure: no results to draw")
    points: dict[str, list[tuple[int, float]]] = {}
    failures: dict[str, list[int]] = {}
    for result in results:
        try:
            gpus, outcomes = int(result["gpus"]), result["outcomes"]
            for o in outcomes:
                if o.get("error"):
                    failures.setdefault(o["method"], []).append(gpus)
                else:
                    points.setdefault(o["method"], []).append((gpus, float(o["pflops"])))
        except (KeyError, TypeError, ValueError) as exc:
            raise AlpaError(f"scaling figure: not alpa-bench results ({exc!r} missing)") from None
    figure, ax = new_figure(6.5, 4)
    methods = sorted(set(points) | set(failures), key=lambda m: (m != "alpa", m))
    for k, method in enumerate(methods):
        colour = STAGE_COLOURS[k % len(STAGE_COLOURS)]
        xs = sorted(points.get(method, []))
        if xs:
            ax.plot([g for g, _ in xs], [p for _, p in xs], marker="o", color=colour,
                    label=method, gid=f"line-{method}")  # fmt: skip
        for j, g in enumerate(failures.get(method, [])):
            label = f"{method}: no plan" if not xs and j == 0 else None
            ax.plot([g], [0], marker="x", color=colour, label=label, gid=f"failed-{method}-{g}")
    ax.set_xscale("log", base=2)
    gpus = sorted({int(r["gpus"]) for r in results})
    ax.set_xticks(gpus, [str(g) for g in gpus])
    ax.set_xlabel("GPUs")
    ax.set_ylabel("PFLOPS (simulated)")
    models = ", ".join(dict.fromkeys(str(r.get("model", "?")) for r in results))
    ax.set_title(title or f"weak scaling: {models}", fontsize=9)
    ax.legend(fontsize=7)
    return ScalingDrawing(save(figure, path), points, failures)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 2:
        print("usage: python -m alpa_ir.plots.scaling RESULTS.json OUT.png", file=sys.stderr)
        return 2
    try:
        try:
            results = json.loads(Path(args[0]).read_text())
        except (OSError, ValueError) as exc:
            raise AlpaError(f"{args[0]}: cannot read alpa-bench JSON: {exc}") from None
        if not isinstance(results, list):
            raise AlpaError(f"{args[0]}: expected the list alpa-bench --json prints")
        drawing = draw_scaling(results, args[1])
    except AlpaError as err:
        print(f"scaling: error: {err}", file=sys.stderr)
        return 1
    print(drawing.path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
