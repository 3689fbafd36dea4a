"""Alpa's ``alpa.testing`` name (import alpa_ir.testing): a shim over
:mod:`alpa_ir.compat.testing` and :mod:`alpa_ir.compat.testing_models`."""

from alpa_ir.compat.testing import HloParser, assert_allclose
from alpa_ir.compat.testing_models import (
    BertLayerModel,
    MLPModel,
    PipelineBasicTest,
    bert_layer_collection_inference_step,
    create_train_state,
    get_bert_layer_train_state_and_step,
    get_mlp_train_state_and_step,
    mlp_inference_step,
)

__all__ = [
    "BertLayerModel",
    "HloParser",
    "MLPModel",
    "PipelineBasicTest",
    "assert_allclose",
    "bert_layer_collection_inference_step",
    "create_train_state",
    "get_bert_layer_train_state_and_step",
    "get_mlp_train_state_and_step",
    "mlp_inference_step",
]
