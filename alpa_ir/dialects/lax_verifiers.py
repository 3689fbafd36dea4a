"""Shape checks of ``lax`` ops whose parameters name dimensions.

A module written by hand (or edited) can name a contracting dimension that a
``dot_general`` operand does not have, or contract dimensions of different
sizes; later passes would plan it silently or crash. Each check raises
``VerifyException`` with a one-line message; the op's verifier calls the
check of its primitive (:data:`VERIFIERS`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Any

from xdsl.utils.exceptions import VerifyException


def _shape(ty: Any) -> tuple[int, ...]:
    return tuple(int(d) for d in ty.get_shape())


def _dims(name: str, side: str, dims: Sequence[int], rank: int) -> None:
    for d in dims:
        if not 0 <= d < rank:
            raise VerifyException(
                f"{name}: {side} dimension {d} is out of range for a rank-{rank} operand"
            )
    if len(set(dims)) != len(dims):
        raise VerifyException(f"{name}: {side} dimensions {list(dims)} repeat a dimension")


def verify_dot_general(op: Any) -> None:
    (lc, rc), (lb, rb) = op.param("dimension_numbers")
    lhs, rhs = (_shape(t) for t in op.operand_types)
    name = op.name
    _dims(name, "lhs contracting", lc, len(lhs))
    _dims(name, "rhs contracting", rc, len(rhs))
    _dims(name, "lhs batch", lb, len(lhs))
    _dims(name, "rhs batch", rb, len(rhs))
    if set(lc) & set(lb) or set(rc) & set(rb):
        raise VerifyException(f"{name}: a dimension is both contracting and batch")
    for kind, left, right in (("contracting", lc, rc), ("batch", lb, rb)):
        if len(left) != len(right):
            raise VerifyException(
                f"{name}: {len(left)} lhs {kind} dimensions but {len(right)} rhs ones"
            )
        for a, b in zip(left, right, strict=True):
            if lhs[a] != rhs[b]:
                raise VerifyException(
                    f"{name}: {kind} dimensions lhs {a} (size {lhs[a]}) and rhs {b} "
                    f"(size {rhs[b]}) differ in size"
                )
    free_l = [lhs[d] for d in range(len(lhs)) if d not in lc and d not in lb]
    free_r = [rhs[d] for d in range(len(rhs)) if d not in rc and d not in rb]
    want = (*(lhs[d] for d in lb), *free_l, *free_r)
    got = _shape(op.result_types[0])
    if got != want:
        raise VerifyException(f"{name}: result shape {list(got)}, the dimensions give {list(want)}")


VERIFIERS: Mapping[str, Callable[[Any], None]] = MappingProxyType(
    {"dot_general": verify_dot_general}
)
"""Primitive name -> its shape check."""
