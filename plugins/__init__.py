"""Plugin hook specs and the built-in plugins (import alpa_ir.plugins)."""
