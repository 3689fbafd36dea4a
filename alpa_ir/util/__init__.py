"""Alpa's ``alpa.util`` name (import alpa_ir.util): a shim over
:mod:`alpa_ir.compat.util`."""

from alpa_ir.compat.util import (
    benchmark_func,
    count_communication_primitives,
    disable_tqdm_globally,
    map_to_nparray,
    map_to_shape,
)

__all__ = [
    "benchmark_func",
    "count_communication_primitives",
    "disable_tqdm_globally",
    "map_to_nparray",
    "map_to_shape",
]
