"""Alpa's ``alpa.model`` names (import alpa_ir.model): shims over
:mod:`alpa_ir.compat` (``model_util``, ``bert_model``, ``moe``). The project's own
model zoo is :mod:`alpa_ir.models`."""
