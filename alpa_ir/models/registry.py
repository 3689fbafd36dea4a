"""Named model configurations: tiny test models and the Alpa paper's benchmark sizes.

Paper sizes follow Alpa's Appendix B (papers/NOTES.md): sequence length 1024,
GPT-3 vocabulary 51200 and MoE vocabulary 32000, Wide-ResNet on 224×224×3
images with 1024 classes; ``num_gpus`` is the GPU count each size was run on.
Global batch sizes: 1024 for GPT-3 (the paper); 1024 for MoE and 1536 for
Wide-ResNet, the values in Alpa's benchmark suites (the paper only says "the
suggested global batch size"). MoE sizes use expert groups of 2048 tokens and an
expert MLP ratio of 8, as Alpa's benchmark did (its parameter counts need it);
the heads of MoE 1.3B/2.4B/10B are not given in the table and are 16 like 380M.

Real pre-training runs: the GPT shapes of Megatron-LM's Table 1 (Narayanan et
al., SC'21: heads, hidden size, layers, GPU count and global batch; sequence
2048, vocabulary 51200, tied embedding and learned positions) and Llama 3's
8B, 70B and 405B (Dubey et al. 2024, Table 3: sequence 8192, vocabulary
128256, 8 K/V heads; global batch 2048 sequences, 16M tokens, as the 405B run;
``llama3-405b-128k`` is its long-context stage, sequence 131072 and 128
sequences). Both train in bf16 with fp32 master weights and Adam (16 bytes per
parameter), and are only ever traced abstractly.
"""

from __future__ import annotations

import functools
from dataclasses import replace
from types import MappingProxyType
from typing import Any

import jax.numpy as jnp

from alpa_ir.errors import AlpaError
from alpa_ir.models import bert, gpt, llama, mlp, moe, wresnet
from alpa_ir.models.bert import BertConfig
from alpa_ir.models.family import ModelFamily
from alpa_ir.models.gpt import GPTConfig
from alpa_ir.models.llama import LlamaConfig
from alpa_ir.models.mlp import MLPConfig
from alpa_ir.models.moe import MoEConfig
from alpa_ir.models.wresnet import RESNET_STAGES, WResNetConfig

ModelConfig = MLPConfig | GPTConfig | MoEConfig | WResNetConfig | BertConfig | LlamaConfig

FAMILIES: tuple[ModelFamily, ...] = (
    mlp.FAMILY,
    gpt.FAMILY,
    moe.FAMILY,
    wresnet.FAMILY,
    bert.FAMILY,
    llama.FAMILY,
)

SEQ_LEN = 1024
GPT_VOCAB = 51200
MOE_VOCAB = 32000
IMAGE_SIZE = 224
IMAGE_CLASSES = 1024
# Alpa trains the paper sizes in mixed precision ("Alpa uses rematerialization
# to reduce memory usage and uses mixed-precision training", related work): fp16
# computation and activations; parameters, gradients and Adam state stay fp32
# (the models' ``dtype`` is the computation dtype; Flax keeps fp32 parameters),
# 16 bytes per parameter like fp16 weights + fp16 gradients + an fp32 master
# copy + fp32 Adam moments.
PAPER_DTYPE = jnp.float16
PRETRAINING_DTYPE = jnp.bfloat16
MEGATRON_SEQ_LEN = 2048
LLAMA3_VOCAB = 128256
LLAMA3_SEQ_LEN = 8192
LLAMA3_LONG_SEQ_LEN = 131072
LLAMA3_BATCH_TOKENS = 16 * 1024 * 1024

# (name, hidden, layers, heads, gpus)
_GPT3 = (
    ("gpt3-350m", 1024, 24, 16, 1),
    ("gpt3-1.3b", 2048, 24, 32, 4),
    ("gpt3-2.6b", 2560, 32, 32, 8),
    ("gpt3-6.7b", 4096, 32, 32, 16),
    ("gpt3-15b", 5120, 48, 32, 32),
    ("gpt3-39b", 8192, 48, 64, 64),
)
# Megatron-LM Table 1: (name, heads, hidden, layers, gpus, global batch)
MEGATRON = (
    ("megatron-1.7b", 24, 2304, 24, 32, 512),
    ("megatron-3.6b", 32, 3072, 30, 64, 512),
    ("megatron-7.5b", 32, 4096, 36, 128, 512),
    ("megatron-18b", 48, 6144, 40, 256, 1024),
    ("megatron-39b", 64, 8192, 48, 512, 1536),
    ("megatron-76b", 80, 10240, 60, 1024, 1792),
    ("megatron-145b", 96, 12288, 80, 1536, 2304),
    ("megatron-310b", 128, 16384, 96, 1920, 2160),
    ("megatron-530b", 128, 20480, 105, 2520, 2520),
    ("megatron-1t", 160, 25600, 128, 3072, 3072),
)
# Llama 3 (Table 3): (name, hidden, layers, heads, kv heads, ffn, gpus)
LLAMA3 = (
    ("llama3-8b", 4096, 32, 32, 8, 14336, 8),
    ("llama3-70b", 8192, 80, 64, 8, 28672, 64),
    ("llama3-405b", 16384, 126, 128, 8, 53248, 8192),
)
# (name, hidden, layers, heads, experts, gpus)
_MOE = (
    ("moe-380m", 768, 8, 16, 8, 1),
    ("moe-1.3b", 768, 16, 16, 16, 4),
    ("moe-2.4b", 1024, 16, 16, 16, 8),
    ("moe-10b", 1536, 16, 16, 32, 16),
    ("moe-27b", 2048, 16, 32, 48, 32),
    ("moe-70b", 2048, 32, 32, 64, 64),
)
# (name, depth, base channels, width factor, gpus)
_WRESNET = (
    ("wresnet-250m", 50, 160, 2, 1),
    ("wresnet-1b", 50, 320, 2, 4),
    ("wresnet-2b", 50, 448, 2, 8),
    ("wresnet-4b", 50, 640, 2, 16),
    ("wresnet-6.8b", 50, 320, 16, 32),
    ("wresnet-13b", 101, 320, 16, 64),
)


