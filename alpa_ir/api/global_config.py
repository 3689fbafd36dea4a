"""Alpa's ``alpa.global_config``, honoured without a global driving the planner.

Alpa keeps its configuration in one mutable object that every part of it reads
whenever it likes. Here the planner and the runtime only ever see frozen
options: :class:`GlobalConfig` is the object Alpa's users assign to
(``alpa.global_config.collect_trace = True``), and :func:`parallelize
<alpa_ir.api.parallel.parallelize>` reads it **once**, when a step is
parallelized, into a frozen :class:`GlobalOptions` that goes with that step.
Assign before ``parallelize`` (as Alpa's scripts do at their top); a step
parallelized earlier keeps the values it was made with.

Fields of Alpa's that change what happens here:

- ``collect_trace``: pipeline steps record when every instruction ran
  (``PipeshardExecutable.record_timeline``; the timeline is in
  ``last_timeline`` and ``plot("timeline", ...)`` draws it).
- ``print_compilation_time``: the time to plan and compile a step is printed
  when it is compiled.
- ``use_local_allgather``: ``cross-mesh-resharding``'s send-once + local
  all-gather (``local-all-gather=false`` when off).
- ``runtime_random_seed``: assigning it is Alpa's ``set_seed``
  (:mod:`alpa_ir.api.random_seed`): from then on every call of a
  parallelized step draws with its keys folded with the seed and the call's
  number. Unlike the fields above it is read at every call, as Alpa's
  devices read their generator's state.

Every other field of Alpa's ``GlobalConfig`` reads as Alpa's default; setting
one to another value warns in one line that it has no meaning here (it names
the field). A name Alpa does not have is an :class:`~alpa_ir.errors.AlpaError`.
"""

from __future__ import annotations

import dataclasses
import threading
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np

from alpa_ir.errors import AlpaError


@dataclass(frozen=True)
class GlobalOptions:
    """What a step takes from ``global_config`` when it is parallelized."""

    collect_trace: bool = False
    print_compilation_time: bool = False
    use_local_allgather: bool = True


@dataclass(frozen=True)
class SessionRandom:
    """The seed of the last ``set_seed`` and how many seeded calls ran since."""

    seed: int
    calls: int = 0


ALPA_RUNTIME_SEED = 42
"""Alpa's ``runtime_random_seed`` before any ``set_seed``."""


WITHOUT_MEANING: dict[str, tuple[Any, str]] = {
    "backend": ("gpu", "the devices are JAX's (JAX_PLATFORMS)"),
    "has_cuda": (False, "the devices are JAX's (JAX_PLATFORMS)"),
    "xla_client_mem_fraction": (0.9, "give a method device_memory instead"),
    "xla_client_client_preallocate": ("true", "XLA_PYTHON_CLIENT_PREALLOCATE is JAX's"),
    "delete_remote_arrays_threshold": (50, "no remote arrays are kept"),
    "compile_random_seed": (42, "planning draws no random numbers"),
    "xla_server_port_start": (20000, "Ray and JAX choose their ports"),
    "xla_server_port_end": (25000, "Ray and JAX choose their ports"),
    "xla_gpu_autotune_level": (4, "set XLA_FLAGS"),
    "use_aws_efa": (False, "the collectives are XLA's"),
    "shard_parallel_sync_for_timer": (False, "there are no Alpa timers"),
    "debug_with_pipeshard_runtime": (False, "use LocalPipelineParallel"),
    "profile_with_whole_ray_cluster": (True, "stage costs are modelled or profiled locally"),
    "profile_timeout": (500, "stage costs are modelled or profiled locally"),
    "profile_maximum_retry": (2, "stage costs are modelled or profiled locally"),
    "overwrite_submesh_choices": (None, "use AutoStageOption's submesh_logical_shape_space"),
    "always_donate_micro_batch_vars": (True, "micro-batches are one program's loop"),
    "pipeline_sync_for_timer": (False, "there are no Alpa timers"),
    "pipeline_distributed_compile": (True, "each host compiles its own programs"),
    "eagerly_create_communicators": (True, "the collectives are XLA's"),
    "pipeline_check_alive": (False, "a dead host fails the step within its timeout"),
    "pipeline_use_signal_send_recv": (False, "transfers are XLA programs"),
    "resharding_mode": ("send_recv", "cross-mesh transfers are planned by cross-mesh-resharding"),
    "nccl_mode": ("cupy", "the collectives are XLA's"),
    "enable_overlapping": (False, "the runtime runs XLA's programs as compiled"),
    "resharding_loadbalance_mode": ("normal", "cross-mesh transfers are planned by a pass"),
    "loadbalance_order_algo": ("greedy", "cross-mesh transfers are planned by a pass"),
    "use_dummy_value_for_benchmarking": (False, "steps run on the arrays they are given"),
    "flax_always_use_fp16_embedding": (False, "the model's dtypes are kept"),
    "print_auto_layer_stats": (False, "see the pass statistics of the executable"),
}
"""Alpa's fields with no meaning here: (Alpa's default, what to do instead)."""


