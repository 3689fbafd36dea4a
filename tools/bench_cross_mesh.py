"""Benchmark of cross-mesh resharding plans (Alpa §6): bytes crossing between
meshes with plain send/recv and with the local all-gather rewrite.

For each case (a tensor, a source mesh and spec, a destination mesh and spec)
it plans both variants with :func:`alpa_ir.pipeline.cross_mesh.plan_transfer` and
prints the bytes crossing between the meshes, the most any one source device
sends and any one destination device receives over the cross-mesh links
(what bounds the transfer time when each device's link is the bottleneck),
and, for the rewrite, the bytes the destination mesh's all-gather moves over
its local links (each device receives its tile minus the part it got).
Planning only: nothing runs, so paper-sized tensors cost nothing.

Run: ``python -m alpa_ir.tools.bench_cross_mesh``.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from alpa_ir.dialects.sharding import ShardingSpec
from alpa_ir.errors import AlpaError
from alpa_ir.pipeline.cross_mesh import MeshLayout, TransferPlan, plan_transfer


def parse_spec(text: str) -> ShardingSpec:
    """``"S0,R"`` -> ``[S0, R]``."""
    dims = []
    for d in text.split(","):
        d = d.strip()
        if d == "R":
            dims.append(())
        elif d.startswith("S") and d[1:].isdigit():
            dims.append(tuple(int(c) for c in d[1:]))
        else:
            raise AlpaError(f"bad spec dimension '{d}' in '{text}' (R or S<mesh axes>)")
    return ShardingSpec(tuple(dims))


@dataclass(frozen=True)
class Case:
    name: str
    shape: tuple[int, ...]
    itemsize: int
    src_mesh: tuple[int, ...]
    src_spec: str
    dst_mesh: tuple[int, ...]
    dst_spec: str

    def layouts(self) -> tuple[MeshLayout, MeshLayout]:
        n = math.prod(self.src_mesh)
        src = MeshLayout(parse_spec(self.src_spec), self.src_mesh, tuple(range(n)))
        dst_devices = tuple(range(n, n + math.prod(self.dst_mesh)))
        return src, MeshLayout(parse_spec(self.dst_spec), self.dst_mesh, dst_devices)


GPT = (8, 1024, 2560)  # [micro-batch, sequence, hidden] of a GPT-3 2.6B layer, fp16
CASES = [
    Case("tiny", (8, 8), 4, (1, 2), "R,R", (1, 2), "R,R"),
    Case("tiny", (8, 8), 4, (1, 2), "R,S1", (1, 2), "S1,R"),
    Case("tiny", (8, 8), 4, (1, 4), "R,S1", (2, 2), "S0,R"),
    Case("tiny", (8, 8), 4, (1, 4), "S1,R", (2, 2), "R,R"),
    Case("tiny", (8, 8), 4, (1, 4), "R,R", (2, 2), "S01,R"),
    Case("tiny", (8, 8), 4, (2, 2), "S0,S1", (1, 4), "R,R"),
    Case("tiny", (8, 8), 4, (2, 2), "S01,R", (1, 4), "R,S1"),
    Case("tiny", (8, 8), 4, (2, 2), "R,R", (1, 4), "R,R"),
    Case("gpt", GPT, 2, (1, 4), "R,R,R", (1, 4), "R,R,R"),
    Case("gpt", GPT, 2, (1, 4), "S1,R,R", (2, 2), "S0,R,R"),
    Case("gpt", GPT, 2, (2, 4), "S0,R,R", (2, 4), "S0,R,R"),
    Case("gpt", GPT, 2, (2, 4), "S0,R,R", (4, 2), "S0,R,R"),
    Case("gpt", GPT, 2, (2, 4), "S0,R,S1", (1, 8), "R,R,R"),
]


@dataclass(frozen=True)
class Row:
    case: Case
    plain: TransferPlan
    rewritten: TransferPlan

    @staticmethod
    def max_sent(plan: TransferPlan) -> int:
        return max(plan.sent_bytes().values())

    @staticmethod
    def max_received(plan: TransferPlan) -> int:
        got = {d: 0 for d in plan.dst.devices}
        for (_, d), n in plan.link_bytes().items():
            got[d] += n
        return max(got.values())

    @staticmethod
    def all_gather_bytes(plan: TransferPlan) -> int:
        """Bytes the destination mesh's all-gathers deliver: each destination
        device's tile minus its received part, summed."""
        tile = math.prod(plan.dst.spec.local_shape(plan.shape, plan.dst.mesh_shape))
        recv = math.prod(plan.recv_spec.local_shape(plan.shape, plan.dst.mesh_shape))
        return (tile - recv) * plan.itemsize * len(plan.dst.devices)


def rows(cases: Sequence[Case] = CASES) -> list[Row]:
    out = []
    for case in cases:
        src, dst = case.layouts()
        plain = plan_transfer(case.shape, case.itemsize, src, dst, local_all_gather=False)
        rewritten = plan_transfer(case.shape, case.itemsize, src, dst, local_all_gather=True)
        out.append(Row(case, plain, rewritten))
    return out


def _size(n: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def format_table(table: Sequence[Row]) -> str:
    head = (
        f"{'case':<5} {'shape':<16} {'src':<14} {'dst':<14} {'tensor':>10} "
        f"{'plain':>10} {'rewrite':>10} {'saved':>6} {'max src out p/r':>21} "
        f"{'max dst in p/r':>21} {'local AG':>10}"
    )
    lines = [head, "-" * len(head)]
    for r in table:
        c = r.case
        p, w = r.plain, r.rewritten
        lines.append(
            f"{c.name:<5} {'x'.join(map(str, c.shape)):<16} "
            f"{'x'.join(map(str, c.src_mesh)) + ' [' + c.src_spec + ']':<14} "
            f"{'x'.join(map(str, c.dst_mesh)) + ' [' + c.dst_spec + ']':<14} "
            f"{_size(p.tensor_bytes):>10} {_size(p.cross_bytes):>10} {_size(w.cross_bytes):>10} "
            f"{p.cross_bytes / w.cross_bytes:>5.1f}x "
            f"{_size(Row.max_sent(p)) + ' / ' + _size(Row.max_sent(w)):>21} "
            f"{_size(Row.max_received(p)) + ' / ' + _size(Row.max_received(w)):>21} "
            f"{_size(Row.all_gather_bytes(w)):>10}"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench_cross_mesh", description=__doc__.split("\n")[0])
    parser.parse_args(argv)
    print(format_table(rows()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
