"""A plain MLP: ``num_layers`` dense layers, ReLU between them, MSE or cross-entropy loss."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any, Literal

import flax.linen as nn
import jax
import jax.numpy as jnp

from alpa_ir.models.family import Batch, ModelFamily, Variables, require
from alpa_ir.models.layers import boundary, cross_entropy, mse


@dataclass(frozen=True)
class MLPConfig:
    """``num_layers`` dense layers: ``input_dim -> hidden_size -> ... -> output_dim``.

    ``loss="mse"`` regresses float targets ``y[B, output_dim]``;
    ``loss="xent"`` classifies into ``output_dim`` classes, ``y[B]`` integer.
    """

    input_dim: int
    hidden_size: int
    num_layers: int
    output_dim: int
    batch_size: int
    loss: Literal["mse", "xent"] = "mse"
    num_gpus: int = 1
    dtype: Any = jnp.float32
    pipeline_markers: bool = False

    def __post_init__(self) -> None:
        require(self.num_layers >= 1, f"MLPConfig: num_layers must be >= 1, got {self.num_layers}")
        require(
            self.loss in ("mse", "xent"),
            f"MLPConfig: loss must be 'mse' or 'xent', got {self.loss!r}",
        )

    def layer_dims(self) -> list[tuple[int, int]]:
        """(in, out) features of every dense layer, first to last."""
        sizes = [self.input_dim] + [self.hidden_size] * (self.num_layers - 1) + [self.output_dim]
        return list(itertools.pairwise(sizes))


class MLP(nn.Module):
    config: MLPConfig

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        cfg = self.config
        for i, (_, features) in enumerate(cfg.layer_dims()):
            x = boundary(x, i, cfg.pipeline_markers)
            x = nn.Dense(features, dtype=cfg.dtype, name=f"dense_{i}")(x)
            if i < cfg.num_layers - 1:
                x = nn.relu(x)
        return x


def _init(config: MLPConfig, key: jax.Array, batch: Batch) -> Variables:
    return dict(MLP(config).init(key, batch["x"]))


def _loss(config: MLPConfig, variables: Variables, batch: Batch) -> tuple[jax.Array, Variables]:
    out = MLP(config).apply(variables, batch["x"])
    if config.loss == "mse":
        return mse(out, batch["y"]), {}
    return cross_entropy(out, batch["y"]), {}


def _make_batch(config: MLPConfig, key: jax.Array) -> Batch:
    kx, ky = jax.random.split(key)
    x = jax.random.normal(kx, (config.batch_size, config.input_dim), config.dtype)
    if config.loss == "mse":
        y = jax.random.normal(ky, (config.batch_size, config.output_dim), config.dtype)
    else:
        y = jax.random.randint(ky, (config.batch_size,), 0, config.output_dim, jnp.int32)
    return {"x": x, "y": y}


def _flops(config: MLPConfig) -> float:
    """2·B·in·out per layer forward; backward doubles it (input and weight gradients),
    except for the first layer, whose input is data and gets no gradient."""
    total = 0.0
    for i, (fan_in, fan_out) in enumerate(config.layer_dims()):
        fwd = 2.0 * config.batch_size * fan_in * fan_out
        total += fwd * (2 if i == 0 else 3)
    return total


FAMILY = ModelFamily(
    name="mlp",
    config_type=MLPConfig,
    init=_init,
    loss=_loss,
    make_batch=_make_batch,
    flops=_flops,
)
