"""JAX frontend: jaxpr to IR and back (import alpa_ir.frontend)."""
