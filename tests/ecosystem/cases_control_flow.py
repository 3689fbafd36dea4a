"""``lax`` control flow in training steps as users write it: gradient
accumulation with ``lax.scan`` over chunks of the batch, a chunked
(memory-saving) cross-entropy with ``lax.scan``, a weight-shared layer applied
with ``lax.fori_loop``, ``lax.cond`` inside the model (a layer switched on
after warmup), and ``lax.while_loop`` preprocessing that needs no gradients
(a Newton fixed-point under ``stop_gradient``; sequence lengths found by a
loop with a data-dependent trip count). Plain-JAX models with dict params."""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from corpus import Built, Case

BATCH, FEATURES, HIDDEN, CLASSES = 16, 8, 32, 4
VOCAB, SEQ = 32, 8


def init_mlp(key: jax.Array, sizes: list[int]) -> list[dict[str, jax.Array]]:
    keys = jax.random.split(key, len(sizes) - 1)
    return [
        {
            "w": jax.random.normal(k, (m, n)) * jnp.sqrt(2.0 / m),
            "b": jnp.zeros((n,)),
        }
        for k, m, n in zip(keys, sizes[:-1], sizes[1:], strict=True)
    ]


def mlp_apply(params: list[dict[str, jax.Array]], x: jax.Array) -> jax.Array:
    for layer in params[:-1]:
        x = jax.nn.relu(x @ layer["w"] + layer["b"])
    return x @ params[-1]["w"] + params[-1]["b"]


def xent(logits: jax.Array, labels: jax.Array) -> jax.Array:
    return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()


def _batch(seed: int, batch: int = BATCH) -> dict[str, jax.Array]:
    kx, ky = jax.random.split(jax.random.PRNGKey(seed))
    return {
        "x": jax.random.normal(kx, (batch, FEATURES)),
        "y": jax.random.randint(ky, (batch,), 0, CLASSES),
    }


class TrainState(NamedTuple):
    params: Any
    opt_state: optax.OptState
    step: jax.Array


# --- gradient accumulation: lax.scan over chunks of the batch ----------------

ACCUM_CHUNKS = 2
accum_tx = optax.adam(1e-3)


def accum_loss(params: Any, chunk: dict[str, jax.Array]) -> jax.Array:
    return xent(mlp_apply(params, chunk["x"]), chunk["y"])


def grad_accum_step(
    state: TrainState, batch: dict[str, jax.Array]
) -> tuple[TrainState, dict[str, jax.Array]]:
    chunks = jax.tree_util.tree_map(lambda x: x.reshape((ACCUM_CHUNKS, -1, *x.shape[1:])), batch)

    def accumulate(carry: tuple[jax.Array, Any], chunk: dict[str, jax.Array]) -> tuple[Any, None]:
        loss_sum, grad_sum = carry
        loss, grads = jax.value_and_grad(accum_loss)(state.params, chunk)
        return (loss_sum + loss, jax.tree_util.tree_map(jnp.add, grad_sum, grads)), None

    init = (jnp.zeros(()), jax.tree_util.tree_map(jnp.zeros_like, state.params))
    (loss, grads), _ = jax.lax.scan(accumulate, init, chunks)
    grads = jax.tree_util.tree_map(lambda g: g / ACCUM_CHUNKS, grads)
    updates, opt_state = accum_tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    return TrainState(params, opt_state, state.step + 1), {"loss": loss / ACCUM_CHUNKS}


def build_grad_accum() -> Built:
    params = init_mlp(jax.random.PRNGKey(0), [FEATURES, HIDDEN, HIDDEN, CLASSES])
    state = TrainState(params, accum_tx.init(params), jnp.zeros((), jnp.int32))
    return Built(grad_accum_step, (state, _batch(1)))


# --- chunked cross-entropy: lax.scan over sequence chunks --------------------

LOSS_CHUNK = 4
chunked_tx = optax.adamw(1e-3)


