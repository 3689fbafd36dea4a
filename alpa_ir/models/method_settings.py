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

Wide-ResNet's inter-op-only and PP-DP rows were measured with manual plans
(``artifact_result_e2e_wresnet_{inter_only,ppdp}_suite``: ``manual_gpipe``
with the stages, submeshes and logical meshes the artifact's search had
found under its own profiling); those plans are kept here
(:attr:`MethodSetting.stage_layer_ids`) and simulated as they ran, not
searched again: a plan of our own stage DP is another plan than the one
measured (Wide-ResNet 2B inter-op: our DP's balanced 1x1 slicing was priced
1.43x the measured throughput, the artifact's own slicing 0.86x). Their
``force_batch_dim_to_mesh_dim`` is not reproduced (as in
``bench_alpa_plans``: a stage function without the batch among its
arguments cannot take it here; on a data-parallel-only view the ILP splits
the batch where that is fastest).

Where the script ran another global batch than the suite's (GPT-3 15B and
39B, MoE 27B and 70B, Wide-ResNet 13B at 16 to 256, Megatron 350M at 128), the
micro-batch *size* is kept and the count given here is the suite's global batch
over it (the artifact's figures are per-GPU throughput; the measurement rows of
those sizes are at the suite's batch, :mod:`alpa_ir.models.measurements`).
DeepSpeed's rows are another system's and keep Alpa's settings.
"""

from __future__ import annotations

from dataclasses import dataclass

from alpa_ir.errors import AlpaError

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
    stage_layer_ids: tuple[tuple[int, ...], ...] | None = None
    """The artifact's manual plan of the measured run: each stage's automatic
    layers among :attr:`artifact_layers` (``forward_stage_layer_ids``); None:
    the method's own search."""
    submeshes: tuple[tuple[int, int], ...] = ()
    """With :attr:`stage_layer_ids`: each stage's physical submesh."""
    logical_meshes: tuple[tuple[int, int], ...] = ()
    """With :attr:`stage_layer_ids`: each stage's logical mesh."""
    artifact_layers: int = 16
    """The automatic layer count :attr:`stage_layer_ids` numbers (Alpa's
    Wide-ResNet benchmark: 16)."""

    def __post_init__(self) -> None:
        if self.stage_layer_ids is None:
            return
        ids = [i for stage in self.stage_layer_ids for i in stage]
        if ids != list(range(self.artifact_layers)):
            raise AlpaError(
                f"{self.model} {self.method}: the stages' layers {ids} are not "
                f"0..{self.artifact_layers - 1} in order"
            )
        counts = {len(self.stage_layer_ids), len(self.submeshes), len(self.logical_meshes)}
        if len(counts) != 1:
            raise AlpaError(
                f"{self.model} {self.method}: stages, submeshes and logical meshes differ in number"
            )
        for physical, logical in zip(self.submeshes, self.logical_meshes, strict=True):
            if physical[0] * physical[1] != logical[0] * logical[1]:
                raise AlpaError(
                    f"{self.model} {self.method}: logical mesh {logical} does not have the "
                    f"devices of submesh {physical}"
                )


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


def _manual(
    model: str,
    method: str,
    micro: int,
    stages: list[list[int]],
    submeshes: list[tuple[int, int]],
    logical: list[tuple[int, int]] | None = None,
) -> MethodSetting:
    """A Wide-ResNet row measured with a manual plan (``stages`` of the 16
    automatic layers on ``submeshes``; logical meshes data-parallel-only
    ``(n, 1)`` unless given)."""
    meshes = logical if logical is not None else [(a * b, 1) for a, b in submeshes]
    return MethodSetting(
        model,
        method,
        (micro,),
        True,
        WRESNET_SOURCE,
        data_parallel_only=method == "pp-dp",
        stage_layer_ids=tuple(tuple(s) for s in stages),
        submeshes=tuple(submeshes),
        logical_meshes=tuple(meshes),
    )


def _singles(count: int) -> list[list[int]]:
    return [[k] for k in range(count)]


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
    # artifact_result_e2e_wresnet_inter_only_suite (6.8B: out of memory): manual
    # plans on 1x1 meshes; 250M ran shard_parallel on its one GPU
    _manual("wresnet-250m", "inter-op", 24, [list(range(16))], [(1, 1)]),
    _manual(
        "wresnet-1b",
        "inter-op",
        64,
        [[0, 1, 2, 3, 4, 5], [6, 7, 8, 9, 10], [11, 12, 13], [14, 15]],
        [(1, 1)] * 4,
    ),
    _manual(
        "wresnet-2b",
        "inter-op",
        96,
        [[0, 1, 2], [3, 4, 5], [6, 7], [8, 9, 10], [11, 12], [13], [14], [15]],
        [(1, 1)] * 8,
    ),
    _manual("wresnet-4b", "inter-op", 384, _singles(16), [(1, 1)] * 16),
    # gpt_megatron_best_suite: (dp, tp, pp, micro-batches); 350M ran batch 128
    # in 8 micro-batches of 16
    _megatron("gpt3-350m", 1, 1, 1, 64),
    _megatron("gpt3-1.3b", 2, 1, 2, 128),
    _megatron("gpt3-2.6b", 1, 1, 8, 128),
    _megatron("gpt3-6.7b", 1, 2, 8, 256),
    _megatron("gpt3-15b", 1, 4, 8, 256),
    # artifact_result_e2e_wresnet_ppdp_suite (6.8B: out of memory): manual plans
    # on data-parallel-only meshes ("manually reduce the microbatch size to make
    # it solvable": 32 and 384); 250M ran shard_parallel on its one GPU
    _manual("wresnet-250m", "pp-dp", 24, [list(range(16))], [(1, 1)]),
    _manual(
        "wresnet-1b",
        "pp-dp",
        32,
        [[0, 1, 2, 3, 4, 5, 6, 7], [8, 9, 10, 11, 12], [13, 14, 15]],
        [(1, 2), (1, 1), (1, 1)],
    ),
    _manual(
        "wresnet-2b",
        "pp-dp",
        32,
        [[0, 1, 2, 3, 4, 5, 6, 7, 8], [9, 10], [11, 12, 13], [14, 15]],
        [(1, 4), (1, 1), (1, 2), (1, 1)],
    ),
    _manual("wresnet-4b", "pp-dp", 384, _singles(16), [(1, 1)] * 16),
)


def method_setting(model: str, method: str) -> MethodSetting | None:
    """The artifact's own setting of ``method`` on suite size ``model``; None
    where it ran the method with Alpa's settings or not at all."""
    for s in METHOD_SETTINGS:
        if s.model == model and s.method == method:
            return s
    return None
