"""``parallelize``: the user-facing API for intra-operator parallel training
(modelled on Alpa's).

    @alpa_ir.parallelize(method=alpa_ir.ShardParallel(), donate_argnums="auto", batch_argnums=(1,))
    def train_step(state, batch): ...

On the first call with a given signature the step is imported, planned by
the method's pass pipeline and compiled for the local devices; later calls
reuse the executable. ``get_executable(*args)`` returns it without running.
After ``set_seed`` (:mod:`alpa_ir.api.random_seed`) a step is compiled with
one more argument, the seed and call number its draws are folded with.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from typing import Any

from alpa_ir.api.donation import DonateArgnums, resolve_donate_argnums
from alpa_ir.api.follow_parallel import (
    CreateStateParallel,
    FollowParallel,
    PlacedStateExecutable,
    follow_method,
    place_like,
)
from alpa_ir.api.follow_pipeline import follow_pipeline, follows_pipeline
from alpa_ir.api.global_config import apply_to_executable, global_config
from alpa_ir.api.plan_step import compile_step
from alpa_ir.api.shard_parallel import ManualShardParallel, Method, ShardParallel
from alpa_ir.api.sharded_executable import ShardedExecutable
from alpa_ir.api.stage_result import record_dp_result
from alpa_ir.api.strategy_table import print_if_asked
from alpa_ir.errors import AlpaError
from alpa_ir.frontend.arguments import (
    StaticArgnums,
    signature_key,
    step_arguments,
)
from alpa_ir.frontend.session_keys import fold_session_keys, session_word


def _is_pipeshard(method: object) -> bool:
    from alpa_ir.api.pipeshard import PipeshardParallel

    return isinstance(method, PipeshardParallel)


class ParallelizedFunction:
    """The result of :func:`parallelize`: call it like the original function."""

    def __init__(
        self,
        fn: Callable[..., Any],
        method: Method,
        donate_argnums: DonateArgnums,
        batch_argnums: Sequence[int],
        static_argnums: StaticArgnums = "auto",
    ) -> None:
        functools.update_wrapper(self, fn)
        self.fn, self.method = fn, method
        self.donate_argnums = (
            donate_argnums if isinstance(donate_argnums, str) else tuple(donate_argnums)
        )
        self.batch_argnums = tuple(batch_argnums)
        self.static_argnums = static_argnums
        self.global_options = global_config.options()
        """Alpa's ``global_config`` as it was when the step was parallelized."""
        self._cache: dict[Any, ShardedExecutable] = {}
        self.last_executable: ShardedExecutable | None = None

    def get_executable(self, *args: Any) -> ShardedExecutable:
        """The executable for these arguments (compiled on first use); after
        ``set_seed``, the one that takes the session's word last."""
        return self._executable(args, self._seeded())

    def _seeded(self) -> bool:
        """Whether calls draw with the session's seed (``set_seed``; not a follower)."""
        follower = isinstance(self.method, CreateStateParallel | FollowParallel)
        return global_config.session_random() is not None and not follower

    def _executable(self, args: tuple[Any, ...], seeded: bool) -> ShardedExecutable:
        key = signature_key(step_arguments(self.fn, args, self.static_argnums))
        method, fn, batch_argnums = self.method, self.fn, self.batch_argnums
        donate_argnums = resolve_donate_argnums(self.donate_argnums, len(args))
        if seeded:  # the session's word is one more argument, last, never batch
            key = ("session_random", key)
            fn = fold_session_keys(self.fn, len(args))
            batch_argnums = tuple(k for k in batch_argnums if k < len(args))
            args = (*args, session_word(0, 0))
        fresh, started = key not in self._cache, time.perf_counter()
        if fresh and isinstance(method, CreateStateParallel | FollowParallel):
            # a method following another step's executable, read now
            if isinstance(method, FollowParallel) and follows_pipeline(method):
                fn, method = follow_pipeline(
                    method.src_func.get_last_executable(), self.fn, args,
                    method.num_micro_batches, batch_argnums=self.batch_argnums,
                    static_argnums=self.static_argnums,
                )  # fmt: skip
            elif isinstance(method, FollowParallel):
                method = follow_method(method)
            else:
                method = place_like(method, self.fn, args)
            if isinstance(method, PlacedStateExecutable):
                self._cache[key] = method
        if fresh:  # a call again finds its executable (a follower's method is resolved once)
            _check_method(method)
        if key not in self._cache and _is_pipeshard(method):
            from alpa_ir.api.pipeshard_executable import compile_pipeshard

            self._cache[key] = compile_pipeshard(  # type: ignore[assignment]
                fn,
                args,
                method,  # type: ignore[arg-type]
                donate_argnums=donate_argnums,
                batch_argnums=batch_argnums,
                static_argnums=self.static_argnums,
                local_all_gather=self.global_options.use_local_allgather,
            )
        if key not in self._cache:
            self._cache[key] = compile_step(
                fn,
                args,
                method,
                donate_argnums=donate_argnums,
                batch_argnums=batch_argnums,
                static_argnums=self.static_argnums,
            )
        if fresh:
            if not isinstance(method, PlacedStateExecutable):
                self._cache[key].method = method  # its plan is read from it
            seconds = time.perf_counter() - started
            apply_to_executable(self._cache[key], self.global_options, self.fn, seconds)
            print_if_asked(self._cache[key])  # ALPA_DEBUG_PRINT_AS_STRATEGY
            record_dp_result(self._cache[key])  # get_last_dp_result()
        self.last_executable = self._cache[key]
        return self._cache[key]

    def get_last_executable(self) -> ShardedExecutable:
        """The executable of the last call (or :meth:`get_executable`), as Alpa's."""
        if self.last_executable is None:
            name = getattr(self.fn, "__name__", "the step")
            raise AlpaError(f"{name}: get_last_executable() before the step was called")
        return self.last_executable

    def preshard_dynamic_args(self, *args: Any) -> tuple[Any, ...]:
        """The dynamic arguments placed where the step reads them (Alpa's
        ``preshard_dynamic_args``): ``state, batch = f.preshard_dynamic_args(state, batch)``."""
        if self._seeded():  # the executable takes the session's word last
            word = session_word(0, 0)
            return tuple(self.get_executable(*args).preshard_dynamic_args(*args, word))[:-1]
        return self.get_executable(*args).preshard_dynamic_args(*args)

    def __call__(self, *args: Any) -> Any:
        seeded = self._seeded()
        executable = self._executable(args, seeded)
        remote = getattr(executable, "remote", None)
        if remote is not None and getattr(remote, "broken", ""):
            # its Ray workers died on an earlier call: compile and start them again
            self._cache = {k: v for k, v in self._cache.items() if v is not executable}
            executable = self._executable(args, seeded)
        if seeded:
            now = global_config.next_call()
            args = (*args, session_word(now.seed, now.calls))
        return executable(*args)


