"""Tests of the model zoo: tiny steps train, markers appear, paper sizes trace abstractly."""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Iterator
from functools import cache
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.extend.core import ClosedJaxpr, Jaxpr

from alpa_ir.errors import AlpaError
from alpa_ir.models import (
    BertConfig,
    GPTConfig,
    MLPConfig,
    MoEConfig,
    WResNetConfig,
    bert_tiny_step,
    expert_capacity,
    family_of,
    get_config,
    gpt_tiny_step,
    list_configs,
    llama_tiny_step,
    make_train_step,
    mlp_tiny_step,
    moe_tiny_step,
    param_count,
    top2_gating,
    train_step_flops,
    wresnet_tiny_step,
)
from alpa_ir.models.wresnet import forward_flops

TINY = ["mlp-tiny", "gpt-tiny", "moe-tiny", "wresnet-tiny", "bert-tiny", "llama-tiny"]
PAPER = [
    "gpt3-350m", "gpt3-1.3b", "gpt3-2.6b", "gpt3-6.7b", "gpt3-15b", "gpt3-39b",
    "moe-380m", "moe-1.3b", "moe-2.4b", "moe-10b", "moe-27b", "moe-70b",
    "wresnet-250m", "wresnet-1b", "wresnet-2b", "wresnet-4b", "wresnet-6.8b", "wresnet-13b",
]  # fmt: skip
PRETRAINING = [
    "megatron-1.7b", "megatron-3.6b", "megatron-7.5b", "megatron-18b", "megatron-39b",
    "megatron-76b", "megatron-145b", "megatron-310b", "megatron-530b", "megatron-1t",
    "llama3-8b", "llama3-70b", "llama3-405b", "llama3-405b-128k",
]  # fmt: skip


# ---------------------------------------------------------------- jaxpr helpers


def all_eqns(jaxpr: Jaxpr) -> Iterator[Any]:
    """Every equation, descending into sub-jaxprs (jit, custom_jvp, ...)."""
    for eqn in jaxpr.eqns:
        yield eqn
        for param in eqn.params.values():
            for value in param if isinstance(param, tuple | list) else (param,):
                if isinstance(value, ClosedJaxpr):
                    yield from all_eqns(value.jaxpr)
                elif isinstance(value, Jaxpr):
                    yield from all_eqns(value)


def marker_counts(jaxpr: Jaxpr) -> dict[str, int]:
    counts = {"layer": 0, "grad": 0}
    for eqn in all_eqns(jaxpr):
        if eqn.primitive.name == "pipeline_marker":
            counts[eqn.params["kind"]] += 1
    return counts


def matmul_flops(jaxpr: Jaxpr) -> float:
    """2 FLOPs per multiply-add of every dot_general and convolution in the jaxpr."""
    total = 0.0
    for eqn in all_eqns(jaxpr):
        out = eqn.outvars[0].aval.shape
        if eqn.primitive.name == "dot_general":
            (contract, _), _ = eqn.params["dimension_numbers"]
            lhs = eqn.invars[0].aval.shape
            total += 2.0 * math.prod(out) * math.prod(lhs[d] for d in contract)
        elif eqn.primitive.name == "conv_general_dilated":
            rhs = eqn.invars[1].aval.shape
            out_feature_dim = eqn.params["dimension_numbers"].rhs_spec[0]
            total += 2.0 * math.prod(out) * math.prod(rhs) / rhs[out_feature_dim]
    return total


def num_boundaries(config: Any) -> int:
    if isinstance(config, WResNetConfig):
        return len(config.stage_sizes) - 1
    return config.num_layers - 1


# ---------------------------------------------------------------- cached steps


# -O0 for the LLVM backend: these steps run a handful of times, compile time dominates.
FAST_COMPILE = {"xla_backend_optimization_level": 0}


def jit(fn: Any, **kwargs: Any) -> Any:
    return jax.jit(fn, compiler_options=FAST_COMPILE, **kwargs)


@cache
def jitted_step(name: str) -> tuple[Any, tuple[Any, Any]]:
    step, args = make_train_step(name)
    return jit(step), args


def run_steps(step: Any, state: Any, batch: Any, n: int) -> tuple[Any, list[float]]:
    losses = []
    for _ in range(n):
        state, loss = step(state, batch)
        losses.append(float(loss))
    return state, losses


# ---------------------------------------------------------------- registry


def test_registry_lists_tiny_and_paper_configs() -> None:
    names = list_configs()
    assert set(TINY) | set(PAPER) | set(PRETRAINING) == set(names)
    for name in names:
        assert get_config(name) is get_config(name)
    assert get_config("gpt3-39b").num_gpus == 64
    assert get_config("moe-70b").num_experts == 64
    assert get_config("wresnet-13b").stage_sizes == (3, 4, 23, 3)
    assert get_config("gpt3-1.3b").batch_size == 1024