def chunked_lm_loss(params: dict[str, jax.Array], batch: dict[str, jax.Array]) -> jax.Array:
    h = params["embed"][batch["tokens"]]  # [B, T, D]
    h = jnp.tanh(h @ params["w"] + params["b"])
    # Scan over chunks of the sequence so that only [B, chunk, V] logits live at once.
    b, t, d = h.shape
    h_chunks = h.reshape(b, t // LOSS_CHUNK, LOSS_CHUNK, d).swapaxes(0, 1)
    y_chunks = batch["targets"].reshape(b, t // LOSS_CHUNK, LOSS_CHUNK).swapaxes(0, 1)

    def chunk_loss(total: jax.Array, xs: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, None]:
        h_c, y_c = xs
        logits = h_c @ params["unembed"]
        losses = optax.softmax_cross_entropy_with_integer_labels(logits, y_c)
        return total + losses.sum(), None

    total, _ = jax.lax.scan(chunk_loss, jnp.zeros(()), (h_chunks, y_chunks))
    return total / (b * t)


def chunked_loss_step(
    state: dict[str, Any], batch: dict[str, jax.Array]
) -> tuple[dict[str, Any], jax.Array]:
    loss, grads = jax.value_and_grad(chunked_lm_loss)(state["params"], batch)
    updates, opt_state = chunked_tx.update(grads, state["opt_state"], state["params"])
    return {"params": optax.apply_updates(state["params"], updates), "opt_state": opt_state}, loss


def build_chunked_loss() -> Built:
    k = jax.random.split(jax.random.PRNGKey(0), 4)
    dim = 16
    params = {
        "embed": jax.random.normal(k[0], (VOCAB, dim)) * 0.1,
        "w": jax.random.normal(k[1], (dim, dim)) / jnp.sqrt(dim),
        "b": jnp.zeros((dim,)),
        "unembed": jax.random.normal(k[2], (dim, VOCAB)) / jnp.sqrt(dim),
    }
    ids = jax.random.randint(k[3], (8, SEQ + 1), 0, VOCAB)
    batch = {"tokens": ids[:, :-1], "targets": ids[:, 1:]}
    return Built(
        chunked_loss_step, ({"params": params, "opt_state": chunked_tx.init(params)}, batch)
    )


# --- lax.fori_loop: a weight-shared layer applied N times ---------------------

ITERATIONS = 3
fori_tx = optax.sgd(0.05, momentum=0.9)


def fori_apply(params: dict[str, Any], x: jax.Array) -> jax.Array:
    h = jnp.tanh(x @ params["w_in"])

    def body(i: jax.Array, h: jax.Array) -> jax.Array:
        return h + jnp.tanh(h @ params["w_shared"] + params["b_shared"]) / ITERATIONS

    h = jax.lax.fori_loop(0, ITERATIONS, body, h)
    return h @ params["w_out"]


def fori_step(
    state: dict[str, Any], batch: dict[str, jax.Array]
) -> tuple[dict[str, Any], dict[str, jax.Array]]:
    def loss_fn(params: dict[str, Any]) -> jax.Array:
        return xent(fori_apply(params, batch["x"]), batch["y"])

    loss, grads = jax.value_and_grad(loss_fn)(state["params"])
    updates, opt_state = fori_tx.update(grads, state["opt_state"], state["params"])
    params = optax.apply_updates(state["params"], updates)
    return {"params": params, "opt_state": opt_state}, {"loss": loss}


def build_fori() -> Built:
    k = jax.random.split(jax.random.PRNGKey(0), 3)
    params = {
        "w_in": jax.random.normal(k[0], (FEATURES, HIDDEN)) / jnp.sqrt(FEATURES),
        "w_shared": jax.random.normal(k[1], (HIDDEN, HIDDEN)) / jnp.sqrt(HIDDEN),
        "b_shared": jnp.zeros((HIDDEN,)),
        "w_out": jax.random.normal(k[2], (HIDDEN, CLASSES)) / jnp.sqrt(HIDDEN),
    }
    state = {"params": params, "opt_state": fori_tx.init(params)}
    return Built(fori_step, (state, _batch(2)))


# --- lax.cond inside the model: a layer switched on after warmup --------------

WARMUP_STEPS = 1
cond_tx = optax.sgd(0.1)


def cond_apply(params: list[dict[str, jax.Array]], x: jax.Array, step: jax.Array) -> jax.Array:
    h = jax.nn.relu(x @ params[0]["w"] + params[0]["b"])
    # progressive growing: the extra block joins once warmup is over
    h = jax.lax.cond(
        step >= WARMUP_STEPS,
        lambda h: h + jax.nn.relu(h @ params[1]["w"] + params[1]["b"]),
        lambda h: h,
        h,
    )
    return h @ params[2]["w"] + params[2]["b"]


def cond_step(
    state: TrainState, batch: dict[str, jax.Array]
) -> tuple[TrainState, dict[str, jax.Array]]:
    def loss_fn(params: Any) -> jax.Array:
        return xent(cond_apply(params, batch["x"], state.step), batch["y"])

    loss, grads = jax.value_and_grad(loss_fn)(state.params)
    updates, opt_state = cond_tx.update(grads, state.opt_state)
    params = optax.apply_updates(state.params, updates)
    return TrainState(params, opt_state, state.step + 1), {"loss": loss}


def build_cond() -> Built:
    params = init_mlp(jax.random.PRNGKey(0), [FEATURES, HIDDEN, HIDDEN, CLASSES])
    state = TrainState(params, cond_tx.init(params), jnp.zeros((), jnp.int32))
    return Built(cond_step, (state, _batch(3)))


# --- lax.while_loop: a Newton fixed point under stop_gradient -----------------

newton_tx = optax.adam(1e-3)


def inverse_sqrt_newton(a: jax.Array, tol: float = 1e-6, max_iters: int = 50) -> jax.Array:
    """1/sqrt(a) by Newton's iteration y <- y (3 - a y^2) / 2, until converged."""

    def cond(carry: tuple[jax.Array, jax.Array, jax.Array]) -> jax.Array:
        _, delta, i = carry
        return (delta > tol) & (i < max_iters)

    def body(carry: tuple[jax.Array, jax.Array, jax.Array]) -> tuple[Any, Any, Any]:
        y, _, i = carry
        y_new = y * (3.0 - a * y * y) / 2.0
        return y_new, jnp.max(jnp.abs(y_new - y)), i + 1

    y0 = jnp.ones_like(a) / jnp.maximum(a, 1.0)
    y, _, _ = jax.lax.while_loop(cond, body, (y0, jnp.array(jnp.inf), jnp.array(0)))
    return y


def newton_step(
    state: TrainState, batch: dict[str, jax.Array]
) -> tuple[TrainState, dict[str, jax.Array]]:
    # Preprocessing: normalise each example to unit RMS; no gradient needed.
    x = batch["x"]
    scale = jax.lax.stop_gradient(inverse_sqrt_newton(jnp.mean(x * x, axis=-1, keepdims=True)))
    x = x * scale

    def loss_fn(params: Any) -> jax.Array:
        return xent(mlp_apply(params, x), batch["y"])

    loss, grads = jax.value_and_grad(loss_fn)(state.params)
    updates, opt_state = newton_tx.update(grads, state.opt_state)
    params = optax.apply_updates(state.params, updates)
    return TrainState(params, opt_state, state.step + 1), {"loss": loss}


def build_newton() -> Built:
    params = init_mlp(jax.random.PRNGKey(0), [FEATURES, HIDDEN, CLASSES])
    batch = _batch(4)
    batch["x"] = batch["x"] * jnp.linspace(0.5, 3.0, BATCH)[:, None]
    state = TrainState(params, newton_tx.init(params), jnp.zeros((), jnp.int32))
    return Built(newton_step, (state, batch))


# --- lax.while_loop with a data-dependent trip count (sequence lengths) -------

EOS = 0
lengths_tx = optax.adam(1e-3)


def sequence_lengths(tokens: jax.Array) -> jax.Array:
    """Position of the first EOS in every row (the row length if none), found
    by walking the columns until every row has ended."""

    def cond(carry: tuple[jax.Array, jax.Array]) -> jax.Array:
        t, lengths = carry
        return (t < tokens.shape[1]) & jnp.any(lengths == tokens.shape[1])

    def body(carry: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, jax.Array]:
        t, lengths = carry
        ended_here = (tokens[:, t] == EOS) & (lengths == tokens.shape[1])
        return t + 1, jnp.where(ended_here, t, lengths)

    init = (jnp.array(0), jnp.full((tokens.shape[0],), tokens.shape[1]))
    _, lengths = jax.lax.while_loop(cond, body, init)
    return lengths


def lengths_loss(params: dict[str, jax.Array], batch: dict[str, jax.Array]) -> jax.Array:
    tokens = batch["tokens"]
    lengths = sequence_lengths(tokens)
    mask = (jnp.arange(tokens.shape[1])[None, :] < lengths[:, None]).astype(jnp.float32)
    h = params["embed"][tokens] * mask[..., None]
    pooled = h.sum(axis=1) / jnp.maximum(mask.sum(axis=1, keepdims=True), 1.0)
    logits = jnp.tanh(pooled @ params["w"]) @ params["out"]
    return xent(logits, batch["label"])


def lengths_step(
    state: dict[str, Any], batch: dict[str, jax.Array]
) -> tuple[dict[str, Any], jax.Array]:
    loss, grads = jax.value_and_grad(lengths_loss)(state["params"], batch)
    updates, opt_state = lengths_tx.update(grads, state["opt_state"], state["params"])
    return {"params": optax.apply_updates(state["params"], updates), "opt_state": opt_state}, loss


def build_lengths() -> Built:
    k = jax.random.split(jax.random.PRNGKey(0), 5)
    dim = 16
    params = {
        "embed": jax.random.normal(k[0], (VOCAB, dim)) * 0.1,
        "w": jax.random.normal(k[1], (dim, dim)) / jnp.sqrt(dim),
        "out": jax.random.normal(k[2], (dim, CLASSES)) / jnp.sqrt(dim),
    }
    tokens = jax.random.randint(k[3], (8, SEQ), 1, VOCAB)
    ends = jnp.array([2, 5, 8, 3, 7, 4, 8, 6])  # 8: no EOS in that row
    tokens = jnp.where(jnp.arange(SEQ)[None, :] == ends[:, None], EOS, tokens)
    batch = {"tokens": tokens, "label": jax.random.randint(k[4], (8,), 0, CLASSES)}
    state = {"params": params, "opt_state": lengths_tx.init(params)}
    return Built(lengths_step, (state, batch))


_cf = functools.partial(Case, library="control-flow")

CASES = [
    _cf(name="cf_scan_grad_accum", build=build_grad_accum),
    _cf(name="cf_scan_chunked_loss", build=build_chunked_loss),
    _cf(name="cf_fori_loop_shared_layer", build=build_fori),
    _cf(name="cf_cond_in_model", build=build_cond, steps=3),
    _cf(name="cf_while_newton_stop_gradient", build=build_newton),
    _cf(name="cf_while_sequence_lengths", build=build_lengths),
]
