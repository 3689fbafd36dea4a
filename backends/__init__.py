"""Backends that execute or estimate a module: xla, ray, simulate (import alpa_ir.backends)."""
