"""``alpa.util``'s user-facing helpers: ``benchmark_func`` and
``disable_tqdm_globally``."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np


def benchmark_func(
    run_func: Callable[[], Any],
    sync_func: Callable[[], Any] | None = None,
    warmup: int = 1,
    repeat: int = 3,
    number: int = 5,
    min_repeat_second: float | None = None,
) -> np.ndarray:
    """Seconds per call of ``run_func``, as Alpa's helper: ``warmup`` calls,
    then ``repeat`` rounds of ``number`` calls each (``sync_func``, when
    given, waits for the devices before and after a round); returns the
    ``repeat`` per-round means. With ``min_repeat_second``, ``number`` is
    chosen so that a round lasts at least that long."""
    for _ in range(warmup):
        run_func()
    if min_repeat_second:
        once = _timed(run_func, sync_func, 1)
        number = max(int(min_repeat_second / max(once, 1e-9)), 1)
    return np.array([_timed(run_func, sync_func, number) / number for _ in range(repeat)])


def _timed(run_func: Callable[[], Any], sync_func: Callable[[], Any] | None, number: int) -> float:
    if sync_func is not None:
        sync_func()
    tic = time.perf_counter()
    for _ in range(number):
        run_func()
    if sync_func is not None:
        sync_func()
    return time.perf_counter() - tic


def disable_tqdm_globally() -> None:
    """Turn off every ``tqdm`` progress bar made after this call, as Alpa's
    helper (which patches ``tqdm.tqdm``, a process-wide switch by design). A
    no-op without tqdm. The planner's own progress display is an option
    (``AutoStageOption(progress=...)``), never a global."""
    try:
        import tqdm
    except ImportError:
        return
    import functools

    tqdm.tqdm.__init__ = functools.partialmethod(tqdm.tqdm.__init__, disable=True)  # type: ignore[method-assign]


def count_communication_primitives(
    hlo_ir: str, ignore_scalar_all_reduce: bool = False
) -> tuple[int, int, int, int, int]:
    """The collectives of an HLO module's text, as Alpa's helper counts them:
    (all of them, all-reduces, all-gathers, reduce-scatters, all-to-alls),
    read by :func:`~alpa_ir.costs.collective_accounting.hlo_collectives`
    (async pairs counted once). ``ignore_scalar_all_reduce``: all-reduces of
    at most 8 bytes (a loss, a norm) are left out. On CPU devices XLA writes a
    reduce-scatter as an all-reduce and a slice."""
    from alpa_ir.costs.collective_accounting import hlo_collectives

    records = hlo_collectives(hlo_ir)
    if ignore_scalar_all_reduce:
        records = [r for r in records if not (r.kind == "all-reduce" and r.bytes <= 8)]
    kinds = [r.kind for r in records]
    return (
        len(records),
        kinds.count("all-reduce"),
        kinds.count("all-gather"),
        kinds.count("reduce-scatter"),
        kinds.count("all-to-all"),
    )


def map_to_shape(array_pytree: Any) -> Any:
    """Each leaf's shape (None for a leaf without one), as Alpa's helper."""
    import jax

    return jax.tree.map(lambda x: getattr(x, "shape", None), array_pytree)


def map_to_nparray(tree: Any) -> Any:
    """Each array leaf as a numpy array (other leaves as they are), as Alpa's
    helper: a state fetched to the host, e.g. to pickle it."""
    import jax
    import numpy as np

    return jax.tree.map(lambda x: np.asarray(x) if hasattr(x, "__array__") else x, tree)
