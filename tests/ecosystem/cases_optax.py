"""optax optimisers as their users configure them, each on a small flax model:
adamw with a weight-decay mask, clipping chained with a warmup-cosine adamw,
adafactor (factored), lion, ``MultiSteps`` gradient accumulation,
``apply_if_finite``, and a hand-written ``lax.cond`` that skips the update
unless every gradient is finite."""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from corpus import Built, Case
from flax.training import train_state

VOCAB, DIM, SEQ, BATCH = 32, 16, 8, 8


class MLP(nn.Module):
    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        x = nn.Dense(32)(x)
        x = nn.LayerNorm()(x)
        x = nn.relu(x)
        x = nn.Dense(32)(x)
        x = nn.relu(x)
        return nn.Dense(4)(x)


class TransformerBlock(nn.Module):
    @nn.compact
    def __call__(self, tokens: jax.Array) -> jax.Array:
        x = nn.Embed(VOCAB, DIM)(tokens)
        h = nn.LayerNorm()(x)
        x = x + nn.SelfAttention(num_heads=2)(h, mask=nn.make_causal_mask(tokens))
        h = nn.LayerNorm()(x)
        x = x + nn.Dense(DIM)(nn.gelu(nn.Dense(4 * DIM)(h)))
        return nn.Dense(VOCAB)(nn.LayerNorm()(x))


def _mlp_batch(seed: int) -> dict[str, jax.Array]:
    kx, ky = jax.random.split(jax.random.PRNGKey(seed))
    return {"x": jax.random.normal(kx, (16, 8)), "y": jax.random.randint(ky, (16,), 0, 4)}


def _token_batch(seed: int) -> dict[str, jax.Array]:
    ids = jax.random.randint(jax.random.PRNGKey(seed), (BATCH, SEQ + 1), 0, VOCAB)
    return {"x": ids[:, :-1], "y": ids[:, 1:]}


def _loss(apply_fn: Any, params: Any, batch: dict[str, jax.Array]) -> jax.Array:
    logits = apply_fn({"params": params}, batch["x"])
    return optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"]).mean()


def trainstate_step(
    state: train_state.TrainState, batch: dict[str, jax.Array]
) -> tuple[train_state.TrainState, dict[str, jax.Array]]:
    loss, grads = jax.value_and_grad(functools.partial(_loss, state.apply_fn))(state.params, batch)
    state = state.apply_gradients(grads=grads)
    return state, {"loss": loss, "grad_norm": optax.global_norm(grads)}


def _trainstate_built(model: nn.Module, batch: dict[str, jax.Array], tx: Any) -> Built:
    params = model.init(jax.random.PRNGKey(0), batch["x"])["params"]
    state = train_state.TrainState.create(apply_fn=model.apply, params=params, tx=tx)
    return Built(trainstate_step, (state, batch))


# --- adamw with a weight-decay mask -------------------------------------------


def build_adamw_mask() -> Built:
    def decay_mask(params: Any) -> Any:
        # no weight decay on biases and LayerNorm scales
        return jax.tree_util.tree_map_with_path(
            lambda path, _: path[-1].key not in ("bias", "scale"), params
        )

    tx = optax.adamw(learning_rate=1e-3, weight_decay=0.1, mask=decay_mask)
    return _trainstate_built(MLP(), _mlp_batch(1), tx)


# --- clip_by_global_norm + adamw(warmup_cosine_decay_schedule) ----------------


def build_clip_warmup_cosine() -> Built:
    schedule = optax.warmup_cosine_decay_schedule(
        init_value=0.0, peak_value=1e-3, warmup_steps=2, decay_steps=20, end_value=1e-5
    )
    tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(schedule, weight_decay=1e-4))
    return _trainstate_built(TransformerBlock(), _token_batch(2), tx)


# --- adafactor -----------------------------------------------------------------


def build_adafactor() -> Built:
    tx = optax.adafactor(learning_rate=1e-2, min_dim_size_to_factor=8)
    return _trainstate_built(TransformerBlock(), _token_batch(3), tx)


# --- lion ---------------------------------------------------------------------


def build_lion() -> Built:
    tx = optax.lion(learning_rate=1e-4, weight_decay=1e-2)
    return _trainstate_built(MLP(), _mlp_batch(4), tx)


# --- MultiSteps gradient accumulation ------------------------------------------

multi_model = MLP()
multi_tx = optax.MultiSteps(optax.adam(1e-3), every_k_schedule=2)


class State(NamedTuple):
    params: Any
    opt_state: optax.OptState


def multisteps_step(
    state: State, batch: dict[str, jax.Array]
) -> tuple[State, dict[str, jax.Array]]:
    loss, grads = jax.value_and_grad(functools.partial(_loss, multi_model.apply))(
        state.params, batch
    )
    updates, opt_state = multi_tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    return State(params, opt_state), {"loss": loss}


def build_multisteps() -> Built:
    batch = _mlp_batch(5)
    params = multi_model.init(jax.random.PRNGKey(0), batch["x"])["params"]
    return Built(multisteps_step, (State(params, multi_tx.init(params)), batch))


# --- apply_if_finite -------------------------------------------------------------


def build_apply_if_finite() -> Built:
    tx = optax.apply_if_finite(optax.adam(1e-3), max_consecutive_errors=5)
    return _trainstate_built(MLP(), _mlp_batch(6), tx)


# --- a hand-written lax.cond that skips non-finite updates ---------------------

skip_model = MLP()
skip_tx = optax.sgd(0.1, momentum=0.9)


def skip_nonfinite_step(
    state: dict[str, Any], batch: dict[str, jax.Array]
) -> tuple[dict[str, Any], dict[str, jax.Array]]:
    loss, grads = jax.value_and_grad(functools.partial(_loss, skip_model.apply))(
        state["params"], batch
    )
    grads_finite = jnp.all(
        jnp.array([jnp.all(jnp.isfinite(g)) for g in jax.tree_util.tree_leaves(grads)])
    )

    def apply(operand: tuple[Any, Any, Any]) -> tuple[Any, Any]:
        params, opt_state, grads = operand
        updates, opt_state = skip_tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    def skip(operand: tuple[Any, Any, Any]) -> tuple[Any, Any]:
        params, opt_state, _ = operand
        return params, opt_state

    params, opt_state = jax.lax.cond(
        grads_finite, apply, skip, (state["params"], state["opt_state"], grads)
    )
    new_state = {
        "params": params,
        "opt_state": opt_state,
        "skipped": state["skipped"] + jnp.where(grads_finite, 0, 1),
    }
    return new_state, {"loss": loss, "grads_finite": grads_finite}


def build_skip_nonfinite() -> Built:
    batch = _mlp_batch(7)
    params = skip_model.init(jax.random.PRNGKey(0), batch["x"])["params"]
    state = {
        "params": params,
        "opt_state": skip_tx.init(params),
        "skipped": jnp.zeros((), jnp.int32),
    }
    return Built(skip_nonfinite_step, (state, batch))


_optax = functools.partial(Case, library="optax")

CASES = [
    _optax(name="optax_adamw_decay_mask", build=build_adamw_mask),
    _optax(name="optax_clip_adamw_warmup_cosine", build=build_clip_warmup_cosine),
    _optax(name="optax_adafactor_factored", build=build_adafactor),
    _optax(name="optax_lion", build=build_lion),
    _optax(name="optax_multisteps", build=build_multisteps, steps=3),
    _optax(name="optax_apply_if_finite", build=build_apply_if_finite),
    _optax(name="optax_cond_skip_nonfinite", build=build_skip_nonfinite),
]
