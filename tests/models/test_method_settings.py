"""The artifact's own settings of each method: consistent with the suites they
belong to (the sizes, GPU counts, global batches and the methods measured)."""

from __future__ import annotations

from alpa_ir.models.measurements import SUITE_METHODS, measurement
from alpa_ir.models.method_settings import METHOD_SETTINGS, SOURCE, method_setting
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
