"""Compiler passes, one module per pass (import alpa_ir.passes)."""
