"""alpa-p2: P² placement and reduction synthesis from the command line.

For a system preset, parallelism axes and the axes to reduce over, prints every parallelism
matrix with the predicted time of a plain AllReduce and of every synthesized reduction
program, fastest first (like the paper's Tables 3-4), or one JSON object with ``--json``.

Example: ``alpa-p2 --system gcp-a100-16x4 --axes 4,16 --reduce 1 --algorithm tree``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from alpa_ir.errors import AlpaError
from alpa_ir.p2.explore import ExploreOptions, MatrixResult, explore
from alpa_ir.p2.simulator import ALGORITHMS, default_bytes
from alpa_ir.p2.synthesis import DEFAULT_MAX_SIZE, MAX_SIZE_LIMIT
from alpa_ir.p2.system import PRESETS, System, get_system


class _Parser(argparse.ArgumentParser):
    """argparse that reports a usage error as one line (exit code 2)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise AlpaError(message)


def _int_list(text: str, what: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(","))
    except ValueError:
        raise AlpaError(f"--{what} expects comma-separated integers, got {text!r}") from None
    return values


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="alpa-p2", description=__doc__.splitlines()[0])
    parser.add_argument("--system", required=True, help=f"preset: {', '.join(sorted(PRESETS))}")
    parser.add_argument("--axes", required=True, help="parallelism axes, e.g. 4,16")
    parser.add_argument("--reduce", required=True, help="axes to reduce over, e.g. 1 or 0,2")
    parser.add_argument("--max-size", type=int, default=DEFAULT_MAX_SIZE, help="program size limit")
    parser.add_argument(
        "--algorithm", choices=ALGORITHMS, default="ring", help="NCCL AllReduce algorithm"
    )
    parser.add_argument(
        "--bytes", type=float, default=None, help="bytes per device (default: the paper's)"
    )
    parser.add_argument(
        "--top", type=int, default=0, help="print only the N fastest programs per matrix"
    )
    parser.add_argument(
        "--verify", action="store_true", help="re-check every lowered program on the whole system"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    return parser


def _matrix_json(result: MatrixResult) -> dict:
    return {
        "matrix": result.matrix.as_lists(),
        "synthesis_hierarchy": [
            {"level": level.name, "cardinality": level.cardinality}
            for level in result.layout.levels
        ],
        "allreduce_time": result.allreduce_time,
        "best_time": result.best_time,
        "speedup": result.speedup,
        "programs": [
            {
                "instructions": list(p.instructions),
                "size": p.lowered.program.size,
                "time": p.time,
                "permuted_chunks": p.lowered.chunk_order is not None,
            }
            for p in result.programs
        ],
    }


def _print_table(system: System, results: list[MatrixResult], top: int) -> None:
    """A summary like the paper's Tables 3-4, then every matrix's programs, fastest first."""
    total = sum(len(r.programs) for r in results)
    names = ", ".join(system.level_names)
    print(f"system {system.name}: hierarchy {list(system.hierarchy)} ({names}); times in seconds")
    print(f"{len(results)} parallelism matrices, {total} programs\n")
    width = max(len(str(r.matrix)) for r in results)
    print(f"{'matrix':<{width}}  {'AllReduce':>10}  {'optimal':>10}  speedup  faster/programs")
    for r in results:
        faster = sum(p.time < r.allreduce_time * (1 - 1e-9) for p in r.programs)
        print(
            f"{r.matrix!s:<{width}}  {r.allreduce_time:10.4f}  {r.best_time:10.4f}"
            f"  {r.speedup or 1:6.2f}x  {faster}/{len(r.programs)}"
        )
    for r in results:
        levels = " ".join(f"{lv.name}:{lv.cardinality}" for lv in r.layout.levels) or "-"
        print(f"\nmatrix {r.matrix}, synthesis hierarchy [{levels}]")
        shown = r.programs[:top] if top > 0 else r.programs
        for rank, p in enumerate(shown, 1):
            text = " ; ".join(p.instructions) or "(nothing to reduce)"
            mark = "  [chunks end permuted]" if p.lowered.chunk_order is not None else ""
            print(f"  {rank:>3}  {p.time:10.4f}  {text}{mark}")
        if len(shown) < len(r.programs):
            print(f"       ... {len(r.programs) - len(shown)} more")


def run(argv: list[str] | None) -> int:
    args = build_parser().parse_args(argv)
    system = get_system(args.system)
    axes = _int_list(args.axes, "axes")
    reduce_axes = _int_list(args.reduce, "reduce")
    if not 1 <= args.max_size <= MAX_SIZE_LIMIT:
        raise AlpaError(f"--max-size must be between 1 and {MAX_SIZE_LIMIT}, got {args.max_size}")
    if args.bytes is not None and not args.bytes > 0:
        raise AlpaError(f"--bytes must be positive, got {args.bytes}")
    options = ExploreOptions(args.max_size, args.algorithm, args.bytes, verify=args.verify)
    results = explore(system, axes, reduce_axes, options)
    if args.json:
        out = {
            "system": system.name,
            "hierarchy": list(system.hierarchy),
            "axes": list(axes),
            "reduce": sorted(set(reduce_axes)),
            "algorithm": args.algorithm,
            "bytes_per_device": args.bytes or default_bytes(system),
            "max_size": args.max_size,
            "total_programs": sum(len(r.programs) for r in results),
            "matrices": [_matrix_json(r) for r in results],
        }
        json.dump(out, sys.stdout, indent=1)
        print()
    else:
        _print_table(system, results, args.top)
    return 0


def main(argv: list[str] | None = None) -> int:
    try:
        return run(argv)
    except AlpaError as err:
        print(f"alpa-p2: error: {err}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # e.g. piped into `head`: stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


if __name__ == "__main__":
    sys.exit(main())
