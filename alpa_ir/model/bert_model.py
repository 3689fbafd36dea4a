"""Alpa's ``alpa.model.bert_model`` name: a shim over :mod:`alpa_ir.compat.bert_model`."""

from alpa_ir.compat.bert_model import (
    BertConfig,
    FlaxBaseModelOutput,
    FlaxBertForMaskedLMModule,
    FlaxBertLayer,
    FlaxBertLayerCollection,
    FlaxBertModule,
    FlaxMaskedLMOutput,
    TrainState,
)

__all__ = [
    "BertConfig",
    "FlaxBaseModelOutput",
    "FlaxBertForMaskedLMModule",
    "FlaxBertLayer",
    "FlaxBertLayerCollection",
    "FlaxBertModule",
    "FlaxMaskedLMOutput",
    "TrainState",
]
