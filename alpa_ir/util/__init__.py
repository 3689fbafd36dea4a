"""Alpa's ``alpa.util`` name (import alpa_ir.util): a shim over
:mod:`alpa_ir.compat.util`."""

from alpa_ir.compat.util import benchmark_func, disable_tqdm_globally

__all__ = ["benchmark_func", "disable_tqdm_globally"]
