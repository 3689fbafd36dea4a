"""The memory budget of the local devices: how many bytes each device may hold,
the figure the ``local-cpu`` preset plans with and that a plan on the local
devices is checked against before anything compiles.

Where the figure comes from, first match wins:

1. **Given by hand**: a method's ``device_memory`` field, else the environment
   variable ``ALPA_DEVICE_MEMORY`` (:data:`MEMORY_ENV`), in bytes or with a unit
   (``6GiB``, ``512MiB``, ``8GB``; :func:`parse_memory_size`). A negative,
   zero, infinite, NaN or non-numeric figure is a one-line :class:`AlpaError`
   naming the option and the value.
2. **Shared host memory** (CPU devices): JAX's CPU devices are slices of one
   host's memory, so they share what the host has left. The budget is the
   host's *available* memory (Linux: ``MemAvailable`` of ``/proc/meminfo``,
   which counts reclaimable page cache and already leaves out what every
   running process holds, this one included: the arrays the user has built
   and the compiler itself are not counted twice; elsewhere
   ``os.sysconf``'s available pages) less :data:`HOST_MEMORY_MARGIN` (10 %)
   kept for the runtime, Python and XLA's compiles, divided by the number of
   devices that share it (:func:`shared_host_memory_budget`). The figure is
   read when a plan is made: memory taken later (another program, another
   step's buffers) is not foreseen. Dividing evenly is exact for one SPMD
   program (every device holds as much) and conservative for pipeline stages
   of unequal needs.
3. **A device with its own memory** (a GPU): the per-device limit JAX reports
   (``device.memory_stats()["bytes_limit"]``), else a nominal
   :data:`NOMINAL_DEVICE_MEMORY`. Plans on such devices are not checked before
   compiling (XLA reports its own out-of-memory errors there) unless the
   budget is given by hand.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from alpa_ir.errors import AlpaError

GiB = 1024**3
MEMORY_ENV = "ALPA_DEVICE_MEMORY"
"""Environment variable: the bytes per local device, given by hand."""
HOST_MEMORY_MARGIN = 0.10
"""Share of the host's available memory kept for the runtime, Python and XLA."""
NOMINAL_DEVICE_MEMORY = 4 * GiB
"""Per device, where neither the host nor the device says more."""

_UNITS: Mapping[str, int] = {
    "": 1,
    "b": 1,
    "kb": 1000,
    "mb": 1000**2,
    "gb": 1000**3,
    "tb": 1000**4,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
    "tib": 1024**4,
}
_SIZE = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)(?:[eE]([+-]?\d+))?\s*([A-Za-z]*)\s*")
_MEMINFO_AVAILABLE = re.compile(r"^MemAvailable:\s+(\d+)\s*kB\s*$", re.MULTILINE)

MeminfoReader = Callable[[], str | None]
"""Returns the text of ``/proc/meminfo`` (None where there is none)."""
SysconfReader = Callable[[], float | None]
"""Returns the host's available bytes by ``os.sysconf`` (None where unknown)."""


@dataclass(frozen=True)
class MemoryBudget:
    """Bytes each device may hold, and where that figure comes from.
    ``enforced``: plans on the local devices are checked against it before
    they compile (shared host memory, or a figure given by hand)."""

    per_device: float
    source: str
    enforced: bool = True

    def text(self) -> str:
        """``'2.5 GiB per device (source)'``, for messages."""
        return f"{format_gib(self.per_device)} per device ({self.source})"


def format_gib(nbytes: float) -> str:
    """Bytes as GiB with three significant digits; below a thousandth of a GiB
    with six decimals and the KiB beside (``0.000977 GiB (1024 KiB)``)."""
    value = nbytes / GiB
    if value >= 1e-3:
        return f"{value:.3g} GiB"
    return f"{value:.6f} GiB ({nbytes / 1024:.4g} KiB)"


def _size_error(option: str, value: object) -> AlpaError:
    return AlpaError(
        f"{option} must be a positive number of bytes or a size such as '6GiB', '512MiB' "
        f"or '8GB', got {value!r}"
    )


def parse_memory_size(value: object, option: str) -> float:
    """Bytes from ``value``: a positive number (bytes) or a string such as
    ``'6442450944'``, ``'6GiB'``, ``'6 GiB'``, ``'1.5e9'``, ``'512MiB'``,
    ``'8GB'`` (units B, KB..TB decimal, KiB..TiB binary, any case). Anything
    else is an :class:`AlpaError` naming ``option`` and the value."""
    if isinstance(value, bool):
        raise _size_error(option, value)
    if isinstance(value, int | float):
        nbytes = float(value)
    elif isinstance(value, str):
        nbytes = _parse_size_text(value, option)
    else:
        raise _size_error(option, value)
    if not (math.isfinite(nbytes) and nbytes > 0):
        raise _size_error(option, value)
    return nbytes


def _parse_size_text(text: str, option: str) -> float:
    match = _SIZE.fullmatch(text)
    if match is None or match.group(3).lower() not in _UNITS:
        raise _size_error(option, text)
    number, exponent, unit = match.groups()
    return float(f"{number}e{exponent or 0}") * _UNITS[unit.lower()]


