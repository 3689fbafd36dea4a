"""``PipeshardParallel``: inter-operator (pipeline) plus intra-operator parallelism.

Compilation of a step: trace it at the micro-batch shape, import it, find its
layers (the markers of ``mark_pipeline_boundary``, or those ``cluster-operators``
inserts for :class:`AutoLayerOption`), slice the layers into stages on
submeshes of the devices (uniform or manual slicing here; the
``construct-stages`` DP for :class:`AutoStageOption`), outline the stages
(:mod:`alpa_ir.pipeline.stage_outline`), auto-shard every stage function on its
submesh's logical mesh, and compile each as one SPMD program; then
``cross-mesh-resharding`` plans the tensors crossing meshes and
``emit-instructions`` writes each mesh's instruction list. The resulting
:class:`PipeshardExecutable` runs those lists with the instruction
interpreter (:mod:`alpa_ir.runtime.interpreter`): in this process on the
xla backend, on one Ray actor per host on the ray backend.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from alpa_ir.api.manual_sharding import ManualShardingOption
from alpa_ir.api.sharding_options import AutoShardingOption
from alpa_ir.dialects.sharding import ShardingSpec
from alpa_ir.errors import AlpaError
from alpa_ir.hardware.device_mesh import Devices, LogicalDeviceMesh
from alpa_ir.hardware.memory_budget import check_memory_option


@dataclass(frozen=True)
class ManualLayerOption:
    """Layers are delimited by the step's ``mark_pipeline_boundary`` calls.
    ``remat_layer``: each stage's backward recomputes its forward activations
    from the stage's inputs (Alpa's option), keeping less memory per micro-batch."""

    remat_layer: bool = False


@dataclass(frozen=True)
class AutoLayerOption:
    """``cluster-operators`` slices the forward computation into ``layer_num``
    layers (Alpa §5.2, Eq. 6) with FLOP imbalance tolerance ``eps``."""

    layer_num: int
    eps: float = 0.5
    remat_layer: bool = False
    """Each stage's backward recomputes its forward activations (Alpa's option)."""
    remat_mode: str = "none"
    """Alpa's name for it: ``coarse_grained_remat`` is ``remat_layer=True``;
    ``none`` leaves ``remat_layer`` as given."""

    def __post_init__(self) -> None:
        if self.remat_mode not in ("none", "coarse_grained_remat"):
            raise AlpaError(
                f"AutoLayerOption: remat_mode {self.remat_mode!r} is not supported; known: "
                "'none', 'coarse_grained_remat' (Alpa's fine_grained_remat is not implemented)"
            )
        if self.remat_mode == "coarse_grained_remat":
            object.__setattr__(self, "remat_layer", True)


@dataclass(frozen=True)
class UniformStageOption:
    """``num_stages`` stages of equally many layers on equal submeshes
    (default: one stage per layer) of logical shape ``submesh_logical_shape``
    (default ``(1, devices per stage)``)."""

    num_stages: int | None = None
    submesh_logical_shape: tuple[int, int] | None = None
    devices_per_stage: int | None = None
    """Devices of each stage (the first ``stages × devices_per_stage`` of the
    method's devices); None: all of them, split evenly."""


@dataclass(frozen=True)
class ManualStageOption:
    """Stage ``i`` holds layers ``forward_stage_layer_ids[i]`` (consecutive) on
    a submesh of ``submesh_physical_shapes[i]`` devices, viewed as the logical
    mesh ``submesh_logical_shapes[i]`` (default: the physical shape) and
    auto-sharded with the method's ``AutoShardingOption`` changed by
    ``submesh_autosharding_option_dicts[i]`` (Alpa's fields, in Alpa's order);
    submeshes take the devices in order. Given two shapes lists only, the
    second is both."""

    forward_stage_layer_ids: Sequence[Sequence[int]]
    submesh_physical_shapes: Sequence[tuple[int, int]] | None = None
    submesh_logical_shapes: Sequence[tuple[int, int]] | None = None
    submesh_autosharding_option_dicts: Sequence[Any] | None = None
    """Per stage, the ``AutoShardingOption`` fields it changes (kept as
    ``(name, value)`` pairs, so that the option stays hashable)."""

    def __post_init__(self) -> None:
        physical, logical = self.submesh_physical_shapes, self.submesh_logical_shapes
        if physical is None and logical is None:
            raise AlpaError(
                "ManualStageOption needs submesh_physical_shapes or submesh_logical_shapes"
            )
        if logical is None:
            object.__setattr__(self, "submesh_logical_shapes", physical)
        dicts = self.submesh_autosharding_option_dicts
        if dicts is not None:
            if len(dicts) != len(self.forward_stage_layer_ids):
                raise AlpaError(
                    f"ManualStageOption has {len(self.forward_stage_layer_ids)} stages but "
                    f"{len(dicts)} submesh_autosharding_option_dicts"
                )
            items = tuple(
                tuple(sorted(dict(d).items())) if isinstance(d, Mapping) else tuple(d)
                for d in dicts
            )
            object.__setattr__(self, "submesh_autosharding_option_dicts", items)

    def stage_option_changes(self) -> list[dict[str, Any]]:
        """Per stage, the ``AutoShardingOption`` fields it changes."""
        dicts = self.submesh_autosharding_option_dicts
        return [dict(d) for d in dicts] if dicts else [{} for _ in self.forward_stage_layer_ids]


@dataclass(frozen=True)
class AutoStageOption:
    """Stages, submeshes and logical meshes chosen by ``construct-stages``."""

    submesh_physical_shape_space: Literal["all", "power_of_two", "small_power_of_two", "manual"] = (
        "all"
    )
    """The submeshes searched (Alpa's field): ``(1, 2^k)`` within a node, then
    whole nodes ``(n, M)``: ``all`` n, ``power_of_two`` n, ``small_power_of_two``
    n up to 4; ``manual``: ``manually_specified_submeshes``. Alpa's default is
    ``power_of_two``; ours is ``all`` (the figures measured so far searched
    every node count)."""
    manually_specified_submeshes: Sequence[tuple[int, int]] | None = None
    """The submeshes of the ``manual`` physical space, e.g. ``[(1, 2), (1, 4)]``."""
    submesh_logical_shape_space: Literal[
        "all",
        "single_node_model_parallel",
        "same_as_physical",
        "data_parallel_only",
        "model_parallel_only",
    ] = "all"
    """The logical views of each submesh (Alpa's field): ``all`` ``(dp, mp)``
    views, ``single_node_model_parallel`` (the node's devices on the
    model-parallel axis), ``same_as_physical`` (the submesh's shape),
    ``data_parallel_only`` ``(n, 1)``, ``model_parallel_only`` ``(1, n)``."""
    stage_cost_model: str = "analytical"
    """A registered stage cost model: ``analytical`` (predicted from the
    plan) or ``profile`` (each stage-mesh pair compiled and timed on the
    local devices, as Alpa does)."""
    cost_mode: Literal["layer-sum", "range"] = "layer-sum"
    """``layer-sum``: a stage costs the sum of its layers, each layer planned
    once per logical mesh (identical layers once); ``range``: every range of
    layers planned as one function (Alpa's profiling; L(L+1)/2 functions,
    exact at the boundaries between a stage's layers)."""
    layer_profile_mode: Literal["composite", "individual"] | None = None
    """Alpa's name of :attr:`cost_mode`: ``individual`` (each layer profiled
    alone, a stage the sum of its layers) is ``layer-sum``, ``composite``
    (every range of layers profiled whole) is ``range``; None: ``cost_mode``."""
    workers: int | None = None
    """Processes that cost the stage-mesh pairs (``construct-stages``
    ``workers``); None: one per CPU core."""
    repeated_layers: Literal["auto", "share", "separate"] = "share"
    """How the costing plans a layer's repeated blocks (``construct-stages``
    ``repeated-layers``): ``share`` (alike: faster, the chosen stages are then
    planned exactly), ``separate`` or ``auto``."""
    cross_stage_comm: bool | Literal["auto"] = "auto"
    """Whether the stage DP counts the transfers between stages
    (``construct-stages`` ``cross-stage-comm``): False is Alpa's DP, True adds
    them to its objective, ``auto`` plans both ways and keeps the plan the
    simulator times faster (Alpa's on a tie)."""

    def __post_init__(self) -> None:
        physical = ("all", "power_of_two", "small_power_of_two", "manual")
        if self.submesh_physical_shape_space not in physical:
            raise AlpaError(
                f"AutoStageOption: submesh_physical_shape_space must be one of {physical}, got "
                f"{self.submesh_physical_shape_space!r}"
            )
        logical = (
            "all",
            "single_node_model_parallel",
            "same_as_physical",
            "data_parallel_only",
            "model_parallel_only",
        )
        if self.submesh_logical_shape_space not in logical:
            raise AlpaError(
                f"AutoStageOption: submesh_logical_shape_space must be one of {logical}, got "
                f"{self.submesh_logical_shape_space!r}"
            )
        manual = self.manually_specified_submeshes
        if (self.submesh_physical_shape_space == "manual") != bool(manual):
            raise AlpaError(
                "AutoStageOption: manually_specified_submeshes go with "
                "submesh_physical_shape_space='manual' (both or neither)"
            )
        if manual:
            shapes = tuple(tuple(s) for s in manual)
            if not all(
                len(s) == 2
                and all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in s)
                for s in shapes
            ):
                raise AlpaError(
                    f"AutoStageOption: manually_specified_submeshes must be (hosts, devices) "
                    f"pairs of positive ints, got {list(manual)!r}"
                )
            object.__setattr__(self, "manually_specified_submeshes", shapes)
        if self.cost_mode not in ("layer-sum", "range"):
            raise AlpaError(
                f"AutoStageOption: cost_mode must be 'layer-sum' or 'range', got {self.cost_mode!r}"
            )
        if self.layer_profile_mode is not None:
            modes = {"individual": "layer-sum", "composite": "range"}
            if self.layer_profile_mode not in modes:
                raise AlpaError(
                    "AutoStageOption: layer_profile_mode must be 'composite' or 'individual', "
                    f"got {self.layer_profile_mode!r}"
                )
            if self.cost_mode == "range" and self.layer_profile_mode == "individual":
                raise AlpaError(
                    "AutoStageOption: layer_profile_mode='individual' is cost_mode='layer-sum', "
                    "but cost_mode='range' is given"
                )
            object.__setattr__(self, "cost_mode", modes[self.layer_profile_mode])
        if self.repeated_layers not in ("auto", "share", "separate"):
            raise AlpaError(
                "AutoStageOption: repeated_layers must be 'auto', 'share' or 'separate', "
                f"got {self.repeated_layers!r}"
            )
        if self.cross_stage_comm not in (True, False, "auto"):
            raise AlpaError(
                "AutoStageOption: cross_stage_comm must be True, False or 'auto', "
                f"got {self.cross_stage_comm!r}"
            )
        if self.workers is not None and (
            isinstance(self.workers, bool) or not isinstance(self.workers, int) or self.workers < 1
        ):
            raise AlpaError(
                f"AutoStageOption: workers must be a positive integer, got {self.workers!r}"
            )

    def worker_count(self) -> int:
        """``workers``, or one per CPU core."""
        return self.workers if self.workers is not None else max(1, os.cpu_count() or 1)


