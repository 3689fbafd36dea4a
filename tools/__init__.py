"""Command-line programs: alpa-opt and friends (import alpa_ir.tools)."""