def check_memory_option(value: object, option: str) -> None:
    """Raise the one-line :class:`AlpaError` of :func:`parse_memory_size` unless
    ``value`` is None (not given) or a valid size."""
    if value is not None:
        parse_memory_size(value, option)


def read_meminfo() -> str | None:
    """The text of ``/proc/meminfo``; None where it cannot be read."""
    try:
        with open("/proc/meminfo", encoding="ascii", errors="replace") as f:
            return f.read()
    except OSError:
        return None


def meminfo_available(text: str | None) -> float | None:
    """``MemAvailable`` of a ``/proc/meminfo`` text, in bytes (None if absent)."""
    match = _MEMINFO_AVAILABLE.search(text or "")
    return float(match.group(1)) * 1024 if match else None


def sysconf_available() -> float | None:
    """Available physical pages × page size (``os.sysconf``); None where unknown."""
    try:
        pages = os.sysconf("SC_AVPHYS_PAGES")
        size = os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, OSError, ValueError):
        return None
    return float(pages * size) if pages > 0 and size > 0 else None


def host_available_memory(
    meminfo: MeminfoReader = read_meminfo, sysconf: SysconfReader = sysconf_available
) -> tuple[float, str] | None:
    """The host's available bytes and how they were read (``MemAvailable``,
    else ``os.sysconf``); None where neither says."""
    available = meminfo_available(meminfo())
    if available is not None and available > 0:
        return available, "MemAvailable"
    available = sysconf()
    if available is not None and available > 0:
        return available, "sysconf"
    return None


def shared_host_memory_budget(
    num_devices: int,
    *,
    margin: float = HOST_MEMORY_MARGIN,
    meminfo: MeminfoReader = read_meminfo,
    sysconf: SysconfReader = sysconf_available,
) -> MemoryBudget:
    """The budget of ``num_devices`` devices that share one host's memory:
    ``available × (1 − margin) / num_devices`` (module docstring). Where the
    host says nothing, the nominal figure, not enforced."""
    if num_devices < 1:
        raise AlpaError(
            f"shared host memory: the number of devices must be >= 1, got {num_devices}"
        )
    host = host_available_memory(meminfo, sysconf)
    if host is None:
        return MemoryBudget(NOMINAL_DEVICE_MEMORY, "nominal: the host's memory is unknown", False)
    available, how = host
    per_device = available * (1.0 - margin) / num_devices
    source = (
        f"shared host memory: {format_gib(available)} available ({how}) less "
        f"{margin:.0%} over {num_devices} devices"
    )
    return MemoryBudget(per_device, source)


def given_memory_budget(
    given: object = None, environ: Mapping[str, str] | None = None
) -> MemoryBudget | None:
    """The budget given by hand: ``given`` (a method's ``device_memory``), else
    ``ALPA_DEVICE_MEMORY``; None when neither is set."""
    if given is not None:
        return MemoryBudget(
            parse_memory_size(given, "device_memory"), f"device_memory={given!r} given by hand"
        )
    text = (os.environ if environ is None else environ).get(MEMORY_ENV)
    if text is None or not text.strip():
        return None
    return MemoryBudget(parse_memory_size(text, MEMORY_ENV), f"{MEMORY_ENV}={text.strip()}")


def device_reported_memory(devices: Sequence[Any]) -> float | None:
    """The smallest ``bytes_limit`` the devices report (None if any reports none)."""
    limits = []
    for device in devices:
        stats = device.memory_stats() if hasattr(device, "memory_stats") else None
        limit = (stats or {}).get("bytes_limit")
        if not limit:
            return None
        limits.append(float(limit))
    return min(limits) if limits else None


def local_device_budget(
    num_devices: int | None = None,
    *,
    given: object = None,
    devices: Sequence[Any] | None = None,
    environ: Mapping[str, str] | None = None,
    meminfo: MeminfoReader = read_meminfo,
) -> MemoryBudget:
    """The budget per device of a plan on ``num_devices`` of the local JAX
    ``devices`` (default: all of them): given by hand, else the shared host
    memory for CPU devices, else the devices' own (module docstring)."""
    by_hand = given_memory_budget(given, environ)
    if by_hand is not None:
        return by_hand
    if devices is None:
        import jax

        devices = jax.local_devices()
    if all(d.platform == "cpu" for d in devices):
        return shared_host_memory_budget(num_devices or len(devices), meminfo=meminfo)
    reported = device_reported_memory(devices)
    if reported is not None:
        return MemoryBudget(reported, "the device's bytes_limit", False)
    return MemoryBudget(NOMINAL_DEVICE_MEMORY, "nominal", False)


__all__ = [
    "HOST_MEMORY_MARGIN",
    "MEMORY_ENV",
    "NOMINAL_DEVICE_MEMORY",
    "MemoryBudget",
    "check_memory_option",
    "device_reported_memory",
    "format_gib",
    "given_memory_budget",
    "host_available_memory",
    "local_device_budget",
    "meminfo_available",
    "parse_memory_size",
    "read_meminfo",
    "shared_host_memory_budget",
    "sysconf_available",
]
