"""A repeated group's strategies read the first group's tables through the
group's renaming (:mod:`alpa_ir.autosharding.node_strategy`)."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import alpa_ir
from alpa_ir.autosharding.node_strategy import (
    GroupRenaming,
    NodeStrategy,
    RenamedStrategy,
    operand_column,
    value_column,
)
from alpa_ir.dialects.sharding import ShardingSpec
from alpa_ir.ir.module_utils import main_function

S1, S2, S3, S4 = (ShardingSpec.replicated(rank) for rank in (1, 2, 3, 4))


def _ops() -> list[Any]:
    """Two groups alike: (cos, sin) twice."""
    module = alpa_ir.import_jax(
        lambda x: jnp.sin(jnp.cos(jnp.sin(jnp.cos(x)))), jax.ShapeDtypeStruct((4,), np.float32)
    )
    ops = list(main_function(module).body.block.ops)[:4]
    assert [op.primitive_name for op in ops] == ["cos", "sin", "cos", "sin"]
    return ops


def test_a_renamed_strategy_reads_the_first_groups_tables_under_the_new_names() -> None:
    cos_a, sin_b, cos_c, sin_d = _ops()
    a, b, c, d = (op.results[0] for op in (cos_a, sin_b, cos_c, sin_d))
    source = NodeStrategy(
        "S0", 2.5, {a: S1, b: S2}, {cos_a: "ta", sin_b: "tb"}, {(cos_a, 0): S3, (sin_b, 1): S4}
    )
    renamed = RenamedStrategy(source, GroupRenaming([cos_a, sin_b], [cos_c, sin_d]))
    assert (renamed.name, renamed.cost) == ("S0", 2.5)
    assert dict(renamed.value_specs) == {c: S1, d: S2}
    assert dict(renamed.op_strategies) == {cos_c: "ta", sin_d: "tb"}
    assert dict(renamed.operand_specs) == {(cos_c, 0): S3, (sin_d, 1): S4}
    assert a not in renamed.value_specs  # the first group's names are not its own
    assert renamed.value_specs.get(b) is None
    assert len(renamed.operand_specs) == 2


def test_columns_read_every_strategy_of_a_node() -> None:
    cos_a, sin_b, cos_c, sin_d = _ops()
    a, b, _c, d = (op.results[0] for op in (cos_a, sin_b, cos_c, sin_d))
    first = [
        NodeStrategy("S0", 0.0, {a: S1, b: S2}, {}, {(sin_b, 0): S1}),
        NodeStrategy("S1", 1.0, {a: S3, b: S4}, {}, {(sin_b, 0): S3}),
    ]
    renaming = GroupRenaming([cos_a, sin_b], [cos_c, sin_d])
    repeated = [RenamedStrategy(s, renaming) for s in first]
    assert value_column(first, b) == [S2, S4]
    assert value_column(repeated, d) == [S2, S4]
    assert operand_column(repeated, (sin_d, 0)) == [S1, S3]
    assert operand_column(first, (sin_b, 0)) == [S1, S3]
    assert value_column(repeated, d) == [s.value_specs[d] for s in repeated]
