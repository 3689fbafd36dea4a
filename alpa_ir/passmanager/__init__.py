"""The pass manager, pipeline syntax, typed pass options, reproducers, statistics (import alpa_ir.passmanager)."""
