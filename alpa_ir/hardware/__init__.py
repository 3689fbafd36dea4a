"""The cluster model (levels, alpha/beta), presets and device meshes (import alpa_ir.hardware)."""
