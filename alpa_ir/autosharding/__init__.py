"""Intra-operator parallelism: sharding rules, strategies, resharding, the ILP
graph and the SPMD plan (import alpa_ir.autosharding)."""