StageOption = UniformStageOption | ManualStageOption | AutoStageOption
LayerOption = ManualLayerOption | AutoLayerOption


PIPESHARD_SCHEDULES = ("auto", "1f1b", "gpipe", "zb-h1", "interleaved-1f1b", "zb-v", "inference")
"""The schedules :class:`PipeshardParallel` runs; ``auto``: chosen with automatic
stages, 1F1B for given ones; ``interleaved-1f1b`` and ``zb-v`` place
``virtual_stages`` chunks of layers on every stage's mesh; ``inference``: a
forward-only step (no gradients), its micro-batches' outputs concatenated
(batch-shaped ones) or averaged (the others, e.g. a mean loss)."""
VIRTUAL_SCHEDULES = ("interleaved-1f1b", "zb-v")


def plugin_schedules() -> tuple[str, ...]:
    """The schedules installed plugins add (hook ``alpa_ir_schedules``)."""
    from alpa_ir.plugins.registry import default_registry

    return tuple(k for k in default_registry().schedules if k not in PIPESHARD_SCHEDULES)


@dataclass(frozen=True)
class PipeshardParallel:
    """Pipeline stages on submeshes, each stage auto-sharded on its submesh.

    As in Alpa, ``layer_option`` may be ``"manual"`` (the step's
    ``mark_pipeline_boundary`` calls) or a layer option, and ``stage_option``
    ``"uniform"``, ``"auto"`` or a stage option; ``default_auto_sharding_option``
    is Alpa's name of ``auto_sharding_option``. Without a layer option the
    step's own boundaries are its layers if it marks any, else
    ``AutoLayerOption(layer_num=2)`` (Alpa's default)."""

    devices: Devices = None
    num_micro_batches: int = 1
    layer_option: LayerOption | Literal["manual"] | None = None
    stage_option: StageOption | Literal["uniform", "auto"] = field(
        default_factory=UniformStageOption
    )
    pipeline_schedule: str = "auto"
    """``1f1b``, ``gpipe``, ``zb-h1`` (zero-bubble: each stage's backward is
    split into B and W by ``split-backward`` and W fills the bubbles), or
    ``auto``: with :class:`AutoStageOption` the planner picks the fastest that
    fits together with the stages (``construct-stages{schedule=auto}``); with
    given stages, ``1f1b``. ``interleaved-1f1b`` (Megatron-LM) and ``zb-v``
    (zero-bubble, V order) run ``virtual_stages`` chunks of layers on each
    stage's mesh: given stages cut the layers into ``num_stages ×
    virtual_stages`` chunks; automatic stages cut each mesh's layers in two.
    Or the name of a schedule an installed plugin adds (hook
    ``alpa_ir_schedules``), on given stages: the backward is split, so its
    order may run W apart from B."""
    virtual_stages: int | None = None
    """Chunks of layers per stage mesh: ``interleaved-1f1b`` (default 2), ``zb-v``
    (2); 1 for the other schedules."""
    backend: Literal["xla", "ray"] | None = None
    """``xla``: the stages run in this process on the local devices; ``ray``:
    one Ray actor per host, a mesh may span hosts (after ``alpa_ir.init(cluster="ray")``);
    None: ``ray`` while connected to Ray by ``alpa_ir.init(cluster="ray")``, else ``xla``."""
    auto_sharding_option: AutoShardingOption = field(
        default_factory=lambda: AutoShardingOption(reduce_scatter="none")
    )
    default_auto_sharding_option: AutoShardingOption | None = None
    device_memory: float | str | None = None
    """Bytes each device may hold (a number, or a size such as ``"6GiB"``); None:
    ``ALPA_DEVICE_MEMORY``, else what the local devices have
    (:mod:`alpa_ir.hardware.memory_budget`). Automatic stages are planned to
    fit it; any plan that needs more is refused before it compiles."""
    stage_input_shardings: Sequence[Sequence[ShardingSpec | None]] | None = None
    """Alpa's option: per stage, the spec each of its inputs must have, as an
    executable's ``stage_input_shard_specs`` gives them (the arguments of the
    stage's forward, then of its apply-grad); a None leaves that input to the
    planner. A plan for another batch size can so keep an earlier plan's
    layouts."""
    manual_sharding_option: ManualShardingOption | None = None
    """Alpa's option: the specs of the step's inputs (``in_axis_resources``,
    ``PartitionSpec`` trees naming mesh axes), given to every stage function
    that takes them on its mesh (its axis names from ``submesh_axis_names``,
    else ``mesh_axis_names``), and ``pipeline_intermediate_axes`` splitting
    the activations stages pass forward. As in Alpa's pipelines (pjit's
    convention, unlike :class:`ShardParallel`'s), a None leaf is replicated;
    all the rest is left to the planner. ``out_axis_resources`` is not
    supported here. With ``AutoShardingOption(enable_auto_sharding=False)``
    no ILP runs, as in Alpa: each stage function keeps the given specs
    (replicated where none is given) and XLA's sharding propagation lays out
    the rest (``shard-stages{propagate=true}``)."""

    def __post_init__(self) -> None:
        given = self.stage_input_shardings
        if given is not None:
            if isinstance(given, str | bytes) or not all(
                isinstance(stage, Sequence)
                and all(s is None or isinstance(s, ShardingSpec) for s in stage)
                for stage in given
            ):
                raise AlpaError(
                    "stage_input_shardings must be, per stage, a sequence of sharding specs "
                    "(an executable's stage_input_shard_specs)"
                )
            object.__setattr__(self, "stage_input_shardings", tuple(tuple(s) for s in given))
        layer = self.layer_option
        if isinstance(layer, str):
            if layer != "manual":
                raise AlpaError(f"layer_option must be 'manual' or a layer option, got {layer!r}")
            object.__setattr__(self, "layer_option", ManualLayerOption())
        elif layer is not None and not isinstance(layer, ManualLayerOption | AutoLayerOption):
            raise AlpaError(f"layer_option must be a layer option, got {type(layer).__name__}")
        stage = self.stage_option
        if isinstance(stage, str):
            options = {"uniform": UniformStageOption, "auto": AutoStageOption}
            if stage not in options:
                raise AlpaError(
                    f"stage_option must be 'uniform', 'auto' or a stage option, got {stage!r}"
                )
            object.__setattr__(self, "stage_option", options[stage]())
        elif not isinstance(stage, UniformStageOption | ManualStageOption | AutoStageOption):
            raise AlpaError(f"stage_option must be a stage option, got {type(stage).__name__}")
        if self.default_auto_sharding_option is not None:
            object.__setattr__(self, "auto_sharding_option", self.default_auto_sharding_option)
        plugin = self.pipeline_schedule not in PIPESHARD_SCHEDULES
        if plugin:
            known = (*PIPESHARD_SCHEDULES, *plugin_schedules())
            if self.pipeline_schedule not in known:
                listed = ", ".join(f"'{k}'" for k in known)
                raise AlpaError(
                    f"pipeline_schedule must be one of {listed}, got {self.pipeline_schedule!r}"
                )
            if isinstance(self.stage_option, AutoStageOption):
                raise AlpaError(
                    f"pipeline_schedule {self.pipeline_schedule!r} is a plugin's: it runs on "
                    "given stages (UniformStageOption or ManualStageOption); automatic stages "
                    f"plan for {', '.join(PIPESHARD_SCHEDULES)}"
                )
        v = self.virtual_stages
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise AlpaError(f"virtual_stages must be a positive integer, got {v!r}")
        need = {"zb-v": 2}.get(self.pipeline_schedule)
        if v is not None and need is not None and v != need:
            raise AlpaError(f"virtual_stages: zb-v places 2 chunks per mesh, got {v}")
        if v not in (None, 1) and not plugin and self.pipeline_schedule not in VIRTUAL_SCHEDULES:
            raise AlpaError(
                f"virtual_stages={v} needs pipeline_schedule 'interleaved-1f1b' or 'zb-v', got "
                f"{self.pipeline_schedule!r}"
            )
        if v not in (None, 2) and isinstance(self.stage_option, AutoStageOption):
            raise AlpaError(
                f"virtual_stages={v}: automatic stages plan 2 chunks per mesh; give the stages "
                "(UniformStageOption) for more"
            )
        if self.backend not in ("xla", "ray", None):
            raise AlpaError(f"backend must be 'xla' or 'ray', got {self.backend!r}")
        check_memory_option(self.device_memory, "PipeshardParallel(device_memory=...)")
        manual = self.manual_sharding_option
        if manual is not None:
            if not isinstance(manual, ManualShardingOption):
                raise AlpaError(
                    "manual_sharding_option must be a ManualShardingOption, got "
                    f"{type(manual).__name__}"
                )
            if manual.mesh_axis_names is None and manual.submesh_axis_names is None:
                raise AlpaError(
                    "ManualShardingOption: PipeshardParallel needs mesh_axis_names or "
                    "submesh_axis_names to read the specs' axis names"
                )
            if manual.out_axis_resources is not None:
                raise AlpaError(
                    "ManualShardingOption: out_axis_resources is not supported by "
                    "PipeshardParallel (only ShardParallel); give in_axis_resources"
                )

    @property
    def chunks_per_mesh(self) -> int:
        """Chunks of layers on each stage's mesh (``virtual_stages`` or its default)."""
        if self.pipeline_schedule == "zb-v":
            return 2
        if self.pipeline_schedule == "interleaved-1f1b":
            return self.virtual_stages or 2
        if self.is_plugin_schedule:
            return self.virtual_stages or 1
        return 1

    @property
    def is_plugin_schedule(self) -> bool:
        """Whether ``pipeline_schedule`` is a plugin's (not a built-in one)."""
        return self.pipeline_schedule not in PIPESHARD_SCHEDULES

    @property
    def remat_layer(self) -> bool:
        layer = self.layer_option
        return bool(getattr(layer, "remat_layer", False))


