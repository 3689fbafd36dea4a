"""The models of real pre-training runs: Megatron-LM's Table 1 GPT shapes and
the Llama 3 family (RMSNorm, RoPE, SwiGLU, grouped-query attention), traced
abstractly at full size and checked numerically at tiny size."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from alpa_ir.errors import AlpaError
from alpa_ir.models import GPTConfig, LlamaConfig, get_config, make_train_step, param_count
from alpa_ir.models.llama import GroupedQueryAttention, Llama, RMSNorm, apply_rope, rope_tables

# Megatron-LM (SC'21) Table 1: name -> (billions of parameters, GPUs, global batch)
MEGATRON_TABLE = {
    "megatron-1.7b": (1.7, 32, 512),
    "megatron-3.6b": (3.6, 64, 512),
    "megatron-7.5b": (7.5, 128, 512),
    "megatron-18b": (18.4, 256, 1024),
    "megatron-39b": (39.1, 512, 1536),
    "megatron-76b": (76.1, 1024, 1792),
    "megatron-145b": (145.6, 1536, 2304),
    "megatron-310b": (310.1, 1920, 2160),
    "megatron-530b": (529.6, 2520, 2520),
    "megatron-1t": (1008.0, 3072, 3072),
}
LLAMA3 = {"llama3-8b": 8.03, "llama3-70b": 70.6, "llama3-405b": 405.9}


def gpt_params(c: GPTConfig) -> int:
    h = c.hidden_size
    return c.num_layers * (12 * h * h + 13 * h) + (c.vocab_size + c.seq_len) * h + 2 * h


def llama_params(c: LlamaConfig) -> int:
    h, kv = c.hidden_size, c.num_kv_heads * c.head_dim
    layer = 2 * h + 2 * h * h + 2 * h * kv + 3 * h * c.ffn_size
    return c.num_layers * layer + 2 * c.vocab_size * h + h


@pytest.mark.parametrize("name", list(MEGATRON_TABLE))
def test_megatron_table1_shapes(name: str) -> None:
    billions, gpus, batch = MEGATRON_TABLE[name]
    c = get_config(name)
    assert isinstance(c, GPTConfig)
    assert (c.seq_len, c.vocab_size, c.num_gpus, c.batch_size) == (2048, 51200, gpus, batch)
    assert c.dtype == jnp.bfloat16
    assert gpt_params(c) / 1e9 == pytest.approx(billions, rel=0.035)  # the table rounds


def test_llama3_shapes() -> None:
    for name, billions in LLAMA3.items():
        c = get_config(name)
        assert isinstance(c, LlamaConfig)
        assert (c.seq_len, c.vocab_size, c.num_kv_heads) == (8192, 128256, 8)
        assert c.batch_size * c.seq_len == 16 * 2**20 and c.dtype == jnp.bfloat16
        assert llama_params(c) / 1e9 == pytest.approx(billions, rel=0.005)
    long = get_config("llama3-405b-128k")
    assert (long.seq_len, long.batch_size, long.num_gpus) == (131072, 128, 16384)
    tiny = get_config("llama-tiny")
    assert param_count(tiny) == llama_params(tiny)


def test_full_size_step_traces_abstractly_in_bf16_with_fp32_state() -> None:
    _, (state, batch) = make_train_step("megatron-1.7b", abstract=True)
    assert batch["tokens"].shape == (512, 2048)
    assert state["params"]["block_23"]["mlp"]["fc1"]["kernel"].shape == (2304, 4 * 2304)
    leaves = jax.tree.leaves(state)
    assert all(isinstance(x, jax.ShapeDtypeStruct) for x in leaves)
    assert {x.dtype for x in leaves if x.ndim} == {jnp.dtype(jnp.float32)}  # master + Adam
    mu = state["opt_state"][0].mu
    assert jax.tree.structure(mu) == jax.tree.structure(state["params"])
    # the step's computation, on two of its layers: bf16 matmuls
    two = dataclasses.replace(get_config("megatron-1.7b"), num_layers=2, batch_size=8)
    step, (state, batch) = make_train_step(two, abstract=True)
    jaxpr = jax.make_jaxpr(step)(state, batch).jaxpr
    dots = [e for e in jaxpr.eqns if e.primitive.name == "dot_general"]
    assert dots and all(e.outvars[0].aval.dtype == jnp.bfloat16 for e in dots[:8])


def test_llama_names_are_bad_input_one_line() -> None:
    with pytest.raises(AlpaError, match="num_heads 4 is not a multiple of num_kv_heads 3"):
        LlamaConfig(64, 32, 1, 4, 3, 64, 8, 2)
    with pytest.raises(AlpaError, match="even head dimension"):
        LlamaConfig(64, 12, 1, 4, 2, 64, 8, 2)


def test_rmsnorm_is_the_formula() -> None:
    x = jax.random.normal(jax.random.key(0), (2, 3, 8))
    norm = RMSNorm(1e-5, jnp.float32)
    params = {"params": {"scale": jnp.arange(1.0, 9.0)}}
    got = norm.apply(params, x)
    want = x / np.sqrt(np.mean(np.square(x), axis=-1, keepdims=True) + 1e-5) * np.arange(1, 9)
    np.testing.assert_allclose(got, want, rtol=1e-5)


def test_rope_scores_depend_on_relative_position_only() -> None:
    d, seq = 8, 12
    cos, sin = rope_tables(seq, d, 10_000.0)
    q = jnp.broadcast_to(jax.random.normal(jax.random.key(1), (d,)), (1, seq, 1, d))
    k = jnp.broadcast_to(jax.random.normal(jax.random.key(2), (d,)), (1, seq, 1, d))
    qr, kr = apply_rope(q, cos, sin)[0, :, 0], apply_rope(k, cos, sin)[0, :, 0]
    scores = np.asarray(qr @ kr.T)
    for offset in (0, 1, 5):
        diagonal = np.diagonal(scores, offset)
        np.testing.assert_allclose(diagonal, diagonal[0], rtol=1e-4, atol=1e-5)
    assert not np.allclose(np.diagonal(scores, 0)[0], np.diagonal(scores, 3)[0])
    np.testing.assert_allclose(qr[0], q[0, 0, 0], rtol=1e-6)  # position 0: no rotation


def test_grouped_query_attention_shares_kv_heads_within_groups() -> None:
    cfg = dataclasses.replace(get_config("llama-tiny"), num_heads=4, num_kv_heads=2)
    attn = GroupedQueryAttention(cfg)
    x = jax.random.normal(jax.random.key(3), (2, 6, cfg.hidden_size))
    params = attn.init(jax.random.key(4), x)
    kernels = params["params"]
    assert kernels["wk"]["kernel"].shape == (32, 2 * cfg.head_dim)
    assert kernels["wq"]["kernel"].shape == (32, 32)
    # the same layer as multi-head attention whose K/V heads are the shared ones repeated
    mha = dataclasses.replace(cfg, num_kv_heads=4)
    d = cfg.head_dim

    def repeat(w: jax.Array) -> jax.Array:
        return jnp.repeat(w.reshape(32, 2, d), 2, axis=1).reshape(32, 4 * d)

    expanded = jax.tree.map(lambda a: a, kernels)
    expanded["wk"] = {"kernel": repeat(kernels["wk"]["kernel"])}
    expanded["wv"] = {"kernel": repeat(kernels["wv"]["kernel"])}
    want = GroupedQueryAttention(mha).apply({"params": expanded}, x)
    np.testing.assert_allclose(attn.apply(params, x), want, rtol=1e-5, atol=1e-6)


def test_llama_is_causal() -> None:
    cfg = get_config("llama-tiny")
    tokens = jax.random.randint(jax.random.key(5), (1, cfg.seq_len), 0, cfg.vocab_size)
    model = Llama(cfg)
    params = model.init(jax.random.key(6), tokens)
    changed = tokens.at[0, -1].set((tokens[0, -1] + 1) % cfg.vocab_size)
    a, b = model.apply(params, tokens), model.apply(params, changed)
    np.testing.assert_allclose(a[0, :-1], b[0, :-1], rtol=1e-5, atol=1e-6)
    assert not np.allclose(a[0, -1], b[0, -1])