def test_unknown_names_raise_alpa_error() -> None:
    with pytest.raises(AlpaError, match=r"unknown model config 'gpt-huge'.*gpt3-39b"):
        get_config("gpt-huge")
    with pytest.raises(AlpaError, match="unknown optimizer"):
        make_train_step("mlp-tiny", optimizer="lamb")  # type: ignore[arg-type]
    with pytest.raises(AlpaError, match="not a model config"):
        make_train_step(object())


def test_inconsistent_configs_raise_alpa_error() -> None:
    with pytest.raises(AlpaError, match="not divisible by num_heads"):
        GPTConfig(64, 30, 2, 4, 16, 8)
    with pytest.raises(AlpaError, match="expert_group_size"):
        MoEConfig(64, 32, 2, 4, 16, 8, num_experts=8, expert_group_size=48)


def test_factories_match_named_configs() -> None:
    for factory, name in [
        (mlp_tiny_step, "mlp-tiny"),
        (gpt_tiny_step, "gpt-tiny"),
        (moe_tiny_step, "moe-tiny"),
        (wresnet_tiny_step, "wresnet-tiny"),
        (bert_tiny_step, "bert-tiny"),
        (llama_tiny_step, "llama-tiny"),
    ]:
        step, (state, batch) = factory()
        _, (ref_state, ref_batch) = make_train_step(name)
        assert callable(step)
        chex_equal = jax.tree.map(np.array_equal, (state, batch), (ref_state, ref_batch))
        assert all(jax.tree.leaves(chex_equal))


# ---------------------------------------------------------------- tiny steps


@pytest.mark.parametrize("name", TINY)
def test_tiny_step_trains(name: str) -> None:
    step, (state, batch) = jitted_step(name)
    assert all(x.shape[0] == 8 for x in jax.tree.leaves(batch))
    new_state, losses = run_steps(step, state, batch, 5)
    assert jax.tree.structure(new_state) == jax.tree.structure(state)
    assert jax.tree.map(lambda a: (a.shape, a.dtype), new_state) == jax.tree.map(
        lambda a: (a.shape, a.dtype), state
    )
    assert all(math.isfinite(x) for x in losses)
    assert losses[-1] < losses[0]
    # Every parameter receives a gradient within five steps.
    changed = jax.tree.map(
        lambda a, b: not np.array_equal(a, b), state["params"], new_state["params"]
    )
    assert all(jax.tree.leaves(changed)), changed
    if name == "wresnet-tiny":
        assert set(state) == {"params", "opt_state", "batch_stats"}
        stats_changed = jax.tree.map(
            lambda a, b: not np.array_equal(a, b), state["batch_stats"], new_state["batch_stats"]
        )
        assert all(jax.tree.leaves(stats_changed))
    else:
        assert set(state) == {"params", "opt_state"}


def test_tiny_loss_is_a_float32_scalar() -> None:
    step, (state, batch) = jitted_step("gpt-tiny")
    _, loss = step(state, batch)
    assert loss.shape == () and loss.dtype == jnp.float32


def test_sgd_and_classification_loss_train() -> None:
    config = MLPConfig(16, 32, 3, 8, 8, loss="xent")
    step, (state, batch) = make_train_step(config, optimizer="sgd", learning_rate=0.05)
    assert jax.tree.leaves(state["opt_state"]) == []
    assert batch["y"].dtype == jnp.int32 and batch["y"].shape == (8,)
    assert int(batch["y"].max()) < 8
    _, losses = run_steps(jit(step), state, batch, 4)
    assert losses[-1] < losses[0]


def test_bert_classification_head() -> None:
    config = BertConfig(16, 2, 2, 8, 8, head="classify", num_classes=4)
    step, (state, batch) = make_train_step(config, abstract=True)
    assert batch["y"].shape == (8,) and batch["y"].dtype == jnp.int32
    assert state["params"]["classifier"]["kernel"].shape == (16, 4)
    counted = matmul_flops(jax.make_jaxpr(step)(state, batch).jaxpr)
    assert train_step_flops(config) == pytest.approx(counted, rel=1e-9)


def test_seed_is_deterministic() -> None:
    _, (state_a, batch_a) = make_train_step("gpt-tiny", seed=0)
    _, (state_b, batch_b) = make_train_step("gpt-tiny", seed=0)
    _, (_, batch_c) = make_train_step("gpt-tiny", seed=1)
    assert all(
        jax.tree.leaves(jax.tree.map(np.array_equal, (state_a, batch_a), (state_b, batch_b)))
    )
    assert not np.array_equal(batch_a["tokens"], batch_c["tokens"])
    assert int(batch_a["tokens"].max()) < 64 and int(batch_a["tokens"].min()) >= 0
    np.testing.assert_array_equal(batch_a["labels"][:, :-1], batch_a["tokens"][:, 1:])


