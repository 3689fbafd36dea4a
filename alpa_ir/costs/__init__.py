"""Cost models: FLOPs, fusion, HLO collectives, the stage cost model and its workers (import alpa_ir.costs)."""
