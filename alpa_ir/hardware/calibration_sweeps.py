"""The microbenchmark programs of ``alpa-calibrate`` and their timing.

Every program runs over *all* the devices it is given at once, as one SPMD
program (``jax.shard_map`` over a mesh of them), each device on its own block:
that is how a plan's step runs, and on the host platform, where the 8 CPU
devices share a few cores, it is the only way to see what one device gets
while the others work too. A program is timed as the median of several calls
after warmup calls (compilation excluded), each call waited for
(``block_until_ready``).

* :func:`gemm_program`: each device multiplies its own ``m × k`` by ``k × n``.
* :func:`stream_program`: each device reads and writes ``n`` elements once
  (``y = a·x + b``, one fused kernel): memory bandwidth.
* :func:`transpose_program`: each device computes ``0.1·aᵀ + 0.9·b`` over
  a batch of its own ``n × n`` arrays (one fused kernel reading ``a`` across
  rows): the rate of a read through a transpose of an ``n × n`` array.
* :func:`chain_program`: each device runs ``kernels`` dependent tiny matrix
  products (one kernel each, nothing to fuse): the per-kernel floor.
* :func:`collective_program`: one collective over the mesh axis ``group``
  of a ``(devices / group, group)`` mesh, so every group runs at once (the
  way a plan's collectives over one mesh axis run).
* :func:`trivial_program`: one element per device, the dispatch floor of a
  program, subtracted from the others' times (a step pays it once, not per op).
"""

from __future__ import annotations

import os
import resource
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from alpa_ir.errors import AlpaError
from alpa_ir.hardware.calibration_fits import median

Program = tuple[Callable[..., Any], tuple[Any, ...]]
"""A jitted function and the (device-resident) arguments to call it with."""

_AXIS = "d"
CLOCKS = ("wall", "cpu")


@dataclass(frozen=True)
class Timing:
    """How a program is timed: ``warmup`` calls (the first compiles), then up
    to ``repeats`` timed calls, fewer (at least ``min_repeats``) once the timed
    calls have taken ``budget`` seconds."""

    warmup: int = 1
    repeats: int = 5
    min_repeats: int = 3
    budget: float = 2.0
    clock: str = "wall"
    """``wall``: elapsed seconds; ``cpu``: the CPU seconds this process spent
    (every thread) over the machine's cores, what a call takes alone on a
    machine it keeps busy: on a machine shared with other work, the wall time
    grows with their load and this much less."""

    def __post_init__(self) -> None:
        if self.warmup < 0 or self.min_repeats < 1 or self.repeats < self.min_repeats:
            raise AlpaError(
                f"Timing: needs warmup >= 0 and repeats >= min_repeats >= 1, got {self}"
            )
        if self.clock not in CLOCKS:
            raise AlpaError(f"Timing: clock must be one of {', '.join(CLOCKS)}, got {self.clock!r}")

    def now(self) -> float:
        """The clock's reading (seconds)."""
        if self.clock == "wall":
            return time.perf_counter()
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return (usage.ru_utime + usage.ru_stime) / (os.cpu_count() or 1)


def time_program(program: Program, timing: Timing) -> float:
    """The median seconds of one call of ``program`` (module docstring)."""
    fn, args = program
    for _ in range(timing.warmup):
        jax.block_until_ready(fn(*args))
    times: list[float] = []
    spent = 0.0
    while len(times) < timing.repeats:
        start = timing.now()
        jax.block_until_ready(fn(*args))
        times.append(max(timing.now() - start, 1e-9))
        spent += times[-1]
        if len(times) >= timing.min_repeats and spent >= timing.budget:
            break
    return median(times)


def _mesh(devices: Sequence[Any], shape: tuple[int, ...], names: tuple[str, ...]) -> Mesh:
    return Mesh(np.array(list(devices), dtype=object).reshape(shape), names)


def _filled(mesh: Mesh, shape: tuple[int, ...], dtype: Any, spec: PartitionSpec) -> jax.Array:
    """An array of ``shape`` laid out by ``spec`` on ``mesh``, made on the devices."""
    sharding = NamedSharding(mesh, spec)
    make = jax.jit(lambda: jnp.full(shape, 0.5, dtype), out_shardings=sharding)
    return make()


def _per_device(mesh: Mesh, fn: Callable[..., Any], nargs: int, spec: PartitionSpec) -> Any:
    return jax.jit(
        jax.shard_map(fn, mesh=mesh, in_specs=(spec,) * nargs, out_specs=spec, check_vma=False)
    )


def gemm_program(devices: Sequence[Any], m: int, n: int, k: int, dtype: str) -> Program:
    """Each device multiplies its own ``m × k`` by ``k × n`` of ``dtype``."""
    count = len(devices)
    mesh = _mesh(devices, (count,), (_AXIS,))
    spec = PartitionSpec(_AXIS)
    a = _filled(mesh, (count * m, k), dtype, spec)
    b = _filled(mesh, (count * k, n), dtype, spec)
    return _per_device(mesh, lambda x, y: x @ y, 2, spec), (a, b)


