"""Runtime: mesh workers, instruction interpreter, transfers (import alpa_ir.runtime)."""