def _check_method(method: object) -> None:
    from alpa_ir.api.pipeshard import PipeshardParallel

    if isinstance(method, PlacedStateExecutable):
        return
    if not isinstance(method, ShardParallel | ManualShardParallel | PipeshardParallel):
        raise AlpaError(
            "method must be a parallel method (ShardParallel(), DataParallel(), "
            f"Zero2Parallel(), Zero3Parallel(), PipeshardParallel(), ...), got {method!r}"
        )


def parallelize(
    fn: Callable[..., Any] | None = None,
    *,
    method: Method | None = None,
    static_argnums: StaticArgnums = "auto",
    donate_argnums: DonateArgnums = "auto",
    batch_argnums: Sequence[int] = (1,),
) -> Any:
    """Parallelize a training step; usable as ``@parallelize`` or
    ``@parallelize(method=...)``. Defaults follow Alpa: the ``TrainState``
    arguments, and any other state the step returns updated, are donated
    (``donate_argnums="auto"``, :mod:`alpa_ir.api.donation`; a bare array is
    not), argument 1 is the batch, and with ``static_argnums="auto"``
    the arguments that are Python ``bool``/``int``/``float``/``str`` (or
    hold a leaf that is not an array) are static: bound at compile time, a new
    value compiles again."""

    def wrap(f: Callable[..., Any]) -> ParallelizedFunction:
        return ParallelizedFunction(
            f, method or ShardParallel(), donate_argnums, batch_argnums, static_argnums
        )

    return wrap(fn) if fn is not None else wrap