def _tiny_configs() -> dict[str, Any]:
    """Small enough to compile and run a step on CPU in about a second; every
    sharded dimension (batch 8, hidden, heads, experts, groups) divides by 8 or
    at least by 2 so the models shard on 8 devices."""
    return {
        "mlp-tiny": MLPConfig(
            input_dim=32, hidden_size=64, num_layers=4, output_dim=16, batch_size=8
        ),
        "gpt-tiny": GPTConfig(
            vocab_size=64, hidden_size=32, num_layers=2, num_heads=4, seq_len=16, batch_size=8
        ),
        "moe-tiny": MoEConfig(
            vocab_size=64,
            hidden_size=32,
            num_layers=2,
            num_heads=4,
            seq_len=16,
            batch_size=8,
            num_experts=8,
            expert_group_size=16,
        ),
        "wresnet-tiny": WResNetConfig(
            image_size=32,
            num_classes=16,
            stage_sizes=(1, 1),
            base_channels=8,
            width_factor=2,
            batch_size=8,
        ),
        "bert-tiny": BertConfig(
            hidden_size=32, num_layers=2, num_heads=4, seq_len=16, batch_size=8
        ),
        "llama-tiny": LlamaConfig(
            vocab_size=64,
            hidden_size=32,
            num_layers=2,
            num_heads=4,
            num_kv_heads=2,
            ffn_size=64,
            seq_len=16,
            batch_size=8,
            rope_theta=10_000.0,
        ),
    }


def _paper_configs() -> dict[str, Any]:
    configs: dict[str, Any] = {}
    for name, hidden, layers, heads, gpus in _GPT3:
        configs[name] = GPTConfig(
            GPT_VOCAB,
            hidden,
            layers,
            heads,
            SEQ_LEN,
            batch_size=1024,
            num_gpus=gpus,
            dtype=PAPER_DTYPE,
        )
    for name, hidden, layers, heads, experts, gpus in _MOE:
        configs[name] = MoEConfig(
            MOE_VOCAB,
            hidden,
            layers,
            heads,
            SEQ_LEN,
            batch_size=1024,
            num_experts=experts,
            expert_group_size=2048,
            mlp_ratio=8,
            num_gpus=gpus,
            dtype=PAPER_DTYPE,
        )
    for name, depth, base, width, gpus in _WRESNET:
        configs[name] = WResNetConfig(
            IMAGE_SIZE,
            IMAGE_CLASSES,
            RESNET_STAGES[depth],
            base,
            width,
            batch_size=1536,
            num_gpus=gpus,
            dtype=PAPER_DTYPE,
        )
    configs.update(_pretraining_configs())
    return configs


def _pretraining_configs() -> dict[str, Any]:
    configs: dict[str, Any] = {}
    for name, heads, hidden, layers, gpus, batch in MEGATRON:
        configs[name] = GPTConfig(
            GPT_VOCAB,
            hidden,
            layers,
            heads,
            MEGATRON_SEQ_LEN,
            batch_size=batch,
            num_gpus=gpus,
            dtype=PRETRAINING_DTYPE,
        )
    for name, hidden, layers, heads, kv_heads, ffn, gpus in LLAMA3:
        configs[name] = LlamaConfig(
            LLAMA3_VOCAB,
            hidden,
            layers,
            heads,
            kv_heads,
            ffn,
            LLAMA3_SEQ_LEN,
            batch_size=LLAMA3_BATCH_TOKENS // LLAMA3_SEQ_LEN,
            num_gpus=gpus,
            dtype=PRETRAINING_DTYPE,
        )
    configs["llama3-405b-128k"] = replace(
        configs["llama3-405b"],
        seq_len=LLAMA3_LONG_SEQ_LEN,
        batch_size=LLAMA3_BATCH_TOKENS // LLAMA3_LONG_SEQ_LEN,
        num_gpus=16384,
    )
    return configs


@functools.cache
def _all_configs() -> MappingProxyType[str, Any]:
    return MappingProxyType({**_tiny_configs(), **_paper_configs()})


def list_configs() -> list[str]:
    """Names accepted by :func:`get_config`: the tiny test models first, then paper sizes."""
    return list(_all_configs())


def get_config(name: str) -> Any:
    """The frozen config registered under ``name``; AlpaError for an unknown name."""
    configs = _all_configs()
    if name not in configs:
        raise AlpaError(f"unknown model config {name!r}; known: {', '.join(configs)}")
    return configs[name]


def resolve_config(config_or_name: Any) -> Any:
    """Accept a config object or a registered name."""
    if isinstance(config_or_name, str):
        return get_config(config_or_name)
    family_of(config_or_name)
    return config_or_name


def family_of(config: Any) -> ModelFamily:
    """The family whose config type ``config`` is; AlpaError otherwise."""
    for family in FAMILIES:
        if isinstance(config, family.config_type):
            return family
    known = ", ".join(f.config_type.__name__ for f in FAMILIES)
    raise AlpaError(f"not a model config: {type(config).__name__} (expected one of {known})")


def is_tiny_config(config: Any) -> bool:
    """Whether ``config`` is one of the tiny test models."""
    return config in _tiny_configs().values()