# ---------------------------------------------------------------- markers


@pytest.mark.parametrize("name", TINY)
@pytest.mark.parametrize("markers", [False, True])
def test_markers_in_jaxpr(name: str, markers: bool) -> None:
    config = dataclasses.replace(get_config(name), pipeline_markers=markers)
    step, args = make_train_step(config, abstract=True)
    jaxpr = jax.make_jaxpr(step)(*args).jaxpr
    counts = marker_counts(jaxpr)
    assert counts["grad"] == 1
    # One forward marker per boundary and its mirror in the backward pass.
    assert counts["layer"] == (2 * num_boundaries(config) if markers else 0)
    assert num_boundaries(config) >= 1
    grad_marker = next(e for e in all_eqns(jaxpr) if e.params.get("kind") == "grad")
    assert len(grad_marker.invars) == len(jax.tree.leaves(args[0]["params"]))


# ---------------------------------------------------------------- abstract args


@pytest.mark.parametrize("name", TINY)
def test_abstract_args_match_real_args(name: str) -> None:
    _, abstract = make_train_step(name, abstract=True)
    _, real = jitted_step(name)
    assert all(isinstance(x, jax.ShapeDtypeStruct) for x in jax.tree.leaves(abstract))
    assert jax.tree.structure(abstract) == jax.tree.structure(real)
    shapes = jax.tree.map(lambda a: (a.shape, a.dtype), abstract)
    assert shapes == jax.tree.map(lambda a: (a.shape, a.dtype), real)


def _nominal(name: str) -> float:
    number, unit = re.fullmatch(r".*-([\d.]+)([mb])", name).groups()  # type: ignore[union-attr]
    return float(number) * (1e6 if unit == "m" else 1e9)


@pytest.mark.parametrize("name", PAPER)
def test_paper_param_counts_match_names(name: str) -> None:
    count = param_count(name)
    assert abs(count - _nominal(name)) / _nominal(name) < 0.15, count


def test_paper_step_traces_abstractly() -> None:
    step, args = make_train_step("moe-380m", abstract=True)
    assert all(isinstance(x, jax.ShapeDtypeStruct) for x in jax.tree.leaves(args))
    state, batch = args
    assert batch["tokens"].shape == (1024, 1024)
    assert state["params"]["embed"]["wte"]["embedding"].shape == (32000, 768)
    assert state["params"]["block_1"]["moe"]["wi"].shape == (8, 768, 8 * 768)
    out_state, loss = jax.eval_shape(step, *args)
    assert loss.shape == () and jax.tree.structure(out_state) == jax.tree.structure(state)


def test_gpt_param_count_closed_form() -> None:
    """12h² + 13h per block, tied embedding V·h, positions s·h, final LayerNorm 2h."""
    cfg = get_config("gpt-tiny")
    h, layers = cfg.hidden_size, cfg.num_layers
    expected = layers * (12 * h * h + 13 * h) + (cfg.vocab_size + cfg.seq_len) * h + 2 * h
    assert param_count(cfg) == expected


# ---------------------------------------------------------------- FLOPs


@pytest.mark.parametrize("name", ["mlp-tiny", "gpt-tiny", "moe-tiny", "bert-tiny", "llama-tiny"])
def test_train_step_flops_match_jaxpr(name: str) -> None:
    step, args = make_train_step(name, abstract=True)
    counted = matmul_flops(jax.make_jaxpr(step)(*args).jaxpr)
    assert train_step_flops(name) == pytest.approx(counted, rel=1e-9)


def test_wresnet_forward_flops_match_jaxpr() -> None:
    cfg = get_config("wresnet-tiny")
    family = family_of(cfg)
    _, (state, batch) = make_train_step(cfg, abstract=True)
    variables = {"params": state["params"], "batch_stats": state["batch_stats"]}
    jaxpr = jax.make_jaxpr(lambda v, b: family.loss(cfg, v, b))(variables, batch).jaxpr
    stem, rest = forward_flops(cfg)
    assert stem + rest == pytest.approx(matmul_flops(jaxpr), rel=1e-9)
    assert train_step_flops(cfg) == pytest.approx(2 * stem + 3 * rest)


