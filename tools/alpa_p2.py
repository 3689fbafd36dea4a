"""alpa-p2: P² placement and reduction synthesis from the command line.

For a system preset, parallelism axes and the axes to reduce over, prints every parallelism
matrix with the predicted time of a plain AllReduce and of every synthesized reduction
program, fastest first (like the paper's Tables 3-4), or one JSON object with ``--json``.

Example: ``alpa-p2 --system gcp-a100-16x4 --axes 4,16 --reduce 1 --algorithm tree``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
from typing import NoReturn

from alpa_ir.errors import AlpaError
from alpa_ir.p2.explore import ExploreOptions, MatrixResult, explore
from alpa_ir.p2.simulator import ALGORITHMS, default_bytes
from alpa_ir.p2.synthesis import DEFAULT_MAX_SIZE, MAX_SIZE_LIMIT
from alpa_ir.p2.system import PRESETS, System, get_system
from alpa_ir.tools.cli_args import (
    OneLineParser,
    nonnegative_int,
    nonnegative_int_list,
    positive_finite_float,
    positive_int,
    positive_int_list,
)

MAX_CUSTOM_DEVICES = 1 << 16
"""The most devices of a ``custom-AxB..`` system (custom-128x64 takes seconds; custom-1000x1000
did not finish in 30 s)."""
_CUSTOM = re.compile(r"0*[1-9][0-9]*(x0*[1-9][0-9]*)*")


class _Parser(OneLineParser):
    """argparse that reports a usage error as one line (exit code 2, see :func:`main`)."""

    def error(self, message: str) -> NoReturn:
        raise AlpaError(self.one_line(message))


def _epilog() -> str:
    return (
        f"systems (--system): {', '.join(sorted(PRESETS))}, or custom-AxB.. (a system of "
        "these level cardinalities, outermost first, e.g. custom-4x16)\n"
        "--axes multiply to the system's device count; --reduce numbers them from 0."
    )


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="alpa-p2", description=__doc__.splitlines()[0], epilog_fn=_epilog)
    parser.add_argument(
        "--system", required=True, help="system preset or custom-AxB.. (listed below)"
    )
    parser.add_argument(
        "--axes",
        required=True,
        type=positive_int_list,
        help="parallelism axes: comma-separated positive integers, e.g. 4,16",
    )
    parser.add_argument(
        "--reduce",
        required=True,
        type=nonnegative_int_list,
        help="the axes to reduce over: distinct indices into --axes, e.g. 1 or 0,2",
    )
    parser.add_argument(
        "--max-size",
        type=positive_int,
        default=DEFAULT_MAX_SIZE,
        help=f"program size limit (1 to {MAX_SIZE_LIMIT})",
    )
    parser.add_argument(
        "--algorithm", choices=ALGORITHMS, default="ring", help="NCCL AllReduce algorithm"
    )
    parser.add_argument(
        "--bytes",
        type=positive_finite_float,
        default=None,
        help="bytes per device, a positive finite number (default: the paper's)",
    )
    parser.add_argument(
        "--top",
        type=nonnegative_int,
        default=0,
        help="print only the N fastest programs per matrix (0: all)",
    )
    parser.add_argument(
        "--verify", action="store_true", help="re-check every lowered program on the whole system"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    return parser


def _system(name: str) -> System:
    """``--system``: a preset, or ``custom-AxB..`` with positive cardinalities."""
    custom = name.startswith("custom-") and _CUSTOM.fullmatch(name.removeprefix("custom-"))
    if name not in PRESETS and not custom:
        known = ", ".join(sorted(PRESETS))
        raise AlpaError(
            f"--system: unknown system {name!r}; known: {known}, or custom-AxB.. with "
            "positive cardinalities (e.g. custom-4x16)"
        )
    if custom:
        devices = math.prod(int(c) for c in name.removeprefix("custom-").split("x"))
        if devices > MAX_CUSTOM_DEVICES:
            raise AlpaError(
                f"--system {name}: {devices} devices is more than a custom system may have "
                f"({MAX_CUSTOM_DEVICES}; the synthesis and its simulation grow with the devices)"
            )
    try:
        return get_system(name)
    except AlpaError as error:
        raise AlpaError(f"--system {name!r}: {error}") from error


def _check_axes(system: System, axes: tuple[int, ...], reduce_axes: tuple[int, ...]) -> None:
    """``--axes`` fill the system, ``--reduce`` names distinct axes among them."""
    shown = ",".join(map(str, axes))
    devices = math.prod(axes)
    if devices != math.prod(system.hierarchy):
        raise AlpaError(
            f"--axes {shown} has {devices} devices but system {system.name} "
            f"(hierarchy {list(system.hierarchy)}) has {math.prod(system.hierarchy)}"
        )
    reduce_text = ",".join(map(str, reduce_axes))
    out = [a for a in reduce_axes if a >= len(axes)]
    if out:
        raise AlpaError(
            f"--reduce {reduce_text}: axis {out[0]} is out of range for --axes {shown} "
            f"(axes 0 to {len(axes) - 1})"
        )
    repeated = sorted({a for a in reduce_axes if reduce_axes.count(a) > 1})
    if repeated:
        raise AlpaError(f"--reduce {reduce_text}: axis {repeated[0]} is named twice")


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
    if args.max_size > MAX_SIZE_LIMIT:
        raise AlpaError(f"--max-size must be between 1 and {MAX_SIZE_LIMIT}, got {args.max_size}")
    system = _system(args.system)
    axes, reduce_axes = args.axes, args.reduce
    _check_axes(system, axes, reduce_axes)
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
