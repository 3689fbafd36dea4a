"""Cost models: FLOPs, fusion, HLO collectives, the stage cost model and its workers, a planned module's memory (import alpa_ir.costs)."""
