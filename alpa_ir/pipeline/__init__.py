"""Pipeline planning libraries: step partition, layers, outlining, stage specs, schedules, cross-mesh plans (import alpa_ir.pipeline)."""
