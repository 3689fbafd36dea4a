"""AutoStageOption's submesh fields, as Alpa's: the option checks them and a
pipeline planned in Alpa's small space runs."""

from __future__ import annotations

import pytest
from zoo_fixtures import same_steps, tiny_step

import alpa_ir
from alpa_ir.errors import AlpaError


def test_auto_stage_option_takes_alpas_fields() -> None:
    with pytest.raises(AlpaError, match="submesh_physical_shape_space must be one of"):
        alpa_ir.AutoStageOption(submesh_physical_shape_space="tiny")  # type: ignore[arg-type]
    with pytest.raises(AlpaError, match="manually_specified_submeshes go with"):
        alpa_ir.AutoStageOption(manually_specified_submeshes=[(1, 2)])
    option = alpa_ir.AutoStageOption(
        submesh_physical_shape_space="manual", manually_specified_submeshes=[[1, 2], [1, 4]]
    )
    assert option.manually_specified_submeshes == ((1, 2), (1, 4))


def test_a_pipeline_planned_in_alpas_small_space_equals_one_device() -> None:
    """Alpa's test_stage_construction space (small_power_of_two, same_as_physical)
    on the 8 local devices: every stage mesh is a (1, 2^k) submesh viewed as
    itself, and the pipelined step equals one device."""
    fn, (state, batch) = tiny_step("mlp-tiny")
    option = alpa_ir.AutoStageOption(
        submesh_physical_shape_space="small_power_of_two",
        submesh_logical_shape_space="same_as_physical",
    )
    method = alpa_ir.PipeshardParallel(
        num_micro_batches=2, layer_option=alpa_ir.AutoLayerOption(layer_num=2), stage_option=option
    )
    parallel = alpa_ir.parallelize(fn, method=method, donate_argnums=())
    executable = parallel.get_executable(state, batch)
    assert "physical-space=small-power-of-two" in executable.pass_pipeline
    assert "submesh-space=same-as-physical" in executable.pass_pipeline
    for info in executable.program.meshes.values():
        assert info.shape[0] == 1 and len(info.device_ids) & (len(info.device_ids) - 1) == 0
    same_steps(parallel, fn, state, batch, 1, state_tol=1e-5)


def test_layer_profile_mode_is_alpas_name_of_cost_mode() -> None:
    """Alpa's ``individual`` (each layer alone, summed) and ``composite`` (each
    range whole) are the cost modes ``layer-sum`` and ``range``."""
    assert alpa_ir.AutoStageOption(layer_profile_mode="individual").cost_mode == "layer-sum"
    assert alpa_ir.AutoStageOption(layer_profile_mode="composite").cost_mode == "range"
    assert alpa_ir.AutoStageOption(cost_mode="range").cost_mode == "range"
    with pytest.raises(AlpaError, match="layer_profile_mode must be 'composite' or 'individual'"):
        alpa_ir.AutoStageOption(layer_profile_mode="both")  # type: ignore[arg-type]
    with pytest.raises(AlpaError, match="but cost_mode='range' is given"):
        alpa_ir.AutoStageOption(cost_mode="range", layer_profile_mode="individual")
