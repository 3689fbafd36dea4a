"""The artifact's own settings of each method: consistent with the suites they
belong to (the sizes, GPU counts, global batches and the methods measured)."""

from __future__ import annotations

import pytest

from alpa_ir.errors import AlpaError
from alpa_ir.models.measurements import SUITE_METHODS, measurement
from alpa_ir.models.method_settings import (
    METHOD_SETTINGS,
    SOURCE,
    MethodSetting,
    method_setting,
)
from alpa_ir.models.registry import get_config


def test_every_setting_fits_its_suite_size() -> None:
    for s in METHOD_SETTINGS:
        config = get_config(s.model)
        suite = s.model.split("-")[0]
        assert s.method in SUITE_METHODS[suite], s
        assert measurement(s.model, config.num_gpus, s.method) is not None, s
        assert s.micro_batches and all(config.batch_size % b == 0 for b in s.micro_batches), s
        if s.method == "intra-op":
            assert s.logical_mesh is not None
            assert s.logical_mesh[0] * s.logical_mesh[1] == config.num_gpus, s
        if s.method == "megatron":
            assert s.logical_mesh is not None and s.stages is not None
            dp, tp = s.logical_mesh
            assert dp * tp * s.stages == config.num_gpus, s
        assert s.source.endswith(".py")
    keys = [(s.model, s.method) for s in METHOD_SETTINGS]
    assert len(keys) == len(set(keys))
    assert "osdi22_artifact" in SOURCE


def test_the_scripts_settings_as_read() -> None:
    intra = method_setting("gpt3-6.7b", "intra-op")
    assert intra is not None and intra.logical_mesh == (2, 8) and intra.micro_batches == (64,)
    # Wide-ResNet's intra-op-only runs kept every activation
    wide = method_setting("wresnet-4b", "intra-op")
    assert wide is not None and not wide.remat and wide.micro_batches == (64,)
    # inter-op only tried several micro-batch counts and kept the best
    inter = method_setting("gpt3-6.7b", "inter-op")
    assert inter is not None and inter.micro_batches == (128, 256, 512, 1024)
    megatron = method_setting("gpt3-15b", "megatron")
    assert megatron is not None and (megatron.logical_mesh, megatron.stages) == ((1, 4), 8)
    assert method_setting("moe-380m", "deepspeed") is None  # another system: Alpa's settings
    assert method_setting("gpt3-39b", "megatron") is None  # not in the artifact's best suite


def test_wide_resnet_baselines_keep_the_manual_plans_they_ran() -> None:
    """The artifact measured Wide-ResNet's inter-op-only and PP-DP rows with
    manual plans (its result suites); the rows are those plans, not a search."""
    inter = method_setting("wresnet-2b", "inter-op")
    assert inter is not None and inter.micro_batches == (96,)
    assert inter.stage_layer_ids == (
        (0, 1, 2),
        (3, 4, 5),
        (6, 7),
        (8, 9, 10),
        (11, 12),
        (13,),
        (14,),
        (15,),
    )
    assert inter.submeshes == ((1, 1),) * 8
    pp_dp = method_setting("wresnet-4b", "pp-dp")
    assert pp_dp is not None and pp_dp.micro_batches == (384,)
    assert pp_dp.stage_layer_ids == tuple((k,) for k in range(16))
    two = method_setting("wresnet-2b", "pp-dp")
    assert two is not None and two.submeshes == ((1, 4), (1, 1), (1, 2), (1, 1))
    assert two.logical_meshes == ((4, 1), (1, 1), (2, 1), (1, 1))
    for s in METHOD_SETTINGS:
        if s.stage_layer_ids is not None:
            config = get_config(s.model)
            assert sum(a * b for a, b in s.submeshes) == config.num_gpus, s


def test_a_manual_plan_that_skips_a_layer_is_refused() -> None:
    with pytest.raises(AlpaError, match=r"not 0\.\.15 in order"):
        MethodSetting(
            "wresnet-1b",
            "inter-op",
            (64,),
            True,
            "x.py",
            stage_layer_ids=((0, 1), tuple(range(3, 16))),
            submeshes=((1, 1), (1, 1)),
            logical_meshes=((1, 1), (1, 1)),
        )
    with pytest.raises(AlpaError, match="does not have the devices"):
        MethodSetting(
            "wresnet-1b",
            "pp-dp",
            (32,),
            True,
            "x.py",
            stage_layer_ids=(tuple(range(16)),),
            submeshes=((1, 2),),
            logical_meshes=((4, 1),),
        )
