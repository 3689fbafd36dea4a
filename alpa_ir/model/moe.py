"""Alpa's ``alpa.model.moe`` name: a shim over :mod:`alpa_ir.compat.moe_model`."""

from alpa_ir.compat.moe_model import (
    FlaxMoEForLMModule,
    FlaxMoELayer,
    FlaxMoELayerCollection,
    FlaxPositionWiseMoELayer,
    MoEConfig,
    TrainState,
    top2_gating,
)

__all__ = [
    "FlaxMoEForLMModule",
    "FlaxMoELayer",
    "FlaxMoELayerCollection",
    "FlaxPositionWiseMoELayer",
    "MoEConfig",
    "TrainState",
    "top2_gating",
]
