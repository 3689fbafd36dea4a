"""Alpa's ``alpa.model.model_util`` name: a shim over :mod:`alpa_ir.compat.model_util`."""

from alpa_ir.compat.model_util import TrainState

__all__ = ["TrainState"]
