"""Benchmark of P² synthesis and simulation against the paper's Appendix A.

Reports: (1) synthesis time (enumerate matrices, synthesize, lower) and simulation time for
every Appendix A configuration, cold (synthesis cache cleared), the largest ones highlighted;
(2) which program totals match the paper; (3) per system, the Spearman rank correlation
between the simulator's AllReduce predictions and the measured AllReduce times; (4) how often
the simulator picks the fastest measured matrix, by AllReduce and by best program.

Run: ``python -m alpa_ir.tools.bench_p2 [--json]``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict

from alpa_ir.p2.explore import ExploreOptions, explore
from alpa_ir.p2.paper_data import APPENDIX_A, ConfigMeasurement
from alpa_ir.p2.simulator import spearman
from alpa_ir.p2.synthesis import _synthesize
from alpa_ir.p2.system import get_system


def _timed_explore(config: ConfigMeasurement, algorithm: str) -> tuple[list, float, float]:
    """(results, synthesis seconds, synthesis + simulation seconds), best of 3 cold runs."""
    system = get_system(config.system)
    best_synth = best_total = float("inf")
    results: list = []
    for _ in range(3):
        _synthesize.cache_clear()
        start = time.perf_counter()
        explore(system, config.axes, config.reduce, ExploreOptions(simulate=False))
        best_synth = min(best_synth, time.perf_counter() - start)
        _synthesize.cache_clear()
        start = time.perf_counter()
        results = explore(system, config.axes, config.reduce, ExploreOptions(algorithm=algorithm))
        best_total = min(best_total, time.perf_counter() - start)
    return results, best_synth, best_total


def run() -> dict:
    rows = []
    pairs: dict[tuple[str, str], list[tuple[float, float]]] = defaultdict(list)
    # per system/algorithm: [AllReduce hits, AllReduce cases, best-program hits, cases]
    picks: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0, 0])
    for config in APPENDIX_A:
        row = {
            "system": config.system,
            "axes": list(config.axes),
            "reduce": list(config.reduce),
            "paper_programs": config.total_programs,
            "paper_synthesis_s": config.synthesis_time,
        }
        for algorithm in ("ring", "tree"):
            if algorithm == "tree" and config.matrices[0].allreduce_tree is None:
                continue
            results, synth_s, total_s = _timed_explore(config, algorithm)
            row["programs"] = sum(len(r.programs) for r in results)
            row["synthesis_s"] = synth_s
            row[f"with_simulation_{algorithm}_s"] = total_s
            by_matrix = {r.matrix.rows: r for r in results}
            sim_ar, meas_ar, sim_opt, meas_opt = [], [], [], []
            for meas in config.matrices:
                sim = by_matrix[meas.matrix]
                ar = meas.allreduce_ring if algorithm == "ring" else meas.allreduce_tree
                opt = meas.optimal_ring if algorithm == "ring" else meas.optimal_tree
                pairs[(config.system, algorithm)].append((sim.allreduce_time, ar))
                sim_ar.append(sim.allreduce_time)
                meas_ar.append(ar)
                sim_opt.append(sim.best_time)
                meas_opt.append(opt)
            if len(config.matrices) > 1:
                tally = picks[f"{config.system}/{algorithm}"]
                tally[0] += _argmin(sim_ar) == _argmin(meas_ar)
                tally[1] += 1
                tally[2] += _argmin(sim_opt) == _argmin(meas_opt)
                tally[3] += 1
        rows.append(row)
    correlations = {}
    for system in sorted({c.system for c in APPENDIX_A}):
        both = pairs[(system, "ring")] + pairs[(system, "tree")]
        correlations[system] = {
            "ring": spearman(*zip(*pairs[(system, "ring")], strict=True)),
            "tree": spearman(*zip(*pairs[(system, "tree")], strict=True)),
            "both": spearman(*zip(*both, strict=True)),
            "points": len(both),
        }
    return {"configs": rows, "spearman": correlations, "picks": dict(picks)}


def _argmin(values: list[float]) -> int:
    return min(range(len(values)), key=lambda i: values[i])


def _print(report: dict) -> None:
    print("configuration                         programs (paper)  synth s (paper)  +sim ring s")
    for row in report["configs"]:
        name = f"{row['system']} {row['axes']} reduce {row['reduce']}"
        match = "ok" if row["programs"] == row["paper_programs"] else "MISMATCH"
        print(
            f"{name:<38}{row['programs']:>4} ({row['paper_programs']:>3}) {match:<8}"
            f"{row['synthesis_s']:>7.3f} ({row['paper_synthesis_s']:.3f})"
            f"{row['with_simulation_ring_s']:>10.3f}"
        )
    largest = max(report["configs"], key=lambda r: (r["programs"], r["with_simulation_ring_s"]))
    slowest = max(r["with_simulation_ring_s"] for r in report["configs"])
    print(
        f"\nlargest configuration: {largest['system']} {largest['axes']} reduce {largest['reduce']}"
        f" ({largest['programs']} programs): synthesis {largest['synthesis_s']:.3f} s,"
        f" with simulation {largest['with_simulation_ring_s']:.3f} s; slowest overall {slowest:.3f} s"
    )
    matched = sum(r["programs"] == r["paper_programs"] for r in report["configs"])
    print(f"program totals matching the paper: {matched}/{len(report['configs'])}")
    print("\nSpearman(simulated AllReduce, measured AllReduce):")
    for system, c in report["spearman"].items():
        print(
            f"  {system:<15} ring {c['ring']:.3f}  tree {c['tree']:.3f}"
            f"  both {c['both']:.3f}  ({c['points']} points)"
        )
    print("\nfastest measured matrix picked by the simulator (configurations with >1 matrix):")
    for key, (ar_hit, ar_n, opt_hit, opt_n) in sorted(report["picks"].items()):
        print(f"  {key:<22} by AllReduce {ar_hit}/{ar_n}   by best program {opt_hit}/{opt_n}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench_p2", description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    report = run()
    if args.json:
        json.dump(report, sys.stdout, indent=1)
        print()
    else:
        _print(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
