"""Each method's own settings in Alpa's OSDI'22 artifact, as data with its source.

The artifact did not run its baselines with the settings of Alpa's plan
(:data:`~alpa_ir.models.measurements.ARTIFACT_MICRO_BATCHES`): the intra-op-only,
inter-op-only, Megatron-LM and PP-DP rows of ``results_e2e_ref.tsv`` came from
their own scripts, each with its own micro-batch counts, logical meshes and
rematerialization. ``alpa-bench`` reproduces them (``--method-settings own``)
from this table. Sources (repository alpa-projects/alpa, branch
``osdi22_artifact``, commit e0ae8bf8):

- intra-op only: ``benchmark/alpa/exp_intra_only.py`` (GPT-3, MoE;
  ``ShardParallel`` on one logical mesh ``(LD0, LD1)``, ``NB`` micro-batches,
  remat column) and ``osdi22_artifact/suite_artifact_e2e_wresnet.py``
  (``artifact_e2e_wresnet_intra_only_suite``: Wide-ResNet without remat; 13B
  from ``exp_intra_only.py``).
- inter-op only: ``benchmark/alpa/exp_inter_only.py`` (GPT-3, MoE:
  ``uniform_layer_gpipe``, which despite its name runs the 1F1B schedule
  (``benchmark_3d_one_case_gpt_bert.py`` sets ``pipeline_parallel_schedule=
  "1f1b"``) on one 1x1 mesh per GPU, equal layers per stage; several ``NB`` per
  size, the artifact keeping the best) and ``suite_artifact_e2e_wresnet.py``
  (``artifact_result_e2e_wresnet_inter_only_suite``).
- Megatron-LM: ``osdi22_artifact/megatron/benchmark_gpt.py``
  (``gpt_megatron_best_suite``: data, tensor and pipeline degrees and the
  micro-batch count of the best grid point per GPU count; 39B not listed).
- PP-DP: ``suite_artifact_e2e_wresnet.py`` (``artifact_result_e2e_wresnet_ppdp_suite``:
  pipeline stages on data-parallel-only logical meshes).

Where the script ran another global batch than the suite's (GPT-3 15B and
39B, MoE 27B and 70B, Wide-ResNet 13B at 16 to 256, Megatron 350M at 128), the
micro-batch *size* is kept and the count given here is the suite's global batch
over it (the artifact's figures are per-GPU throughput; the measurement rows of
those sizes are at the suite's batch, :mod:`alpa_ir.models.measurements`).
DeepSpeed's rows are another system's and keep Alpa's settings.
"""

from __future__ import annotations

from dataclasses import dataclass

SOURCE = "github.com/alpa-projects/alpa, branch osdi22_artifact (commit e0ae8bf8)"
INTRA_SOURCE = "benchmark/alpa/exp_intra_only.py"
WRESNET_SOURCE = "osdi22_artifact/suite_artifact_e2e_wresnet.py"
INTER_SOURCE = "benchmark/alpa/exp_inter_only.py"
MEGATRON_SOURCE = "osdi22_artifact/megatron/benchmark_gpt.py"


@dataclass(frozen=True)
class MethodSetting:
    """How the artifact ran one method on one suite size."""

    model: str
    method: str
    """``alpa-bench``'s name of the method (``intra-op``, ``inter-op``, ``megatron``, ``pp-dp``)."""
    micro_batches: tuple[int, ...]
    """Micro-batches per step at the suite's global batch; several: the artifact
    ran each and kept the fastest."""
    remat: bool
    """Per-layer rematerialization."""
    source: str
    """The file of :data:`SOURCE` the setting is read from."""
    logical_mesh: tuple[int, int] | None = None
    """intra-op: the one logical mesh of all devices; megatron: each stage's
    ``(data, tensor)`` degrees; None: the method's own search."""
    stages: int | None = None
    """megatron: the pipeline degree."""
    data_parallel_only: bool = False
    """pp-dp: every stage on a data-parallel-only logical mesh ``(n, 1)``."""
    force_batch_dim_to_mesh_dim: int = -1
    """Alpa's auto-sharding option the script set (-1: not set)."""
    uniform_layers: bool = False
    """inter-op: equal layers per stage (``uniform_layer_gpipe``), not the stage DP's slicing."""


def _intra(
    model: str, mesh: tuple[int, int], micro: int, remat: bool = True, source: str = INTRA_SOURCE
) -> MethodSetting:
    return MethodSetting(model, "intra-op", (micro,), remat, source, logical_mesh=mesh)


def _inter(model: str, *micro: int, source: str = INTER_SOURCE) -> MethodSetting:
    # exp_inter_only.py ran uniform_layer_gpipe; Wide-ResNet's plans came from the stage DP
    uniform = source == INTER_SOURCE
    return MethodSetting(model, "inter-op", micro, True, source, uniform_layers=uniform)