def LocalPipelineParallel(num_micro_batches: int = 1) -> PipeshardParallel:
    """Alpa's single-process pipeline runner, for debugging a pipelined step: the
    step's own layers (``mark_pipeline_boundary``), one stage per layer, each on
    one local device, all run in this process."""
    return PipeshardParallel(
        num_micro_batches=num_micro_batches,
        layer_option=ManualLayerOption(),
        stage_option=UniformStageOption(submesh_logical_shape=(1, 1), devices_per_stage=1),
        backend="xla",
    )


@dataclass(frozen=True)
class StagePlacement:
    """Layers ``first..last`` on ``mesh``."""

    first: int
    last: int
    mesh: LogicalDeviceMesh


def _device_ids(devices: Devices, backend: str = "xla") -> tuple[int, ...]:
    """The device ids of a pipeline's devices (see :func:`~alpa_ir.hardware.device_mesh.resolve_mesh`):
    on the ray backend, of the Ray cluster's devices."""
    from alpa_ir.hardware.device_mesh import resolve_mesh
    from alpa_ir.runtime.ray_cluster import backend_devices

    mesh = resolve_mesh(devices, backend_devices(backend))
    assert mesh.devices is not None
    return tuple(mesh.devices)


def uniform_placements(
    num_layers: int, devices: Sequence[int], option: UniformStageOption
) -> list[StagePlacement]:
    stages = option.num_stages or num_layers
    if stages > num_layers:
        raise AlpaError(f"{stages} stages requested but the step has only {num_layers} layers")
    if option.devices_per_stage is not None:
        per_stage = option.devices_per_stage
        if per_stage < 1 or stages * per_stage > len(devices):
            raise AlpaError(
                f"{stages} stages of {per_stage} devices need {stages * per_stage} devices; "
                f"there are {len(devices)}"
            )
    elif len(devices) % stages:
        raise AlpaError(f"{len(devices)} devices cannot be split evenly into {stages} stages")
    else:
        per_stage = len(devices) // stages
    shape = option.submesh_logical_shape or (1, per_stage)
    if math.prod(shape) != per_stage:
        raise AlpaError(
            f"submesh logical shape {list(shape)} does not hold the {per_stage} devices of a stage"
        )
    bounds = [round(k * num_layers / stages) for k in range(stages + 1)]
    return [
        StagePlacement(
            bounds[k],
            bounds[k + 1] - 1,
            LogicalDeviceMesh(
                tuple(shape), devices=tuple(devices[k * per_stage : (k + 1) * per_stage])
            ),
        )
        for k in range(stages)
    ]


