"""Alpa's helper names outside its top level (import alpa_ir.compat).

Alpa's users import more than ``alpa.parallelize``: ``alpa.testing``,
``alpa.util``, ``alpa.device_mesh``, ``alpa.global_config``,
``alpa.model.model_util`` and the model zoo. Their code lives here, one
module per Alpa module; the import names Alpa's users write
(``alpa_ir.testing``, ``alpa_ir.util``, ``alpa_ir.device_mesh``,
``alpa_ir.model``) are small shim packages at the root that only re-export
from here. Thus the root keeps only facades, the compatibility code has one
room, and it sits above ``api`` (it may use the public API, nothing below
imports it).
"""
