"""IR dialects: lax, mesh, sharding, pipeline (import alpa_ir.dialects)."""