def _megatron(model: str, dp: int, tp: int, pp: int, micro: int) -> MethodSetting:
    return MethodSetting(
        model, "megatron", (micro,), True, MEGATRON_SOURCE, logical_mesh=(dp, tp), stages=pp
    )


def _pp_dp(model: str, micro: int) -> MethodSetting:
    return MethodSetting(model, "pp-dp", (micro,), True, WRESNET_SOURCE, data_parallel_only=True)


METHOD_SETTINGS: tuple[MethodSetting, ...] = (
    # exp_intra_only.py, gpt_intra_only (global batch 1024; 15B ran 64..256 at
    # micro-batch 8, 39B 16..64 at micro-batch 2)
    _intra("gpt3-350m", (1, 1), 64),
    _intra("gpt3-1.3b", (4, 1), 64),
    _intra("gpt3-2.6b", (4, 2), 32),
    _intra("gpt3-6.7b", (2, 8), 64),
    _intra("gpt3-15b", (4, 8), 128),
    _intra("gpt3-39b", (2, 32), 512),
    # moe_intra_only (global batch 1024; 27B ran 64..256 at micro-batch 32,
    # 70B 32..128 at micro-batch 4 with force_batch_dim_mapping)
    _intra("moe-380m", (1, 1), 32),
    _intra("moe-1.3b", (4, 1), 16),
    _intra("moe-2.4b", (8, 1), 16),
    _intra("moe-10b", (2, 8), 32),
    _intra("moe-27b", (1, 32), 32),
    MethodSetting(
        "moe-70b",
        "intra-op",
        (256,),
        True,
        INTRA_SOURCE,
        logical_mesh=(1, 64),
        force_batch_dim_to_mesh_dim=0,
    ),
    # artifact_e2e_wresnet_intra_only_suite (global batch 1536, no remat); 13B
    # from exp_intra_only.py (batch 16..64 at micro-batch 8)
    _intra("wresnet-250m", (1, 1), 48, remat=False, source=WRESNET_SOURCE),
    _intra("wresnet-1b", (4, 1), 32, remat=False, source=WRESNET_SOURCE),
    _intra("wresnet-2b", (8, 1), 48, remat=False, source=WRESNET_SOURCE),
    _intra("wresnet-4b", (2, 8), 64, remat=False, source=WRESNET_SOURCE),
    _intra("wresnet-6.8b", (4, 8), 48, remat=False, source=WRESNET_SOURCE),
    _intra("wresnet-13b", (4, 16), 192, remat=False),
    # exp_inter_only.py, gpt_inter_only (global batch 1024; 39B at micro-batch 1)
    _inter("gpt3-350m", 64, 128, 256),
    _inter("gpt3-1.3b", 64, 128, 256, 512),
    _inter("gpt3-2.6b", 64, 128, 256, 512, 1024),
    _inter("gpt3-6.7b", 128, 256, 512, 1024),
    _inter("gpt3-15b", 128, 256, 512, 1024),
    _inter("gpt3-39b", 1024),
    # moe_inter_only (27B and 70B not run)
    _inter("moe-380m", 64, 128),
    _inter("moe-1.3b", 64, 128, 256, 512),
    _inter("moe-2.4b", 64, 128, 256, 512, 1024),
    _inter("moe-10b", 64, 128, 256, 512, 1024),
    # artifact_result_e2e_wresnet_inter_only_suite (6.8B: out of memory)
    _inter("wresnet-250m", 24, source=WRESNET_SOURCE),
    _inter("wresnet-1b", 64, source=WRESNET_SOURCE),
    _inter("wresnet-2b", 96, source=WRESNET_SOURCE),
    _inter("wresnet-4b", 384, source=WRESNET_SOURCE),
    # gpt_megatron_best_suite: (dp, tp, pp, micro-batches); 350M ran batch 128
    # in 8 micro-batches of 16
    _megatron("gpt3-350m", 1, 1, 1, 64),
    _megatron("gpt3-1.3b", 2, 1, 2, 128),
    _megatron("gpt3-2.6b", 1, 1, 8, 128),
    _megatron("gpt3-6.7b", 1, 2, 8, 256),
    _megatron("gpt3-15b", 1, 4, 8, 256),
    # artifact_result_e2e_wresnet_ppdp_suite (6.8B: out of memory)
    _pp_dp("wresnet-250m", 24),
    _pp_dp("wresnet-1b", 32),
    _pp_dp("wresnet-2b", 32),
    _pp_dp("wresnet-4b", 384),
)


def method_setting(model: str, method: str) -> MethodSetting | None:
    """The artifact's own setting of ``method`` on suite size ``model``; None
    where it ran the method with Alpa's settings or not at all."""
    for s in METHOD_SETTINGS:
        if s.model == model and s.method == method:
            return s
    return None
