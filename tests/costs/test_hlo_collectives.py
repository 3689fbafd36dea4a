"""``alpa_ir.costs.collective_accounting``: every replica-group spelling XLA prints, bytes
of each collective kind, async pairs, and agreement with a real compile."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

import alpa_ir
from alpa_ir.costs.collective_accounting import hlo_collectives, total_wire_bytes

SYNTHETIC = """
HloModule m, entry_computation_layout={(f32[8,16]{1,0})->f32[]}

ENTRY %main (p: f32[8,16]) -> f32[] {
  %p = f32[8,16]{1,0} parameter(0)
  %ar = f32[8,16]{1,0} all-reduce(f32[8,16]{1,0} %p), channel_id=1, replica_groups={}, to_apply=%add
  %ag = bf16[32,16]{1,0} all-gather(%p), channel_id=2, replica_groups=[2,4]<=[8], dimensions={0}
  %rs = f32[2,16]{1,0} reduce-scatter(%p), channel_id=3, replica_groups=[4,2]<=[2,4]T(1,0), dimensions={0}
  %tuple-ar = (f32[8,16]{1,0}, f32[4]{0}) all-reduce(%p, %small), channel_id=4, replica_groups={{0,1},{2,3},{4,5},{6,7}}
  %ags = (f32[8,16]{1,0}, f32[16,16]{1,0}) all-gather-start(%p), channel_id=5, replica_groups={{0,1}}, dimensions={0}
  %agd = f32[16,16]{1,0} all-gather-done(%ags)
  %cp = f32[8,16]{1,0} collective-permute(%p), source_target_pairs={{0,1},{1,0}}
  ROOT %a2a = f32[8,16]{1,0} all-to-all(%p), channel_id=6, replica_groups=[1,8]<=[8], dimensions={0}
}
"""


def test_synthetic_spellings() -> None:
    records = {r.name: r for r in hlo_collectives(SYNTHETIC)}
    assert set(records) == {"ar", "ag", "rs", "tuple-ar", "ags", "cp", "a2a"}  # no -done
    assert records["ar"].kind == "all-reduce" and records["ar"].bytes == 512
    assert records["ar"].replica_groups == () and records["ar"].group_size is None
    assert records["ag"].bytes == 32 * 16 * 2  # bf16 result
    assert records["ag"].replica_groups == ((0, 1, 2, 3), (4, 5, 6, 7))
    assert records["rs"].bytes == 512  # the operand, looked up by name
    assert records["rs"].replica_groups == ((0, 4), (1, 5), (2, 6), (3, 7))
    assert records["tuple-ar"].group_size == 2
    assert records["ags"].kind == "all-gather" and records["ags"].bytes == 16 * 16 * 4
    assert records["cp"].replica_groups == ((0, 1), (1, 0))
    assert records["a2a"].replica_groups == (tuple(range(8)),)
    assert records["ar"].wire_bytes(8) == pytest.approx(2 * 7 / 8 * 512)
    assert records["rs"].wire_bytes() == pytest.approx(256)


def test_public_name() -> None:
    assert alpa_ir.hlo_collectives is hlo_collectives


def test_real_compile_records_every_collective() -> None:
    mesh = Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("a", "b"))

    def body(x: jax.Array) -> jax.Array:
        y = jax.lax.psum(x, "b")
        z = jax.lax.all_gather(x, "a", tiled=True)
        w = jax.lax.psum_scatter(x, ("a", "b"), tiled=True)
        return y.sum() + z.sum() + w.sum()

    step = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P(), out_specs=P(), check_vma=False))
    text = step.lower(jnp.ones((16, 16), jnp.float32)).compile().as_text()
    kinds = sorted((r.kind, r.bytes, r.group_size) for r in hlo_collectives(text))
    assert kinds == [("all-gather", 2048, 2), ("all-reduce", 1024, 4), ("reduce-scatter", 1024, 8)]
    wire = total_wire_bytes(hlo_collectives(text), 8)
    assert wire == pytest.approx(2048 / 2 + 2 * 3 / 4 * 1024 + 7 / 8 * 1024)