class GlobalConfig:
    """Alpa's ``global_config`` (module docstring): the fields of
    :class:`GlobalOptions` are read by ``parallelize``; Alpa's other fields
    keep their default and warn when set to another value."""

    def __init__(self) -> None:
        object.__setattr__(self, "_options", GlobalOptions())
        object.__setattr__(self, "_others", {k: v for k, (v, _) in WITHOUT_MEANING.items()})
        object.__setattr__(self, "_random", None)
        # steps called from several threads each take a call number of their own
        object.__setattr__(self, "_random_lock", threading.Lock())

    def options(self) -> GlobalOptions:
        """The fields that mean something here, as they are now (frozen)."""
        return self._options  # type: ignore[no-any-return]

    def session_random(self) -> SessionRandom | None:
        """The seed and the number of seeded calls since ``set_seed``; None before it."""
        return self._random  # type: ignore[no-any-return]

    def seed_draws(self, seed: int | None) -> None:
        """Alpa's ``set_seed``: seeded calls count again from 0 with ``seed``;
        None: steps draw with their keys alone again."""
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int | np.integer)):
            raise AlpaError(f"the random seed must be an integer or None, got {seed!r}")
        with self._random_lock:
            object.__setattr__(self, "_random", None if seed is None else SessionRandom(int(seed)))

    def next_call(self) -> SessionRandom:
        """The seed and number of this seeded call (counting it); after ``set_seed``."""
        with self._random_lock:
            now = self._random
            if now is None:
                raise AlpaError("no random seed: call set_seed(seed) first")
            object.__setattr__(self, "_random", dataclasses.replace(now, calls=now.calls + 1))
        return now  # type: ignore[no-any-return]

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        if name == "runtime_random_seed":
            return ALPA_RUNTIME_SEED if self._random is None else self._random.seed
        if name in _OPTION_FIELDS:
            return getattr(self._options, name)
        if name in self._others:
            return self._others[name]
        raise AttributeError(f"global_config has no field '{name}'")

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "runtime_random_seed":
            self.seed_draws(value)
            return
        if name in _OPTION_FIELDS:
            default = getattr(GlobalOptions(), name)
            if type(value) is not type(default):
                raise AlpaError(
                    f"global_config.{name} must be a {type(default).__name__}, got {value!r}"
                )
            object.__setattr__(
                self, "_options", dataclasses.replace(self._options, **{name: value})
            )
            return
        if name not in WITHOUT_MEANING:
            raise AlpaError(f"global_config has no field '{name}' (Alpa's GlobalConfig neither)")
        default, instead = WITHOUT_MEANING[name]
        if value != default:
            warnings.warn(
                f"global_config.{name} = {value!r} has no meaning in alpa_ir and is ignored: "
                f"{instead}",
                UserWarning,
                stacklevel=2,
            )
        self._others[name] = value

    def __repr__(self) -> str:
        return f"GlobalConfig({self._options})"


_OPTION_FIELDS = frozenset(f.name for f in dataclasses.fields(GlobalOptions))

global_config = GlobalConfig()
"""The object Alpa's users assign to; read by ``parallelize`` only."""


def apply_to_executable(executable: Any, options: GlobalOptions, fn: Any, seconds: float) -> Any:
    """What ``options`` ask of a step's freshly compiled ``executable``: a
    pipeline records its timeline (``collect_trace``), the compile time is
    printed (``print_compilation_time``)."""
    if options.collect_trace and hasattr(executable, "record_timeline"):
        executable.record_timeline = True
    if options.print_compilation_time:
        name = getattr(fn, "__name__", "step")
        print(f"compilation time of {name}: {seconds:.2f} s")
    return executable


__all__ = [
    "GlobalConfig",
    "GlobalOptions",
    "SessionRandom",
    "apply_to_executable",
    "global_config",
]
