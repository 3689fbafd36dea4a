"""Model zoo: Flax models with Optax train-step factories (import alpa_ir.models).

GPT-3, GShard MoE and Wide-ResNet at the Alpa paper's sizes, the GPT shapes of
Megatron-LM's Table 1 and Llama 3 (traced abstractly), and tiny variants plus
an MLP and BERT layers for tests. ``make_train_step``
returns ``(train_step, (state, batch))``; ``gpt_tiny_step`` and friends are the
zero-argument factories for ``alpa-opt --import alpa_ir.models:gpt_tiny_step``.
"""

from alpa_ir.models.bert import BertConfig
from alpa_ir.models.family import ModelFamily
from alpa_ir.models.gpt import GPTConfig
from alpa_ir.models.llama import LlamaConfig
from alpa_ir.models.mlp import MLPConfig
from alpa_ir.models.moe import MoEConfig, expert_capacity, top2_gating
from alpa_ir.models.registry import ModelConfig, family_of, get_config, list_configs
from alpa_ir.models.train_step import (
    bert_tiny_step,
    gpt_tiny_step,
    llama_tiny_step,
    make_optimizer,
    make_train_step,
    mlp_tiny_step,
    moe_tiny_step,
    param_count,
    train_step_flops,
    wresnet_tiny_step,
)
from alpa_ir.models.wresnet import WResNetConfig

__all__ = [
    "BertConfig",
    "GPTConfig",
    "LlamaConfig",
    "MLPConfig",
    "MoEConfig",
    "ModelConfig",
    "ModelFamily",
    "WResNetConfig",
    "bert_tiny_step",
    "expert_capacity",
    "family_of",
    "get_config",
    "gpt_tiny_step",
    "list_configs",
    "llama_tiny_step",
    "make_optimizer",
    "make_train_step",
    "mlp_tiny_step",
    "moe_tiny_step",
    "param_count",
    "top2_gating",
    "train_step_flops",
    "wresnet_tiny_step",
]
