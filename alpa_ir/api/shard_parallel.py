"""The parallel methods of one mesh: ``ShardParallel`` (the ILP's plan) and
the data-parallel family and ``ManualShardParallel`` built on it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from alpa_ir.api.manual_sharding import (
    ManualShardingOption,
)
from alpa_ir.api.sharding_options import AutoShardingOption, data_parallel_option, heuristic_option
from alpa_ir.errors import AlpaError
from alpa_ir.hardware.device_mesh import Devices
from alpa_ir.hardware.memory_budget import check_memory_option


@dataclass
class ShardParallel:
    """Intra-operator parallelism planned by the ILP on one logical mesh.
    Mutable, as Alpa's (``method.devices = mesh`` before ``parallelize``); read
    when the step is compiled."""

    devices: Devices = None
    num_micro_batches: int | None = None
    auto_sharding_option: AutoShardingOption = field(default_factory=AutoShardingOption)
    manual_sharding_option: ManualShardingOption | None = None
    """Specs of the inputs and outputs given by hand (kept by the ILP; only
    propagated with ``AutoShardingOption(enable_auto_sharding=False)``)."""
    backend: Literal["xla", "ray"] | None = None
    """``xla``: the step runs in this process on the local devices; ``ray``: one
    Ray actor per host, the mesh may span hosts (after ``alpa_ir.init(cluster="ray")``);
    None: ``ray`` while connected to Ray by ``alpa_ir.init(cluster="ray")``, else
    ``xla`` (Alpa's switch)."""
    device_memory: float | str | None = None
    """Bytes each device may hold (a number, or a size such as ``"6GiB"``); None:
    ``ALPA_DEVICE_MEMORY``, else what the local devices have
    (:mod:`alpa_ir.hardware.memory_budget`). A plan that needs more is refused
    before it compiles."""

    def __post_init__(self) -> None:
        if self.backend not in ("xla", "ray", None):
            raise AlpaError(f"backend must be 'xla' or 'ray', got {self.backend!r}")
        check_memory_option(self.device_memory, "ShardParallel(device_memory=...)")

    @property
    def as_option(self) -> AutoShardingOption:
        """Alpa's name of :attr:`auto_sharding_option`."""
        return self.auto_sharding_option

    @as_option.setter
    def as_option(self, option: AutoShardingOption) -> None:
        self.auto_sharding_option = option


def DataParallel(devices: Devices = None, num_micro_batches: int | None = None) -> ShardParallel:
    """Batch split over every mesh axis, parameters replicated, gradients all-reduced."""
    return ShardParallel(
        devices,
        num_micro_batches,
        data_parallel_option(reduce_scatter="none"),
    )


def Zero2Parallel(devices: Devices = None, num_micro_batches: int | None = None) -> ShardParallel:
    """Data parallel with gradients reduce-scattered and optimizer state sharded (ZeRO-2)."""
    return ShardParallel(
        devices,
        num_micro_batches,
        data_parallel_option(reduce_scatter="zero2"),
    )


def Zero3Parallel(devices: Devices = None, num_micro_batches: int | None = None) -> ShardParallel:
    """ZeRO-2 plus sharded parameters, all-gathered where used (ZeRO-3)."""
    return ShardParallel(
        devices,
        num_micro_batches,
        data_parallel_option(reduce_scatter="zero3"),
    )


def HeuristicParallel(
    devices: Devices = None, num_micro_batches: int | None = None
) -> ShardParallel:
    """Alpa's "Heuristic" baseline: the largest dimension of every input split,
    the rest planned to match (the ILP plays GSPMD's propagation)."""
    return ShardParallel(
        devices,
        num_micro_batches,
        heuristic_option(),
    )


@dataclass(frozen=True)
class ManualShardParallel:
    """A user's own plan: ``in_specs`` is a pytree like the arguments whose
    leaves are ``jax.sharding.PartitionSpec`` (mesh axis names of ``devices``)
    or None (left to the planner). Megatron-style plans are written this way."""

    in_specs: Any
    devices: Devices = None
    num_micro_batches: int | None = None
    auto_sharding_option: AutoShardingOption = field(
        default_factory=lambda: AutoShardingOption(reduce_scatter="none")
    )
    device_memory: float | str | None = None
    """Bytes each device may hold (see :attr:`ShardParallel.device_memory`)."""

    def __post_init__(self) -> None:
        check_memory_option(self.device_memory, "ManualShardParallel(device_memory=...)")


Method = ShardParallel | ManualShardParallel