def manual_placements(
    num_layers: int, devices: Sequence[int], option: ManualStageOption
) -> list[StagePlacement]:
    logical = option.submesh_logical_shapes
    assert logical is not None
    physical = option.submesh_physical_shapes or logical
    if len(option.forward_stage_layer_ids) != len(logical) or len(physical) != len(logical):
        raise AlpaError(
            f"ManualStageOption has {len(option.forward_stage_layer_ids)} stages but "
            f"{len(logical)} submesh shapes"
            + (f" and {len(physical)} physical shapes" if len(physical) != len(logical) else "")
        )
    for k, (p, lg) in enumerate(zip(physical, logical, strict=True)):
        if math.prod(p) != math.prod(lg):
            raise AlpaError(
                f"ManualStageOption: stage {k}'s physical submesh {tuple(p)} has "
                f"{math.prod(p)} devices, its logical mesh {tuple(lg)} {math.prod(lg)}"
            )
    need = sum(math.prod(s) for s in logical)
    if need != len(devices):
        raise AlpaError(f"the submeshes hold {need} devices but the plan has {len(devices)}")
    out, start = [], 0
    for layers, shape in zip(option.forward_stage_layer_ids, logical, strict=True):
        layers = list(layers)
        if not layers or layers != list(range(layers[0], layers[0] + len(layers))):
            raise AlpaError(f"stage layers {layers} are not consecutive")
        if layers[-1] >= num_layers:
            raise AlpaError(f"stage layers {layers} exceed the step's {num_layers} layers")
        size = math.prod(shape)
        mesh = LogicalDeviceMesh(tuple(shape), devices=tuple(devices[start : start + size]))
        out.append(StagePlacement(layers[0], layers[-1], mesh))
        start += size
    return out
