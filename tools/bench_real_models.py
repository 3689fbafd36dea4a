"""bench-real-models: real models, written as users write them, planned by the compiler.

Each model is the user's own training step, not the repo's model zoo: Hugging
Face Flax GPT-2 small (124M; ``GPT2Config()``, sequence 128) and medium (355M;
``n_embd=1024, n_layer=24, n_head=16``), BERT-base (``BertConfig()``, masked LM,
sequence 128), ViT-B/16 (``ViTConfig(num_labels=1000)``, 224x224 images),
T5-small (``d_model=512``, 6+6 layers, encoder and decoder sequences 128) and
a Llama-style model of about 1B parameters written here in pure JAX (RMSNorm,
rotary embeddings, SwiGLU MLP, causal attention; d=2048, 16 layers, 16 heads,
FFN 5632, vocabulary 32000, sequence 1024). Every step trains with optax
AdamW (a warmup schedule and no weight decay on biases and norms, as the
Hugging Face Flax examples do) on a ``TrainState``, global batch 8, float32,
random initialization; nothing is downloaded.

**Planning** (nothing runs; the arguments are abstract, ``jax.eval_shape`` of the
initialization, since planning reads shapes only): the step is imported at the
micro-batch shape as ``PipeshardParallel`` imports it, cut into one automatic
layer per block and one more (the layer passes of ``AutoLayerOption``:
``cluster-operators`` with ``fit-delta``, since a user's ``jax.value_and_grad``
carries no layer markers of its own), and planned with automatic stages for the
``alpa-testbed`` cluster (8 GPUs per node) by :func:`alpa_ir.tools.bench_suite.bench_module`:
every layer priced on every logical mesh view (``layer-sum``), the stage DP,
the plan simulated (the ``simulate`` backend, 1F1B) beside the baselines
``alpa-bench`` computes (``intra-op``: one stage on all GPUs; ``inter-op``: 1x1
submeshes only; ``megatron``: the uniform dp x op x pp grid). Per-layer
rematerialization, ZeRO-2 where the plan replicates, operator fusion and the
memory fallback are on for every method, as in ``alpa-bench``.

Three more baselines on the whole cluster as one stage, priced by the same
stage cost model (:func:`sharded_data_parallel`): ``data-parallel`` (the batch
split over all GPUs of the ``(N, 1)`` view, parameters replicated, no
all-gathers: the gradients are all-reduced), ``zero-2`` (the same with
gradients and optimizer state partitioned, the cost option ``zero``) and
``zero-3`` (parameters not replicated either, ``allow_replicated_parameters``
off, all-gathers allowed: the ILP all-gathers each sharded parameter where it
is used, or uses it sharded where that is cheaper). They use as many
micro-batches as still give every GPU whole rows of each micro-batch (1 for a
global batch of 8 on 8 GPUs); a global batch smaller than the GPUs has no such
plan.

Reported per model and GPU count: the import time, the planning time split as
the Alpa paper's Table 5 (clustering: the layer passes; costing; DP; other),
the chosen plan (each stage's layers, submesh and logical mesh), the simulated
PFLOPS of every method (model FLOPs: the step's matmul FLOPs counted on the
imported IR, no recomputation) and the planner's peak resident memory
(``ru_maxrss``; each model and GPU count is planned in a fresh process, and
the largest costing worker is reported beside it).

**Running** (``--run``): on 8 local CPU devices, the models that can be
allocated here (GPT-2 small, BERT-base, ViT-B/16, T5-small) also run one step
with ``PipeshardParallel(num_micro_batches=4, AutoLayerOption(layer_num=4),
AutoStageOption())`` from the same initial state and batch as one device's
``jax.jit(step)``; reported: ``get_executable`` seconds, the first and the
second step's seconds, both losses and their relative difference.

An error in one model or phase is one line in the output; the others go on.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import math
import multiprocessing
import multiprocessing.connection
import os
import resource
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from alpa_ir.ir.collection import rare_full_collections
from alpa_ir.tools.cli_args import OneLineParser, positive_int, positive_seconds

if TYPE_CHECKING:  # imported where used: a bad option is rejected before jax loads
    import jax
    from xdsl.dialects.builtin import ModuleOp

    from alpa_ir.costs.stage_cost import StageCostOptions
    from alpa_ir.costs.stage_table import StageCostTable
    from alpa_ir.hardware.clusters import Cluster
    from alpa_ir.pipeline.layer_ranges import LayerRanges
    from alpa_ir.tools.bench_outcome import Outcome

PROG = "bench-real-models"
CLUSTER = "alpa-testbed"
BATCH = 8
RUN_MICRO_BATCHES = 4
RUN_LAYERS = 4
RUN_DEVICES = 8
METHODS = (
    "alpa",
    "alpa+comm",
    "intra-op",
    "inter-op",
    "megatron",
    "data-parallel",
    "zero-2",
    "zero-3",
)


# --- the users' training steps ------------------------------------------------


@dataclass(frozen=True)
class UserStep:
    """A training step and its arguments (arrays, or ``jax.ShapeDtypeStruct``
    leaves when abstract); ``batch_argnums``: the batch arguments."""

    step: Callable[..., Any]
    args: tuple[Any, ...]
    batch_argnums: tuple[int, ...] = (1,)


@dataclass(frozen=True)
class ModelSpec:
    """A benchmarked model: ``build(abstract)`` makes its step; ``layers``:
    automatic layers to cut it into; ``can_run``: small enough to run here."""

    name: str
    description: str
    build: Callable[[bool], UserStep]
    layers: int
    can_run: bool = False


def learning_rate(step: Any) -> Any:
    """Linear warmup over 10 steps to 1e-4, then linear decay over 1000 (the
    Hugging Face Flax examples' schedule)."""
    import optax

    warmup = optax.linear_schedule(0.0, 1e-4, 10)
    decay = optax.linear_schedule(1e-4, 0.0, 990)
    return optax.join_schedules([warmup, decay], [10])(step)


def decay_mask(params: Any) -> Any:
    """Weight decay on matrices only, not on biases and norm scales."""
    import jax

    return jax.tree.map(lambda p: p.ndim > 1, params)


def user_adamw() -> Any:
    """The optimizer every model trains with: AdamW as in ``run_clm_flax.py``."""
    import optax

    return optax.adamw(
        learning_rate=learning_rate, b1=0.9, b2=0.98, eps=1e-8, weight_decay=0.01, mask=decay_mask
    )


def dropout_train_state() -> type:
    """``TrainState`` with a ``dropout_rng`` field, as the Hugging Face examples define it."""
    from flax.training import train_state

    class TrainState(train_state.TrainState):  # type: ignore[misc]
        dropout_rng: jax.Array

    return TrainState


def hf_state(model: Any, abstract: bool, apply_fn: Callable[..., Any] | None = None) -> Any:
    """The model's ``TrainState`` with a dropout key: random parameters, or
    their shapes only (``jax.eval_shape``) when ``abstract``; ``apply_fn``:
    the model's ``__call__`` unless given."""
    import jax

    def create() -> Any:
        params = model.init_weights(jax.random.PRNGKey(0), model.input_shape)
        return dropout_train_state().create(
            apply_fn=apply_fn or model.__call__,
            params=params,
            tx=user_adamw(),
            dropout_rng=jax.random.PRNGKey(1),
        )

    return jax.eval_shape(create) if abstract else create()


def batch_arrays(arrays: dict[str, Any], abstract: bool) -> dict[str, Any]:
    """``arrays`` as they are, or as ``jax.ShapeDtypeStruct`` leaves when ``abstract``."""
    import jax
    import numpy as np

    if not abstract:
        return arrays
    return {k: jax.ShapeDtypeStruct(np.shape(v), np.asarray(v).dtype) for k, v in arrays.items()}


def token_ids(shape: tuple[int, ...], vocab: int, seed: int, low: int = 0) -> Any:
    """Random token ids (int32) in ``[low, vocab)``."""
    import numpy as np

    return np.random.default_rng(seed).integers(low, vocab, shape).astype(np.int32)


def cross_entropy(logits: Any, labels: Any) -> Any:
    """Mean softmax cross entropy of integer ``labels``."""
    import optax
    from flax.training.common_utils import onehot

    return optax.softmax_cross_entropy(logits, onehot(labels, logits.shape[-1])).mean()


def causal_lm_train_step(state: Any, batch: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """``run_clm_flax.py``'s step: next-token loss, a fresh dropout key per step."""
    import jax

    dropout_rng, new_dropout_rng = jax.random.split(state.dropout_rng)

    def compute_loss(params: Any) -> Any:
        labels = batch.pop("labels")
        logits = state.apply_fn(**batch, params=params, dropout_rng=dropout_rng, train=True)[0]
        return cross_entropy(logits[..., :-1, :], labels[..., 1:])

    loss, grad = jax.value_and_grad(compute_loss)(state.params)
    new_state = state.apply_gradients(grads=grad, dropout_rng=new_dropout_rng)
    return new_state, {"loss": loss, "learning_rate": learning_rate(state.step)}


def labelled_train_step(state: Any, batch: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """The step of ``run_image_classification.py`` and ``run_summarization_flax.py``:
    the model's logits against ``labels`` (an image's class, or the target
    tokens of a sequence-to-sequence model)."""
    import jax

    dropout_rng, new_dropout_rng = jax.random.split(state.dropout_rng)

    def compute_loss(params: Any) -> Any:
        labels = batch.pop("labels")
        logits = state.apply_fn(**batch, params=params, dropout_rng=dropout_rng, train=True)[0]
        return cross_entropy(logits, labels)

    loss, grad = jax.value_and_grad(compute_loss)(state.params)
    new_state = state.apply_gradients(grads=grad, dropout_rng=new_dropout_rng)
    return new_state, {"loss": loss, "learning_rate": learning_rate(state.step)}


def masked_lm_train_step(
    state: Any, batch: dict[str, Any], dropout_rng: Any
) -> tuple[Any, dict[str, Any]]:
    """``run_mlm_flax.py``'s step: the loss over the masked tokens (labels > 0),
    the dropout key folded with the step."""
    import jax
    import jax.numpy as jnp
    import optax
    from flax.training.common_utils import onehot

    dropout_rng = jax.random.fold_in(dropout_rng, state.step)

    def loss_fn(params: Any) -> tuple[Any, Any]:
        labels = batch.pop("labels")
        logits = state.apply_fn(**batch, params=params, dropout_rng=dropout_rng, train=True)[0]
        label_mask = jnp.where(labels > 0, 1.0, 0.0)
        loss = optax.softmax_cross_entropy(logits, onehot(labels, logits.shape[-1])) * label_mask
        return loss.sum(), label_mask.sum()

    (loss, num_labels), grad = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
    grad = jax.tree.map(lambda g: g / num_labels, grad)
    new_state = state.apply_gradients(grads=grad)
    return new_state, {"loss": loss / num_labels, "learning_rate": learning_rate(state.step)}


def gpt2_step(config: Any, abstract: bool, *, batch: int = BATCH, seq: int = 128) -> UserStep:
    """Hugging Face Flax GPT-2 (causal LM) on ``batch`` sequences of ``seq`` tokens."""
    import numpy as np
    from transformers import FlaxGPT2LMHeadModel

    model = FlaxGPT2LMHeadModel(config, input_shape=(1, seq), _do_init=False)
    ids = token_ids((batch, seq), config.vocab_size, 0)
    arrays = {"input_ids": ids, "attention_mask": np.ones_like(ids), "labels": ids.copy()}
    return UserStep(
        causal_lm_train_step, (hf_state(model, abstract), batch_arrays(arrays, abstract))
    )


def bert_step(config: Any, abstract: bool, *, batch: int = BATCH, seq: int = 128) -> UserStep:
    """Hugging Face Flax BERT (masked LM, 15% of the tokens masked)."""
    import jax
    import numpy as np
    from transformers import FlaxBertForMaskedLM

    model = FlaxBertForMaskedLM(config, input_shape=(1, seq), _do_init=False)
    state = _plain_hf_state(model, abstract)
    rng = np.random.default_rng(1)
    ids = token_ids((batch, seq), config.vocab_size, 1, low=1000)
    masked = rng.random((batch, seq)) < 0.15
    masked[:, 0] = True  # every example (and so every micro-batch) has a masked token
    arrays = {
        "input_ids": np.where(masked, 103, ids).astype(np.int32),  # 103: [MASK]
        "attention_mask": np.ones_like(ids),
        "token_type_ids": np.zeros_like(ids),
        "labels": np.where(masked, ids, -100).astype(np.int32),
    }
    key = jax.random.key(0)
    if abstract:
        key = jax.eval_shape(lambda: jax.random.key(0))
    return UserStep(masked_lm_train_step, (state, batch_arrays(arrays, abstract), key))


def _plain_hf_state(model: Any, abstract: bool) -> Any:
    """The model's ``flax.training.train_state.TrainState`` (no dropout key)."""
    import jax
    from flax.training import train_state

    def create() -> Any:
        params = model.init_weights(jax.random.PRNGKey(0), model.input_shape)
        return train_state.TrainState.create(
            apply_fn=model.__call__, params=params, tx=user_adamw()
        )

    return jax.eval_shape(create) if abstract else create()


def vit_step(config: Any, abstract: bool, *, batch: int = BATCH) -> UserStep:
    """Hugging Face Flax ViT image classification (NCHW pixels, integer labels)."""
    import numpy as np
    from transformers import FlaxViTForImageClassification

    size, channels = config.image_size, config.num_channels
    model = FlaxViTForImageClassification(config, _do_init=False)
    gen = np.random.default_rng(3)
    arrays = {
        "pixel_values": gen.standard_normal((batch, channels, size, size)).astype(np.float32),
        "labels": gen.integers(0, config.num_labels, (batch,)).astype(np.int32),
    }
    return UserStep(
        labelled_train_step, (hf_state(model, abstract), batch_arrays(arrays, abstract))
    )


@contextlib.contextmanager
def legacy_clip() -> Iterator[None]:
    """Within this block, ``jnp.clip`` also takes the ``a_min``/``a_max`` keywords
    that JAX 0.10 removed and ``transformers``' Flax T5 still passes
    (``_relative_position_bucket``): without it T5 does not trace."""
    import jax.numpy as jnp

    clip = jnp.clip

    def compatible(x: Any, min: Any = None, max: Any = None, **legacy: Any) -> Any:
        low = legacy.pop("a_min", min)
        return clip(x, low, legacy.pop("a_max", max), **legacy)

    jnp.clip = compatible
    try:
        yield
    finally:
        jnp.clip = clip


def with_legacy_clip(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` called within :func:`legacy_clip` (traced steps call it at trace time)."""

    @functools.wraps(fn)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        with legacy_clip():
            return fn(*args, **kwargs)

    return wrapped


def t5_step(config: Any, abstract: bool, *, batch: int = BATCH, seq: int = 128) -> UserStep:
    """Hugging Face Flax T5 (sequence to sequence; ``seq`` tokens in and out),
    its calls within :func:`legacy_clip`."""
    import numpy as np
    from transformers import FlaxT5ForConditionalGeneration

    with legacy_clip():
        model = FlaxT5ForConditionalGeneration(config, input_shape=(1, seq), _do_init=False)
        state = hf_state(model, abstract, with_legacy_clip(model.__call__))
    inputs = token_ids((batch, seq), config.vocab_size, 4)
    labels = token_ids((batch, seq), config.vocab_size, 5)
    start = config.decoder_start_token_id
    start = config.pad_token_id if start is None else start  # T5 starts with its pad token
    decoder_inputs = np.concatenate([np.full((batch, 1), start, np.int32), labels[:, :-1]], axis=1)
    arrays = {
        "input_ids": inputs,
        "attention_mask": np.ones_like(inputs),
        "decoder_input_ids": decoder_inputs,
        "decoder_attention_mask": np.ones_like(labels),
        "labels": labels,
    }
    return UserStep(labelled_train_step, (state, batch_arrays(arrays, abstract)))


# --- a Llama-style model in pure JAX ------------------------------------------


@dataclass(frozen=True)
class LlamaConfig:
    """A Llama-style decoder: RMSNorm, rotary embeddings, SwiGLU, causal attention."""

    vocab_size: int = 32000
    dim: int = 2048
    num_layers: int = 16
    num_heads: int = 16
    ffn_dim: int = 5632
    seq_len: int = 1024
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5


def llama_init(key: Any, config: LlamaConfig) -> dict[str, Any]:
    """Random parameters (normal, std 0.02; norm scales 1)."""
    import jax
    import jax.numpy as jnp

    d, f = config.dim, config.ffn_dim
    keys = iter(jax.random.split(key, 2 + 7 * config.num_layers))

    def dense(shape: tuple[int, ...]) -> Any:
        return 0.02 * jax.random.normal(next(keys), shape, jnp.float32)

    layers = [
        {
            "attention_norm": jnp.ones((d,), jnp.float32),
            "wq": dense((d, d)),
            "wk": dense((d, d)),
            "wv": dense((d, d)),
            "wo": dense((d, d)),
            "mlp_norm": jnp.ones((d,), jnp.float32),
            "w_gate": dense((d, f)),
            "w_up": dense((d, f)),
            "w_down": dense((f, d)),
        }
        for _ in range(config.num_layers)
    ]
    return {
        "embed": dense((config.vocab_size, d)),
        "layers": layers,
        "final_norm": jnp.ones((d,), jnp.float32),
        "lm_head": dense((d, config.vocab_size)),
    }


def rms_norm(x: Any, scale: Any, eps: float) -> Any:
    """RMSNorm over the last axis."""
    import jax.numpy as jnp

    return x * (scale / jnp.sqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps))


def rotary(x: Any, theta: float) -> Any:
    """Rotary position embedding of ``x`` [batch, seq, heads, head_dim] (pairs of halves)."""
    import jax.numpy as jnp

    seq, half = x.shape[1], x.shape[-1] // 2
    freqs = theta ** (-jnp.arange(half, dtype=jnp.float32) / half)
    angles = jnp.arange(seq, dtype=jnp.float32)[:, None] * freqs[None, :]
    cos, sin = jnp.cos(angles)[None, :, None, :], jnp.sin(angles)[None, :, None, :]
    x1, x2 = x[..., :half], x[..., half:]
    return jnp.concatenate([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1)


def causal_attention(layer: dict[str, Any], x: Any, config: LlamaConfig) -> Any:
    """Multi-head causal self-attention with rotary queries and keys."""
    import jax
    import jax.numpy as jnp

    b, s, d = x.shape
    h = config.num_heads

    def heads(w: Any) -> Any:
        return (x @ w).reshape(b, s, h, d // h)

    q, k = (
        rotary(heads(layer["wq"]), config.rope_theta),
        rotary(heads(layer["wk"]), config.rope_theta),
    )
    v = heads(layer["wv"])
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(d // h)
    mask = jnp.tril(jnp.ones((s, s), dtype=bool))
    weights = jax.nn.softmax(jnp.where(mask, scores, -1e9), axis=-1)
    out = jnp.einsum("bhqk,bkhd->bqhd", weights, v).reshape(b, s, d)
    return out @ layer["wo"]


def llama_forward(params: dict[str, Any], tokens: Any, config: LlamaConfig) -> Any:
    """Logits [batch, seq, vocab] of ``tokens`` [batch, seq]."""
    import jax

    x = params["embed"][tokens]
    for layer in params["layers"]:
        x = x + causal_attention(
            layer, rms_norm(x, layer["attention_norm"], config.norm_eps), config
        )
        h = rms_norm(x, layer["mlp_norm"], config.norm_eps)
        x = x + (jax.nn.silu(h @ layer["w_gate"]) * (h @ layer["w_up"])) @ layer["w_down"]
    return rms_norm(x, params["final_norm"], config.norm_eps) @ params["lm_head"]


def llama_train_step(state: Any, batch: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """Next-token loss of a pure-JAX model whose ``apply_fn(params, tokens)`` gives logits."""
    import jax

    def loss_fn(params: Any) -> Any:
        tokens = batch["input_ids"]
        logits = state.apply_fn(params, tokens)
        return cross_entropy(logits[:, :-1], tokens[:, 1:])

    loss, grads = jax.value_and_grad(loss_fn)(state.params)
    return state.apply_gradients(grads=grads), {"loss": loss}


def llama_step(config: LlamaConfig, abstract: bool, *, batch: int = BATCH) -> UserStep:
    """The Llama-style model's ``TrainState`` step on ``batch`` sequences."""
    import jax
    from flax.training import train_state

    def create() -> Any:
        return train_state.TrainState.create(
            apply_fn=functools.partial(llama_forward, config=config),
            params=llama_init(jax.random.PRNGKey(0), config),
            tx=user_adamw(),
        )

    state = jax.eval_shape(create) if abstract else create()
    arrays = {"input_ids": token_ids((batch, config.seq_len), config.vocab_size, 6)}
    return UserStep(llama_train_step, (state, batch_arrays(arrays, abstract)))


def _gpt2(abstract: bool, **config: Any) -> UserStep:
    from transformers import GPT2Config

    return gpt2_step(GPT2Config(**config), abstract)


def _bert(abstract: bool) -> UserStep:
    from transformers import BertConfig

    return bert_step(BertConfig(), abstract)


def _vit(abstract: bool) -> UserStep:
    from transformers import ViTConfig

    return vit_step(ViTConfig(num_labels=1000), abstract)


def _t5(abstract: bool) -> UserStep:
    from transformers import T5Config

    config = T5Config(d_model=512, num_layers=6, num_heads=8, d_ff=2048, vocab_size=32128)
    return t5_step(config, abstract)


def _llama(abstract: bool) -> UserStep:
    return llama_step(LlamaConfig(), abstract)


def model_specs() -> dict[str, ModelSpec]:
    """The benchmarked models by name (one automatic layer per block and one more)."""
    specs = (
        ModelSpec("gpt2", "GPT-2 small (124M), seq 128", _gpt2, 13, can_run=True),
        ModelSpec(
            "gpt2-medium",
            "GPT-2 medium (355M), seq 128",
            functools.partial(_gpt2, n_embd=1024, n_layer=24, n_head=16),
            25,
        ),
        ModelSpec("bert-base", "BERT-base (110M) masked LM, seq 128", _bert, 13, can_run=True),
        ModelSpec("vit-b16", "ViT-B/16 (86M), 224x224", _vit, 13, can_run=True),
        ModelSpec("t5-small", "T5-small (60M), seq 128 in and out", _t5, 13, can_run=True),
        ModelSpec("llama-1b", "Llama-style (1.0B, pure JAX), seq 1024", _llama, 17),
    )
    return {s.name: s for s in specs}


# --- planning -----------------------------------------------------------------


@dataclass(frozen=True)
class PlanSettings:
    """How every model is planned (``alpa-bench``'s defaults where it has one)."""

    num_micro_batches: int = 4
    cost_mode: str = "layer-sum"
    workers: int = field(default_factory=lambda: os.cpu_count() or 1)
    time_limit: float = 60.0
    progress: bool = False
    """``construct-stages``' progress bar (on a terminal only)."""


def import_micro_batch(user: UserStep, num_micro_batches: int) -> ModuleOp:
    """The step imported at the micro-batch shape, as ``PipeshardParallel`` imports it."""
    from alpa_ir.frontend.arguments import trace_arguments
    from alpa_ir.frontend.jaxpr_import import import_step

    arguments, traced = trace_arguments(
        user.step, user.args, (), user.batch_argnums, num_micro_batches
    )
    return import_step(
        user.step,
        *traced,
        static_argnums=arguments.static_argnums,
        batch_argnums=user.batch_argnums,
        unroll_differentiated_loops=True,
    ).module


def layer_pipeline(num_micro_batches: int, layers: int) -> str:
    """The passes that cut an imported step into ``layers`` automatic layers:
    those of ``AutoLayerOption`` (``alpa_ir.api.pipeshard_executable``), with
    ``fit-delta`` as ``alpa-bench`` clusters."""
    rows = [f"draw-micro-batch-rows{{num-micro-batches={num_micro_batches}}}"]
    passes = [
        *(rows if num_micro_batches > 1 else []),
        "merge-backward-runs",
        "split-conditionals",
        f"cluster-operators{{layers={layers} delta=0.5 fit-delta=true}}",
        "mirror-layers",
    ]
    return f"builtin.module({','.join(passes)})"


def with_layers(module: ModuleOp, num_micro_batches: int, layers: int) -> ModuleOp:
    """``module`` cut into ``layers`` automatic layers (in place; returned)."""
    from alpa_ir.passmanager.pass_manager import PassManager
    from alpa_ir.plugins.registry import default_registry

    # verified once at the end, as PipeshardParallel does (per pass: 2 of GPT-2's 5 s)
    pipeline = layer_pipeline(num_micro_batches, layers)
    PassManager(default_registry(), pipeline, verify_each="end").execute(module)
    return module


def matmul_flops(module: ModuleOp) -> float:
    """FLOPs of the matmuls and convolutions of ``module`` (2 per multiply-add)."""
    from alpa_ir.costs.flops import op_flops
    from alpa_ir.dialects.lax import LaxOp

    return sum(
        op_flops(op)
        for op in module.walk()
        if isinstance(op, LaxOp) and op.primitive_name in ("dot_general", "conv_general_dilated")
    )


def parameter_count(user: UserStep) -> int:
    """Elements of the trainable parameters (``state.params``)."""
    import jax

    return sum(math.prod(x.shape) for x in jax.tree.leaves(user.args[0].params))


def data_parallel_micro_batches(batch: int, num_devices: int, wanted: int) -> int:
    """The most micro-batches, at most ``wanted``, whose micro-batch splits into
    whole rows over ``num_devices``; 0 if none does (a batch smaller than the devices)."""
    fits = [b for b in range(1, wanted + 1) if batch % b == 0 and (batch // b) % num_devices == 0]
    return max(fits, default=0)


def batch_rows(user: UserStep) -> int:
    """The global batch: the first dimension of the batch argument's leaves."""
    import jax
    import numpy as np

    return int(np.shape(jax.tree.leaves(user.args[user.batch_argnums[0]])[0])[0])


def data_parallel_specs(
    function: Any, param_args: Sequence[int], rows: int, mesh_shape: tuple[int, ...], *, params: str
) -> dict[int, Any]:
    """Argument shardings of a data-parallel layer function: every argument
    whose first dimension is the micro-batch (``rows``) split along it over all
    mesh axes; parameters replicated (``params="replicated"``) or left to the
    ILP (``"free"``); an argument no dimension of which splits over all devices
    (a PRNG key, a scalar) replicated; everything else left to the ILP."""
    from alpa_ir.dialects.sharding import ShardingSpec
    from alpa_ir.dialects.types import shape_of

    axes = tuple(a for a, n in enumerate(mesh_shape) if n > 1)
    devices = math.prod(mesh_shape)
    specs: dict[int, ShardingSpec] = {}
    for k, arg in enumerate(function.body.block.args):
        shape = tuple(shape_of(arg.type))
        if k not in param_args and shape and shape[0] == rows and rows % devices == 0:
            specs[k] = ShardingSpec((axes, *((),) * (len(shape) - 1)))
        elif (k in param_args and params == "replicated") or not any(
            n % devices == 0 for n in shape
        ):
            specs[k] = ShardingSpec(((),) * len(shape))
    return specs


DATA_PARALLEL_METHODS: Mapping[str, Mapping[str, bool]] = MappingProxyType(
    {
        "data-parallel": {"zero": False, "allow_all_gather": False},
        "zero-2": {"zero": True, "allow_all_gather": False},
        "zero-3": {"zero": True, "allow_all_gather": True, "allow_replicated_parameters": False},
    }
)
"""The cost options of each whole-cluster baseline (module docstring)."""


def sharded_data_parallel(
    method: str,
    ranges: LayerRanges,
    table: StageCostTable,
    options: StageCostOptions,
    rows: int,
    num_micro_batches: int,
    flops: float,
) -> Outcome:
    """One stage on the whole cluster's ``(N, 1)`` view, each layer priced with
    ``method``'s argument shardings and options, the layers' costs added
    (``layer-sum``), simulated as ``alpa-bench`` simulates every plan."""
    from alpa_ir.costs.analytical_stage_cost import AnalyticalStageCostModel
    from alpa_ir.costs.function_plan import with_argument_specs
    from alpa_ir.costs.stage_table import ViewCost
    from alpa_ir.errors import AlpaError
    from alpa_ir.pipeline.stage_construction import StageChoice
    from alpa_ir.tools.bench_baselines import add_views
    from alpa_ir.tools.bench_outcome import Outcome, outcome

    cluster = table.cluster
    whole = max(table.submeshes, key=lambda s: s[0] * s[1])
    view = next(v for v in table.views[whole] if v.shape[0] == cluster.num_devices)
    method_options = replace(
        options, keep_argument_specs=True, memory_fallback=False, **DATA_PARALLEL_METHODS[method]
    )
    model = AnalyticalStageCostModel(method_options)
    params = "free" if method == "zero-3" else "replicated"
    total: ViewCost | None = None
    try:
        for k in range(ranges.num_layers):
            extracted = ranges.function(k, k)
            specs = data_parallel_specs(
                extracted.function, extracted.param_args, rows, view.shape, params=params
            )
            function = with_argument_specs(extracted.function, specs)
            cost = model.stage_cost(function, view, cluster, extracted.param_args)
            m = cost.memory
            layer = ViewCost(cost.latency, m.persistent, m.activations, 0.0, m.transient)
            total = layer if total is None else add_views(total, layer)
    except AlpaError as error:
        return Outcome(method, error=f"layer {k}: {error}".splitlines()[0])
    assert total is not None
    mesh = cluster.logical_mesh(view.shape, tuple(range(cluster.num_devices)))
    stage = StageChoice(0, ranges.num_layers - 1, whole, mesh, total, total.latency)
    return outcome(method, table, [stage], num_micro_batches, flops, options.remat)


def whole_cluster_baselines(
    user: UserStep,
    spec: ModelSpec,
    settings: PlanSettings,
    ranges: LayerRanges,
    table: StageCostTable,
    options: StageCostOptions,
    flops: float,
) -> list[Outcome]:
    """``megatron``, ``data-parallel``, ``zero-2`` and ``zero-3`` (module docstring)."""
    from alpa_ir.ir.module_utils import main_function
    from alpa_ir.pipeline.layer_ranges import LayerRanges
    from alpa_ir.tools.bench_baselines import uniform_grid
    from alpa_ir.tools.bench_outcome import Outcome

    b = settings.num_micro_batches
    out = [uniform_grid(table, b, flops, None, options.remat)]
    devices = table.cluster.num_devices
    batch = batch_rows(user)
    b_dp = data_parallel_micro_batches(batch, devices, b)
    if b_dp == 0:
        why = f"a global batch of {batch} cannot be split over {devices} GPUs"
        return out + [Outcome(m, error=why) for m in DATA_PARALLEL_METHODS]
    if b_dp != b:  # fewer, larger micro-batches: the step imported again
        module = with_layers(import_micro_batch(user, b_dp), b_dp, spec.layers)
        ranges = LayerRanges(main_function(module))
    rows = batch // b_dp
    return out + [
        sharded_data_parallel(m, ranges, table, options, rows, b_dp, flops)
        for m in DATA_PARALLEL_METHODS
    ]


def peak_rss_gib() -> dict[str, float]:
    """Peak resident memory of this process and of its largest finished child
    (the costing workers), GiB (``ru_maxrss``: KiB on Linux)."""
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return {"planner": own / 2**20, "largest_worker": children / 2**20}


@rare_full_collections()  # importing and costing allocate millions of objects
def plan_model(spec: ModelSpec, cluster: Cluster, settings: PlanSettings) -> dict[str, Any]:
    """Import ``spec``'s step (abstract arguments), cut it into automatic layers,
    plan automatic stages on ``cluster`` and simulate the plan and the
    baselines (module docstring). The result is ``alpa-bench``'s
    (:func:`~alpa_ir.tools.bench_suite.bench_module`) with ``import_time``,
    ``parameters``, ``model_flops`` and ``peak_rss_gib`` added."""
    from alpa_ir.tools.bench_suite import bench_module

    b = settings.num_micro_batches
    user = spec.build(True)
    t0 = time.perf_counter()
    module = import_micro_batch(user, b)
    t1 = time.perf_counter()
    with_layers(module, b, spec.layers)
    clustering = time.perf_counter() - t1
    flops = matmul_flops(module) * b

    def retrace(layers: int) -> ModuleOp:
        return with_layers(import_micro_batch(user, b), b, layers)

    def baselines(
        ranges: LayerRanges, table: StageCostTable, options: StageCostOptions
    ) -> list[Outcome]:
        return whole_cluster_baselines(user, spec, settings, ranges, table, options, flops)

    result = bench_module(
        module,
        cluster,
        name=spec.name,
        model_flops=flops,
        num_micro_batches=b,
        cost_mode=settings.cost_mode,
        submesh_space="all",
        cross_stage_comm=False,
        epsilon=0.0,
        time_limit=settings.time_limit,
        workers=settings.workers,
        progress=settings.progress,
        clustering_time=clustering,
        retrace=retrace,
        baselines=baselines,
    )
    result["import_time"] = t1 - t0
    result["data_parallel_micro_batches"] = data_parallel_micro_batches(
        batch_rows(user), cluster.num_devices, b
    )
    result["parameters"] = parameter_count(user)
    result["model_flops"] = flops
    result["peak_rss_gib"] = peak_rss_gib()
    return result


# --- running on the local devices -----------------------------------------------


def relative_difference(a: float, b: float) -> float:
    """``|a - b| / max(|b|, tiny)``."""
    return abs(a - b) / max(abs(b), 1e-30)


def run_model(spec: ModelSpec) -> dict[str, Any]:
    """One step of ``spec`` with ``PipeshardParallel`` on the local devices
    beside one device's ``jax.jit(step)`` from the same state and batch."""
    import jax

    import alpa_ir
    from alpa_ir.api.pipeshard import AutoLayerOption, AutoStageOption, PipeshardParallel

    user = spec.build(False)
    reference = jax.jit(user.step)(*user.args)[1]["loss"]
    reference_loss = float(reference)
    method = PipeshardParallel(
        num_micro_batches=RUN_MICRO_BATCHES,
        layer_option=AutoLayerOption(layer_num=RUN_LAYERS),
        stage_option=AutoStageOption(),
    )
    step = alpa_ir.parallelize(user.step, method=method, batch_argnums=user.batch_argnums)
    t0 = time.perf_counter()
    executable = step.get_executable(*user.args)
    t1 = time.perf_counter()
    state, metrics = step(*user.args)
    loss = float(jax.block_until_ready(metrics["loss"]))
    t2 = time.perf_counter()
    second = jax.block_until_ready(step(state, *user.args[1:]))
    t3 = time.perf_counter()
    del second
    return {
        "model": spec.name,
        "devices": len(jax.devices()),
        "plan": executable.plan_text(max_specs=0),
        "get_executable_time": t1 - t0,
        "first_step_time": t2 - t1,
        "step_time": t3 - t2,
        "loss": loss,
        "reference_loss": reference_loss,
        "relative_difference": relative_difference(loss, reference_loss),
    }


# --- isolation, progress, output ----------------------------------------------


def progress(message: str) -> None:
    """One progress line on stderr."""
    print(f"{PROG}: {message}", file=sys.stderr, flush=True)


def one_line_error(error: BaseException) -> str:
    """``error`` as one line: its type and the first line of its message."""
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}".rstrip(": ")


def _child(connection: multiprocessing.connection.Connection, task: tuple[Any, ...]) -> None:
    """Run ``task`` (see :func:`run_task`) and send back its result."""
    try:
        connection.send(run_task(*task))
    except Exception as error:  # reported as one line; the table goes on
        connection.send({"error": one_line_error(error)})
    finally:
        connection.close()


def run_task(kind: str, name: str, gpus: int, settings: PlanSettings) -> dict[str, Any]:
    """``plan`` ``name`` on ``gpus`` GPUs of the cluster, or ``run`` it locally."""
    spec = model_specs()[name]
    if kind == "run":
        return run_model(spec)
    from alpa_ir.tools.bench_suite import bench_cluster

    return plan_model(spec, bench_cluster(CLUSTER, gpus), settings)


def isolated(task: tuple[Any, ...]) -> dict[str, Any]:
    """:func:`run_task` in a fresh process (its own peak memory, nothing left
    behind for the next model); a process that dies is an error."""
    context = multiprocessing.get_context("spawn")
    receiver, sender = context.Pipe(duplex=False)
    process = context.Process(target=_child, args=(sender, task))
    process.start()
    sender.close()
    try:
        result: dict[str, Any] = receiver.recv()
    except EOFError:
        process.join()
        return {"error": f"the process died (exit code {process.exitcode})"}
    process.join()
    return result


def fmt_seconds(value: float) -> str:
    return f"{value:.1f}" if value >= 1 else f"{value:.2f}"


def plan_text(stages: Sequence[dict[str, Any]]) -> str:
    """Stages as ``L0-5 1x4 (2x2)``: layers, submesh, logical mesh."""
    return " \\| ".join(
        f"L{s['layers'][0]}-{s['layers'][1]} {s['submesh'][0]}x{s['submesh'][1]} "
        f"({'x'.join(str(n) for n in s['logical_mesh'])})"
        for s in stages
    )


def pflops_cell(outcome: dict[str, Any] | None) -> str:
    """A method's PFLOPS, ``OOM`` (and what it would reach) or ``n/a``."""
    if outcome is None:
        return ""
    if outcome["error"].startswith("out of memory"):
        return f"OOM ({outcome['pflops_ignoring_memory']:.3g})"
    if outcome["error"]:
        return "n/a"
    return f"{outcome['pflops']:.3g}"


def plan_rows(results: Sequence[dict[str, Any]]) -> list[str]:
    """The planning table: times, memory and Alpa's plan."""
    rows = [
        "| model | GPUs | params | layers | B | import s | clustering s | costing s | stage DP s "
        "| other s | plan total s | peak RSS GiB (planner / worker) | Alpa's plan "
        "(layers, submesh, logical mesh) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in results:
        if "error" in r:
            continue
        c, rss = r["compile_time"], r["peak_rss_gib"]
        alpa = r["outcomes"][0]
        plan = plan_text(alpa["stages"]) if alpa["stages"] else alpa["error"][:80]
        rows.append(
            f"| {r['model']} | {r['gpus']} | {r['parameters'] / 1e6:.0f}M | {r['layers']} "
            f"| {r['num_micro_batches']} | {fmt_seconds(r['import_time'])} "
            f"| {fmt_seconds(c['clustering'])} | {fmt_seconds(c['costing'])} "
            f"| {fmt_seconds(c['dp'])} | {fmt_seconds(c['other'])} "
            f"| {fmt_seconds(c['total'] + r['import_time'])} "
            f"| {rss['planner']:.2f} / {rss['largest_worker']:.2f} | {plan} |"
        )
    return rows


def throughput_rows(results: Sequence[dict[str, Any]]) -> list[str]:
    """The simulated PFLOPS of every method."""
    rows = [
        "| model | GPUs | TFLOP/step | B (DP) | " + " | ".join(METHODS) + " |",
        "|---|---:|---:|---:|" + "---:|" * len(METHODS),
    ]
    for r in results:
        if "error" in r:
            continue
        by_method = {o["method"]: o for o in r["outcomes"]}
        cells = " | ".join(pflops_cell(by_method.get(m)) for m in METHODS)
        b_dp = r["data_parallel_micro_batches"] or "-"
        rows.append(
            f"| {r['model']} | {r['gpus']} | {r['model_flops'] / 1e12:.2f} "
            f"| {r['num_micro_batches']} ({b_dp}) | {cells} |"
        )
    return rows


def run_rows(runs: Sequence[dict[str, Any]]) -> list[str]:
    """The ``--run`` table."""
    rows = [
        "| model | get_executable s | first step s | step s | loss | jax.jit loss | rel. diff |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in runs:
        if "error" in r:
            continue
        rows.append(
            f"| {r['model']} | {fmt_seconds(r['get_executable_time'])} "
            f"| {fmt_seconds(r['first_step_time'])} | {fmt_seconds(r['step_time'])} "
            f"| {r['loss']:.6f} | {r['reference_loss']:.6f} | {r['relative_difference']:.2e} |"
        )
    return rows


def error_lines(results: Sequence[dict[str, Any]], runs: Sequence[dict[str, Any]]) -> list[str]:
    """One line per failed model or phase, and per baseline without a plan."""
    lines = []
    for r in results:
        where = f"{r['model']} on {r['gpus']} GPUs"
        if "error" in r:
            lines.append(f"- {where}: planning failed: {r['error']}")
            continue
        for o in r["outcomes"]:
            if o["error"]:
                lines.append(f"- {where}, {o['method']}: {o['error'].splitlines()[0][:200]}")
    lines += [f"- {r['model']}, --run: {r['error']}" for r in runs if "error" in r]
    return lines


def markdown(
    results: Sequence[dict[str, Any]], runs: Sequence[dict[str, Any]], machine: str
) -> str:
    """The whole report as Markdown."""
    parts = [
        f"Planned for `{CLUSTER}` (V100 16 GB, 8 per node), nothing run; {machine}.",
        "",
        *plan_rows(results),
        "",
        "Simulated PFLOPS (OOM: the plan does not fit in 16 GB, in brackets what it "
        "would reach; n/a: no plan, see below). B: micro-batches of every method but "
        "the data-parallel ones, (B) theirs:",
        "",
        *throughput_rows(results),
    ]
    if runs:
        parts += [
            "",
            f"One step on {RUN_DEVICES} CPU devices, PipeshardParallel"
            f"(num_micro_batches={RUN_MICRO_BATCHES}, AutoLayerOption(layer_num={RUN_LAYERS}), "
            "AutoStageOption()) against jax.jit on one device:",
            "",
            *run_rows(runs),
        ]
    errors = error_lines(results, runs)
    if errors:
        parts += ["", "Errors and baselines without a plan:", "", *errors]
    return "\n".join(parts) + "\n"


def machine_text() -> str:
    """This machine in a few words (cores, memory)."""
    pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return f"planned on {os.cpu_count()} CPU cores, {pages / 2**30:.0f} GiB"


# --- command line ---------------------------------------------------------------


def _model_list(text: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in text.split(","))
    known = model_specs()
    for n in names:
        if n not in known:
            raise argparse.ArgumentTypeError(f"unknown model {n!r}; known: {', '.join(known)}")
    if len(set(names)) != len(names):
        raise argparse.ArgumentTypeError(f"names a model twice: {text!r}")
    return names


def _gpu_list(text: str) -> tuple[int, ...]:
    counts = tuple(positive_int(n) for n in text.split(","))
    if len(set(counts)) != len(counts):
        raise argparse.ArgumentTypeError(f"names a GPU count twice: {text!r}")
    return counts


def build_parser() -> OneLineParser:
    parser = OneLineParser(prog=PROG, description=__doc__.splitlines()[0])
    parser.add_argument(
        "--models",
        type=_model_list,
        default=tuple(model_specs()),
        help=f"comma-separated models ({', '.join(model_specs())})",
    )
    parser.add_argument(
        "--gpus", type=_gpu_list, default=(8, 64), help=f"comma-separated GPU counts of {CLUSTER}"
    )
    parser.add_argument(
        "--micro-batches",
        type=positive_int,
        default=4,
        help=f"micro-batches per step (dividing the global batch of {BATCH})",
    )
    parser.add_argument(
        "--workers",
        type=positive_int,
        default=os.cpu_count() or 1,
        help="processes that cost the stage-mesh pairs",
    )
    parser.add_argument(
        "--time-limit", type=positive_seconds, default=60.0, help="ILP time limit in seconds"
    )
    parser.add_argument(
        "--run",
        action="store_true",
        help=f"also run one step of the small models on {RUN_DEVICES} local CPU devices",
    )
    parser.add_argument(
        "--out",
        metavar="FILE",
        help="write the Markdown report to FILE and the JSON beside it (.json); "
        "default: Markdown on stdout",
    )
    return parser


def check_args(parser: OneLineParser, args: argparse.Namespace) -> None:
    """Every option checked before any work."""
    from alpa_ir.errors import AlpaError
    from alpa_ir.tools.bench_suite import bench_cluster

    if BATCH % args.micro_batches:
        parser.error(
            f"--micro-batches must divide the global batch {BATCH}, got {args.micro_batches}"
        )
    for gpus in args.gpus:
        try:
            bench_cluster(CLUSTER, gpus)
        except AlpaError as error:
            parser.error(f"--gpus {gpus}: {error}")
    if args.out is not None and not Path(args.out).parent.is_dir():
        parser.error(f"--out {args.out}: folder {Path(args.out).parent} does not exist")


def plan_all(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Every model on every GPU count, each in a fresh process."""
    settings = PlanSettings(
        num_micro_batches=args.micro_batches, workers=args.workers, time_limit=args.time_limit
    )
    results = []
    for name in args.models:
        for gpus in args.gpus:
            progress(f"{name} on {gpus} GPUs: planning")
            result = isolated(("plan", name, gpus, settings))
            result.setdefault("model", name)
            result.setdefault("gpus", gpus)
            progress(f"{name} on {gpus} GPUs: {_plan_summary(result)}")
            results.append(result)
    return results


def _plan_summary(result: dict[str, Any]) -> str:
    if "error" in result:
        return f"error: {result['error']}"
    alpa = result["outcomes"][0]
    total = result["compile_time"]["total"] + result["import_time"]
    return f"planned in {total:.1f} s, Alpa {alpa['pflops']:.3g} PFLOPS"


def run_all(args: argparse.Namespace) -> list[dict[str, Any]]:
    """``--run``: one step of each model that can run here, each in a fresh process."""
    specs = model_specs()
    runs = []
    for name in args.models:
        if not specs[name].can_run:
            continue
        progress(f"{name}: running one step on {RUN_DEVICES} CPU devices")
        result = isolated(("run", name, 0, PlanSettings()))
        result.setdefault("model", name)
        summary = (
            result.get("error") or f"relative loss difference {result['relative_difference']:.2e}"
        )
        progress(f"{name}: {summary}")
        runs.append(result)
    return runs


def set_local_devices(environ: Any) -> None:
    """JAX on the CPU with ``RUN_DEVICES`` host devices (added to ``XLA_FLAGS``)."""
    environ["JAX_PLATFORMS"] = "cpu"
    flags = environ.get("XLA_FLAGS", "")
    if "xla_force_host_platform_device_count" not in flags:
        count = f"--xla_force_host_platform_device_count={RUN_DEVICES}"
        environ["XLA_FLAGS"] = f"{flags} {count}".strip()


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    check_args(parser, args)
    set_local_devices(os.environ)  # before jax loads; the fresh processes inherit it
    results = plan_all(args)
    runs = run_all(args) if args.run else []
    report = markdown(results, runs, machine_text())
    if args.out is None:
        print(report, end="")
        return 0
    out = Path(args.out)
    out.write_text(report)
    data = {"machine": machine_text(), "plans": results, "runs": runs}
    out.with_suffix(".json").write_text(json.dumps(data, indent=1, default=float))
    progress(f"wrote {out} and {out.with_suffix('.json')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
