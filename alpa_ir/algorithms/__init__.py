"""Inter-operator planning algorithms: stage DP and operator clustering (import alpa_ir.algorithms)."""

from alpa_ir.algorithms.operator_clustering import ClusteringResult, cluster_operators
from alpa_ir.algorithms.stage_dp import Stage, StageDPResult, stage_dp

__all__ = ["ClusteringResult", "Stage", "StageDPResult", "cluster_operators", "stage_dp"]
