"""The parallelism space real pre-training runs use, as one manual plan.

A :class:`ParallelConfig` names what Megatron-LM and Llama 3 configure by
hand: tensor parallelism inside a node (``tensor``), pipeline stages
(``pipeline``) with ``virtual_stages`` interleaved chunks per stage (the
interleaved 1F1B schedule), data parallelism (``data``) with ZeRO stage 0-3,
context parallelism (``context``: the sequence split, K/V gathered where
attention needs them), full or no recomputation, and the micro-batch size
and count. :func:`alpa_ir.api.three_d.get_3d_parallel_method` builds the
method that runs it; ``alpa-bench``'s ``published`` rows simulate it.

What runs: devices are ordered ``pipeline × data × context × tensor`` (the
tensor axis innermost: consecutive devices, one node); each stage's mesh is
``(data, tensor)``, or ``(data, context, tensor)`` with context parallelism,
whose batch arguments are split ``[data, context]`` (batch, then sequence).
ZeRO-2 and -3 are the ``reduce-scatter-rewrite`` modes of the same names;
ZeRO-1 runs ZeRO-2's program (the gradient is reduce-scattered once, after
the micro-batches are accumulated) and differs only in memory, where the
accumulated gradient is kept whole. Selective recomputation (attention
only) is not implemented: the frontend inlines ``jax.checkpoint``, and only
whole layers are recomputed (``recompute="full"``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from alpa_ir.errors import AlpaError

Recompute = Literal["none", "full"]
RECOMPUTE = ("none", "full")


@dataclass(frozen=True)
class ParallelConfig:
    """Degrees and options of a manual plan (module docstring)."""

    tensor: int = 1
    pipeline: int = 1
    data: int = 1
    context: int = 1
    virtual_stages: int = 1
    zero_stage: int = 0
    recompute: Recompute = "none"
    micro_batch_size: int | None = None
    """Sequences per data-parallel replica in one micro-batch (None: from the count)."""
    num_micro_batches: int | None = None
    """Micro-batches per step (None: from the size; both None: 1)."""

    def __post_init__(self) -> None:
        for name in ("tensor", "pipeline", "data", "context", "virtual_stages"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise AlpaError(f"ParallelConfig: {name} must be a positive integer, got {value!r}")
        for name in ("micro_batch_size", "num_micro_batches"):
            value = getattr(self, name)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or value < 1
            ):
                raise AlpaError(
                    f"ParallelConfig: {name} must be a positive integer or None, got {value!r}"
                )
        if self.zero_stage not in (0, 1, 2, 3) or isinstance(self.zero_stage, bool):
            raise AlpaError(
                f"ParallelConfig: zero_stage must be 0, 1, 2 or 3, got {self.zero_stage!r}"
            )
        if self.recompute not in RECOMPUTE:
            hint = (
                " (selective recomputation is not implemented: only whole layers are recomputed)"
                if self.recompute == "selective"
                else ""
            )
            raise AlpaError(
                f"ParallelConfig: recompute must be one of {', '.join(RECOMPUTE)}, "
                f"got {self.recompute!r}{hint}"
            )
        if self.virtual_stages > 1 and self.pipeline == 1:
            raise AlpaError(
                f"ParallelConfig: virtual_stages={self.virtual_stages} needs pipeline stages, "
                "got pipeline=1"
            )

    @property
    def num_devices(self) -> int:
        return self.tensor * self.pipeline * self.data * self.context

    @property
    def stage_mesh_shape(self) -> tuple[int, ...]:
        """A stage's logical mesh: ``(data, tensor)``, or ``(data, context, tensor)``."""
        if self.context > 1:
            return (self.data, self.context, self.tensor)
        return (self.data, self.tensor)

    @property
    def num_chunks(self) -> int:
        """Layer chunks of the whole pipeline: ``pipeline × virtual_stages``."""
        return self.pipeline * self.virtual_stages

    @property
    def schedule(self) -> str:
        return "interleaved-1f1b" if self.virtual_stages > 1 else "1f1b"

    @property
    def reduce_scatter(self) -> Literal["none", "zero2", "zero3"]:
        """The ``reduce-scatter-rewrite`` mode of the ZeRO stage (module docstring)."""
        return ("none", "zero2", "zero2", "zero3")[self.zero_stage]  # type: ignore[return-value]

    def micro_batches(self, global_batch: int) -> int:
        """Micro-batches per step of ``global_batch`` sequences; one-line error if
        the size, the count and the data-parallel degree disagree with it."""
        replicas = self.data
        if global_batch % replicas:
            raise AlpaError(
                f"ParallelConfig: global batch {global_batch} does not split over "
                f"data={replicas} replicas"
            )
        per_replica = global_batch // replicas
        size, count = self.micro_batch_size, self.num_micro_batches
        if size is None and count is None:
            return 1
        if size is not None and per_replica % size:
            raise AlpaError(
                f"ParallelConfig: micro_batch_size {size} does not divide the "
                f"{per_replica} sequences of each replica (global batch {global_batch} / data "
                f"{replicas})"
            )
        derived = per_replica // size if size is not None else count
        assert derived is not None
        if count is not None and count != derived:
            raise AlpaError(
                f"ParallelConfig: num_micro_batches {count} x micro_batch_size {size} x data "
                f"{replicas} is not the global batch {global_batch}"
            )
        if global_batch % derived:
            raise AlpaError(
                f"ParallelConfig: {derived} micro-batches do not divide the global batch "
                f"{global_batch}"
            )
        return derived

    def check_cluster(self, num_devices: int, devices_per_node: int, where: str = "") -> None:
        """The plan must use every device and keep tensor parallelism in a node."""
        at = f"{where}: " if where else ""
        if self.num_devices != num_devices:
            raise AlpaError(
                f"{at}tensor x context x pipeline x data = {self.tensor} x {self.context} x "
                f"{self.pipeline} x {self.data} = {self.num_devices}, but there are "
                f"{num_devices} devices"
            )
        if devices_per_node % self.tensor:
            raise AlpaError(
                f"{at}tensor parallelism {self.tensor} does not stay within a node of "
                f"{devices_per_node} devices"
            )

    def describe(self) -> str:
        parts = [f"TP{self.tensor}"]
        if self.context > 1:
            parts.append(f"CP{self.context}")
        parts.append(f"PP{self.pipeline}")
        if self.virtual_stages > 1:
            parts[-1] += f"x{self.virtual_stages}v"
        parts.append(f"DP{self.data}")
        text = "·".join(parts)
        if self.zero_stage:
            text += f" ZeRO-{self.zero_stage}"
        if self.recompute != "none":
            text += f" {self.recompute} recompute"
        return text


def chunk_layers(num_layers: int, num_chunks: int) -> list[tuple[int, int]]:
    """``num_layers`` layers cut into ``num_chunks`` consecutive chunks of as equal
    sizes as possible, ``(first, last)`` each."""
    if num_chunks > num_layers:
        raise AlpaError(
            f"ParallelConfig: {num_chunks} pipeline chunks need at least {num_chunks} layers, "
            f"the step has {num_layers}"
        )
    bounds = [round(k * num_layers / num_chunks) for k in range(num_chunks + 1)]
    return [(bounds[k], bounds[k + 1] - 1) for k in range(num_chunks)]


def interleaved_mesh_of(pipeline: int, virtual_stages: int) -> list[int]:
    """Megatron's interleaved placement: chunk ``c`` on stage mesh ``c mod pipeline``."""
    return [c % pipeline for c in range(pipeline * virtual_stages)]


__all__ = ["ParallelConfig", "chunk_layers", "interleaved_mesh_of"]
