"""Wide-ResNet with bottleneck blocks, as benchmarked by Alpa (§8.1, Appendix B).

Alpa's variant widens only the 3×3 convolution: a block with ``f`` filters is
1×1 conv to f, 3×3 conv to f·width_factor (strided in the first block of a
stage), 1×1 conv to 4f, plus a 1×1 projection shortcut when the shape changes.
This reproduces the paper's parameter counts (250M for 50 layers, base 160,
width 2); widening both inner convolutions (torchvision's wide_resnet) would
give 423M. Batch norm runs in training mode and its statistics are state.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from alpa_ir.models.family import Batch, ModelFamily, Variables, require
from alpa_ir.models.layers import boundary, cross_entropy

RESNET_STAGES: Mapping[int, tuple[int, ...]] = MappingProxyType(
    {50: (3, 4, 6, 3), 101: (3, 4, 23, 3), 152: (3, 8, 36, 3)}
)
"""Bottleneck blocks per stage of the standard ResNet depths."""


@dataclass(frozen=True)
class WResNetConfig:
    """A Wide-ResNet on NHWC images; stage ``i`` has ``base_channels·2^i`` filters."""

    image_size: int
    num_classes: int
    stage_sizes: tuple[int, ...]
    base_channels: int
    width_factor: int
    batch_size: int
    num_gpus: int = 1
    dtype: Any = jnp.float32
    pipeline_markers: bool = False

    def __post_init__(self) -> None:
        require(len(self.stage_sizes) >= 1, "WResNetConfig: stage_sizes is empty")
        require(
            all(n >= 1 for n in self.stage_sizes),
            f"WResNetConfig: bad stage_sizes {self.stage_sizes}",
        )

    @property
    def num_layers(self) -> int:
        """Weighted layers: three convolutions per block, the stem and the classifier."""
        return 3 * sum(self.stage_sizes) + 2


def _batch_norm(dtype: Any, name: str, zero_scale: bool = False) -> nn.BatchNorm:
    return nn.BatchNorm(
        use_running_average=False,
        momentum=0.9,
        epsilon=1e-5,
        dtype=dtype,
        scale_init=nn.initializers.zeros if zero_scale else nn.initializers.ones,
        name=name,
    )


class Bottleneck(nn.Module):
    filters: int
    width_factor: int
    strides: int
    dtype: Any

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        conv = {"use_bias": False, "dtype": self.dtype}
        s = (self.strides, self.strides)
        y = nn.Conv(self.filters, (1, 1), name="conv1", **conv)(x)
        y = nn.relu(_batch_norm(self.dtype, "bn1")(y))
        y = nn.Conv(self.filters * self.width_factor, (3, 3), s, name="conv2", **conv)(y)
        y = nn.relu(_batch_norm(self.dtype, "bn2")(y))
        y = nn.Conv(4 * self.filters, (1, 1), name="conv3", **conv)(y)
        y = _batch_norm(self.dtype, "bn3", zero_scale=True)(y)
        residual = x
        if residual.shape != y.shape:
            residual = nn.Conv(4 * self.filters, (1, 1), s, name="conv_proj", **conv)(x)
            residual = _batch_norm(self.dtype, "bn_proj")(residual)
        return nn.relu(residual + y)


class WideResNet(nn.Module):
    config: WResNetConfig

    @nn.compact
    def __call__(self, images: jax.Array) -> jax.Array:
        cfg = self.config
        x = nn.Conv(
            cfg.base_channels,
            (7, 7),
            (2, 2),
            padding=[(3, 3), (3, 3)],
            use_bias=False,
            dtype=cfg.dtype,
            name="conv_stem",
        )(images)
        x = nn.relu(_batch_norm(cfg.dtype, "bn_stem")(x))
        x = nn.max_pool(x, (3, 3), strides=(2, 2), padding="SAME")
        for i, blocks in enumerate(cfg.stage_sizes):
            x = boundary(x, i, cfg.pipeline_markers)
            for j in range(blocks):
                strides = 2 if i > 0 and j == 0 else 1
                x = Bottleneck(
                    cfg.base_channels * 2**i,
                    cfg.width_factor,
                    strides,
                    cfg.dtype,
                    name=f"stage{i}_block{j}",
                )(x)
        x = jnp.mean(x, axis=(1, 2))
        return nn.Dense(cfg.num_classes, dtype=cfg.dtype, name="head")(x)


def _init(config: WResNetConfig, key: jax.Array, batch: Batch) -> Variables:
    return dict(WideResNet(config).init(key, batch["images"]))


def _loss(config: WResNetConfig, variables: Variables, batch: Batch) -> tuple[jax.Array, Variables]:
    logits, updates = WideResNet(config).apply(variables, batch["images"], mutable=["batch_stats"])
    return cross_entropy(logits, batch["labels"]), dict(updates)


def _make_batch(config: WResNetConfig, key: jax.Array) -> Batch:
    ki, kl = jax.random.split(key)
    shape = (config.batch_size, config.image_size, config.image_size, 3)
    images = jax.random.normal(ki, shape, config.dtype)
    labels = jax.random.randint(kl, (config.batch_size,), 0, config.num_classes, jnp.int32)
    return {"images": images, "labels": labels}


def forward_flops(config: WResNetConfig) -> tuple[float, float]:
    """(stem convolution, everything else) forward FLOPs: 2·B·H'·W'·k²·C_in·C_out per
    convolution (SAME padding, H' = ceil(H/stride)), 2·B·C·classes for the classifier."""
    b = config.batch_size
    size = (config.image_size + 6 - 7) // 2 + 1
    stem = 2.0 * b * size * size * 49 * 3 * config.base_channels
    size = math.ceil(size / 2)
    rest, cin = 0.0, config.base_channels
    for i, blocks in enumerate(config.stage_sizes):
        f = config.base_channels * 2**i
        wide = f * config.width_factor
        for j in range(blocks):
            stride = 2 if i > 0 and j == 0 else 1
            out = math.ceil(size / stride)
            rest += 2.0 * b * size * size * cin * f
            rest += 2.0 * b * out * out * 9 * f * wide
            rest += 2.0 * b * out * out * wide * 4 * f
            if cin != 4 * f or stride != 1:
                rest += 2.0 * b * out * out * cin * 4 * f
            size, cin = out, 4 * f
    rest += 2.0 * b * cin * config.num_classes
    return stem, rest


def _flops(config: WResNetConfig) -> float:
    """Convolution and dense FLOPs of one step: three times the forward (input and
    weight gradients), except the stem, whose input is the image (weight gradient only).
    Batch norm, pooling and ReLU are not counted."""
    stem, rest = forward_flops(config)
    return 2.0 * stem + 3.0 * rest


FAMILY = ModelFamily(
    name="wresnet",
    config_type=WResNetConfig,
    init=_init,
    loss=_loss,
    make_batch=_make_batch,
    flops=_flops,
)
