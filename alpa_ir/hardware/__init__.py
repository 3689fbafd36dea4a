"""The cluster model (levels, alpha/beta), presets, device meshes and the local devices' memory budget (import alpa_ir.hardware)."""
