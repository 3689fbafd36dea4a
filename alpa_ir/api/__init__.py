"""The public API: methods, parallelize, executables, checkpoints, init/shutdown (import alpa_ir.api.run_module)."""