def stream_program(devices: Sequence[Any], elements: int, dtype: str = "float32") -> Program:
    """Each device computes ``1.5·x + 0.5`` over its own ``elements`` values."""
    count = len(devices)
    mesh = _mesh(devices, (count,), (_AXIS,))
    spec = PartitionSpec(_AXIS)
    x = _filled(mesh, (count * elements,), dtype, spec)
    return _per_device(mesh, lambda v: v * 1.5 + 0.5, 1, spec), (x,)


def transpose_program(
    devices: Sequence[Any], side: int, total: int = 2048 * 2048, dtype: str = "float32"
) -> Program:
    """Each device computes ``0.1·aᵀ + 0.9·b`` over its own ``side × side``
    arrays: one kernel reading ``a`` through a transpose, ``b`` streamed; as
    many arrays (a batch, each transposed alone) as make ``total`` elements,
    so that a small side still takes long enough to time."""
    count = len(devices)
    batch = max(total // (side * side), 1)
    mesh = _mesh(devices, (count,), (_AXIS,))
    spec = PartitionSpec(_AXIS)
    a = _filled(mesh, (count * batch, side, side), dtype, spec)
    b = _filled(mesh, (count * batch, side, side), dtype, spec)

    def body(x: jax.Array, y: jax.Array) -> jax.Array:
        return jnp.swapaxes(x, 1, 2) * 0.1 + y * 0.9

    return _per_device(mesh, body, 2, spec), (a, b)


def transpose_elements(side: int, total: int = 2048 * 2048) -> int:
    """The elements per device :func:`transpose_program` reads transposed."""
    return max(total // (side * side), 1) * side * side


def chain_program(devices: Sequence[Any], kernels: int, size: int = 16) -> Program:
    """Each device runs ``kernels`` dependent ``size × size`` products."""
    count = len(devices)
    mesh = _mesh(devices, (count,), (_AXIS,))
    spec = PartitionSpec(_AXIS)
    x = _filled(mesh, (count * size, size), "float32", spec)
    w = _filled(mesh, (count * size, size), "float32", spec)

    def chain(v: jax.Array, u: jax.Array) -> jax.Array:
        for _ in range(kernels):
            v = v @ u
        return v

    return _per_device(mesh, chain, 2, spec), (x, w)


def trivial_program(devices: Sequence[Any]) -> Program:
    """One element per device plus one: what calling a program costs."""
    return stream_program(devices, 1)


def collective_program(
    devices: Sequence[Any], kind: str, group: int, nbytes: int, dtype: str = "float32"
) -> Program:
    """``kind`` over groups of ``group`` devices (every group at once) of a
    tensor of ``nbytes`` in NCCL's convention: an all-reduce's, reduce-scatter's
    and all-to-all's input per device, an all-gather's output, a send-recv's message."""
    count = len(devices)
    if group < 2 or count % group:
        raise AlpaError(f"collective_program: groups of {group} do not divide {count} devices")
    itemsize = np.dtype(dtype).itemsize
    elements = max(nbytes // itemsize // group, 1) * group  # whole blocks for every member
    mesh = _mesh(devices, (count // group, group), ("rest", "group"))
    spec = PartitionSpec(("rest", "group"))
    per_device = elements // group if kind == "all-gather" else elements
    x = _filled(mesh, (count * per_device,), dtype, spec)
    ring = [(j, (j + 1) % group) for j in range(group)]
    bodies: dict[str, Callable[[jax.Array], jax.Array]] = {
        "all-reduce": lambda v: jax.lax.psum(v, "group"),
        "all-gather": lambda v: jax.lax.all_gather(v, "group", tiled=True),
        "reduce-scatter": lambda v: jax.lax.psum_scatter(v, "group", tiled=True),
        "all-to-all": lambda v: jax.lax.all_to_all(v, "group", 0, 0, tiled=True),
        "send-recv": lambda v: jax.lax.ppermute(v, "group", ring),
    }
    if kind not in bodies:
        raise AlpaError(f"collective_program: unknown collective kind '{kind}'")
    fn = jax.jit(
        jax.shard_map(bodies[kind], mesh=mesh, in_specs=spec, out_specs=spec, check_vma=False)
    )
    return fn, (x,)


def collective_bytes(kind: str, group: int, nbytes: int, dtype: str = "float32") -> int:
    """The ``S`` :func:`collective_program` really moves for ``nbytes`` asked."""
    itemsize = np.dtype(dtype).itemsize
    return max(nbytes // itemsize // group, 1) * group * itemsize


__all__ = [
    "CLOCKS",
    "Program",
    "Timing",
    "chain_program",
    "collective_bytes",
    "collective_program",
    "gemm_program",
    "stream_program",
    "time_program",
    "transpose_elements",
    "transpose_program",
    "trivial_program",
]
