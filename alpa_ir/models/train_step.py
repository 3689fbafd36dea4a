"""Train-step factories: ``train_step(state, batch) -> (new_state, loss)`` plus example args.

The step is a plain (un-jitted) function, the input the compiler parallelizes.
Gradients go through :func:`alpa_ir.frontend.markers.value_and_grad`, so the jaxpr
marks where forward/backward ends and the optimizer update begins.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, Literal

import jax
import optax

from alpa_ir.errors import AlpaError
from alpa_ir.frontend.markers import value_and_grad
from alpa_ir.models.family import Batch, ModelFamily
from alpa_ir.models.registry import family_of, is_tiny_config, resolve_config

State = dict[str, Any]
TrainStep = Callable[[State, Batch], tuple[State, jax.Array]]

DEFAULT_LEARNING_RATES: Mapping[str, float] = MappingProxyType(
    {"adam": 1e-3, "sgd": 1e-2, "sgd-momentum": 1e-2, "adafactor": 1e-2}
)


# Adam's epsilon for the tiny test models. With optax's 1e-8, a parameter whose
# gradient is at float round-off level (~1e-8 here) gets an update of about
# lr * g / (|g| + eps), i.e. round-off noise becomes an lr-sized step; a parallel
# plan that only reorders a sum then differs from one device by ~lr. 1e-5 keeps
# such parameters' updates at noise level, so the single-device oracle compares
# what the plan computes, not which way round-off fell.
TINY_ADAM_EPS = 1e-5
DEFAULT_ADAM_EPS = 1e-8


def make_optimizer(
    optimizer: str, learning_rate: float | None = None, adam_eps: float = DEFAULT_ADAM_EPS
) -> optax.GradientTransformation:
    """``adam``, ``sgd``, ``sgd-momentum`` (Nesterov, momentum 0.9: one state
    per parameter, what Alpa's Wide-ResNet benchmark trains with) or
    ``adafactor`` (factored second moments, what Alpa's MoE benchmark trains
    with) with a constant learning rate (default :data:`DEFAULT_LEARNING_RATES`)."""
    if optimizer not in DEFAULT_LEARNING_RATES:
        raise AlpaError(
            f"unknown optimizer {optimizer!r}; known: {', '.join(DEFAULT_LEARNING_RATES)}"
        )
    lr = DEFAULT_LEARNING_RATES[optimizer] if learning_rate is None else learning_rate
    if optimizer == "adam":
        return optax.adam(lr, eps=adam_eps)
    if optimizer == "adafactor":
        return optax.adafactor(lr)
    if optimizer == "sgd-momentum":
        return optax.sgd(lr, momentum=0.9, nesterov=True)
    return optax.sgd(lr)


def make_train_step(
    config_or_name: Any,
    *,
    optimizer: Literal["adam", "sgd", "sgd-momentum", "adafactor"] = "adam",
    abstract: bool = False,
    seed: int = 0,
    learning_rate: float | None = None,
    adam_eps: float | None = None,
) -> tuple[TrainStep, tuple[State, Batch]]:
    """Return ``(train_step, (state, batch))`` for a config or a registered name.

    ``state`` is ``{"params", "opt_state"}`` plus any mutable Flax collection
    the model keeps (``"batch_stats"`` for Wide-ResNet). With ``abstract=True``
    every leaf of the example args is a ``jax.ShapeDtypeStruct`` obtained by
    ``jax.eval_shape`` (nothing is allocated, so paper-size steps can be
    traced); otherwise they are real arrays drawn deterministically from ``seed``.
    """
    config = resolve_config(config_or_name)
    family = family_of(config)
    if adam_eps is None:
        adam_eps = TINY_ADAM_EPS if is_tiny_config(config) else DEFAULT_ADAM_EPS
    tx = make_optimizer(optimizer, learning_rate, adam_eps)

    def train_step(state: State, batch: Batch) -> tuple[State, jax.Array]:
        params = state["params"]
        collections = {name: v for name, v in state.items() if name not in ("params", "opt_state")}

        def loss_fn(p: Any) -> tuple[jax.Array, dict[str, Any]]:
            return family.loss(config, {"params": p, **collections}, batch)

        (loss, updated), grads = value_and_grad(loss_fn, has_aux=True)(params)
        updates, opt_state = tx.update(grads, state["opt_state"], params)
        new_state: State = {
            "params": optax.apply_updates(params, updates),
            "opt_state": opt_state,
            **collections,
            **updated,
        }
        return new_state, loss

    init = functools.partial(_init_example_args, family, config, optimizer, learning_rate, adam_eps)
    key = _seed_key(seed)
    example_args = (
        jax.eval_shape(init, key)
        if abstract
        else _compiled_initialiser(jax.default_backend())(*init.args, key)
    )
    return train_step, example_args


def _seed_key(seed: int) -> jax.Array:
    """A key of the ``rbg`` generator: XLA's RngBitGenerator compiles several times
    faster on CPU than threefry, and the init of a tiny model is mostly random bits."""
    return jax.random.key(seed, impl="rbg")


def _init_example_args(
    family: ModelFamily,
    config: Any,
    optimizer: str,
    learning_rate: float | None,
    adam_eps: float,
    key: jax.Array,
) -> tuple[State, Batch]:
    """Draw the batch and initialise params, optimizer state and other collections."""
    init_key, batch_key = jax.random.split(key)
    batch = family.make_batch(config, batch_key)
    variables = family.init(config, init_key, batch)
    params = variables["params"]
    state: State = {
        "params": params,
        "opt_state": make_optimizer(optimizer, learning_rate, adam_eps).init(params),
    }
    state.update({name: value for name, value in variables.items() if name != "params"})
    return state, batch


@functools.cache
def _compiled_initialiser(backend: str) -> Callable[..., tuple[State, Batch]]:
    """The jitted initialiser. Static arguments are hashable (frozen configs and
    families), so repeated calls for one model reuse one executable. On CPU the
    LLVM backend runs at -O0: initialisation is random-bit generation executed
    once, and this cuts its compile time by about 3x for the tiny test models."""
    options = {"xla_backend_optimization_level": 0} if backend == "cpu" else None
    return jax.jit(_init_example_args, static_argnums=(0, 1, 2, 3), compiler_options=options)


def param_count(config_or_name: Any) -> int:
    """Number of trainable parameters, from shapes only (``jax.eval_shape``, no allocation)."""
    config = resolve_config(config_or_name)
    family = family_of(config)

    def init_params(key: jax.Array) -> Any:
        init_key, batch_key = jax.random.split(key)
        return family.init(config, init_key, family.make_batch(config, batch_key))["params"]

    shapes = jax.eval_shape(init_params, _seed_key(0))
    return sum(int(leaf.size) for leaf in jax.tree.leaves(shapes))


def train_step_flops(config_or_name: Any) -> float:
    """Analytic FLOPs of one training step (matmuls and convolutions, 2 per
    multiply-add, no recomputation); each family's docstring gives its formula."""
    config = resolve_config(config_or_name)
    return float(family_of(config).flops(config))


def mlp_tiny_step() -> tuple[TrainStep, tuple[State, Batch]]:
    return make_train_step("mlp-tiny")


def gpt_tiny_step() -> tuple[TrainStep, tuple[State, Batch]]:
    return make_train_step("gpt-tiny")


def moe_tiny_step() -> tuple[TrainStep, tuple[State, Batch]]:
    return make_train_step("moe-tiny")


def wresnet_tiny_step() -> tuple[TrainStep, tuple[State, Batch]]:
    return make_train_step("wresnet-tiny")


def bert_tiny_step() -> tuple[TrainStep, tuple[State, Batch]]:
    return make_train_step("bert-tiny")


def llama_tiny_step() -> tuple[TrainStep, tuple[State, Batch]]:
    return make_train_step("llama-tiny")