def test_gpt_flops_follow_megatron_formula() -> None:
    cfg = get_config("gpt3-39b")
    b, s, layers, h, v = (
        cfg.batch_size,
        cfg.seq_len,
        cfg.num_layers,
        cfg.hidden_size,
        cfg.vocab_size,
    )
    megatron = 72 * b * s * layers * h * h * (1 + s / (6 * h) + v / (12 * layers * h))
    assert train_step_flops(cfg) == pytest.approx(megatron, rel=1e-12)


# ---------------------------------------------------------------- MoE gating


def test_expert_capacity() -> None:
    assert expert_capacity(2048, 8, 1.0) == 512
    assert expert_capacity(2048, 48, 1.0) == 86
    assert expert_capacity(16, 8, 2.0) == 8
    assert expert_capacity(4, 64, 1.0) == 1
    assert expert_capacity(4, 2, 4.0) == 4
    assert get_config("moe-tiny").capacity == 4


def _gating(logits: np.ndarray, capacity: int) -> tuple[np.ndarray, np.ndarray, float]:
    g = jit(top2_gating, static_argnums=1)(jnp.asarray(logits, jnp.float32), capacity)
    return np.asarray(g.combine), np.asarray(g.dispatch), float(g.aux_loss)


def test_gating_respects_top2_and_capacity() -> None:
    logits = np.random.default_rng(3).normal(size=(3, 32, 4))
    capacity = 5
    combine, dispatch, _ = _gating(logits, capacity)
    assert set(np.unique(dispatch)) <= {0.0, 1.0}
    per_token_expert = dispatch.sum(axis=3)  # [G, S, E]
    assert per_token_expert.max() <= 1  # at most one slot per expert
    assert per_token_expert.sum(axis=2).max() <= 2  # at most two experts per token
    assert dispatch.sum(axis=1).max() <= 1  # a slot holds at most one token
    assert per_token_expert.sum(axis=1).max() <= capacity
    assert (per_token_expert.sum(axis=1) == capacity).any()  # capacity binds here
    top2 = np.argsort(-logits, axis=-1)[..., :2]
    chosen = np.argwhere(per_token_expert > 0)
    for g, s, e in chosen:
        assert e in top2[g, s]
    assert np.all(combine[dispatch == 0] == 0)
    assert np.all(combine >= 0) and combine.sum(axis=(2, 3)).max() <= 1 + 1e-6


def test_gating_without_drops_is_renormalised_top2() -> None:
    logits = np.random.default_rng(4).normal(size=(2, 16, 8))
    combine, dispatch, _ = _gating(logits, capacity=16)
    per_token_expert = dispatch.sum(axis=3)
    top2 = np.sort(np.argsort(-logits, axis=-1)[..., :2], axis=-1)
    assert np.all(per_token_expert.sum(axis=2) == 2)
    np.testing.assert_array_equal(
        np.sort(np.argwhere(per_token_expert)[:, 2].reshape(2, 16, 2)), top2
    )
    gates = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    weights = combine.sum(axis=3)
    picked = np.take_along_axis(gates, top2, -1)
    np.testing.assert_allclose(
        np.take_along_axis(weights, top2, -1), picked / picked.sum(-1, keepdims=True), rtol=1e-5
    )


def test_gating_fills_first_choices_before_second_choices() -> None:
    # Tokens 0, 1 prefer expert 1 then 0; tokens 2, 3 prefer expert 0 then 1.
    logits = np.array([[[2.0, 3.0, 0, 0], [2.0, 3.0, 0, 0], [3.0, 2.0, 0, 0], [3.0, 2.0, 0, 0]]])
    _, dispatch, _ = _gating(logits, capacity=2)
    slots = {(s, e, c) for _, s, e, c in np.argwhere(dispatch)}
    assert slots == {(0, 1, 0), (1, 1, 1), (2, 0, 0), (3, 0, 1)}


def test_gating_drops_overflow_in_token_order() -> None:
    logits = np.tile(np.array([3.0, 2.0, 0.0, 0.0]), (1, 4, 1))
    _, dispatch, _ = _gating(logits, capacity=2)
    slots = {(s, e, c) for _, s, e, c in np.argwhere(dispatch)}
    assert slots == {(0, 0, 0), (1, 0, 1), (0, 1, 0), (1, 1, 1)}


def test_aux_loss_penalises_imbalance() -> None:
    experts = 4
    balanced = np.eye(experts)[np.arange(16) % experts][None] * 20.0
    collapsed = np.tile(np.eye(experts)[0], (1, 16, 1)) * 20.0
    _, _, aux_balanced = _gating(balanced, capacity=8)
    _, _, aux_collapsed = _gating(collapsed, capacity=8)
    assert aux_balanced == pytest.approx(1.0, rel=1e-3)
    assert aux_collapsed == pytest.approx(experts, rel=1e-3)
