"""The sharding dialect's collective ops and their kinds."""

from __future__ import annotations

from alpa_ir.costs.collective_accounting import KINDS as HLO_KINDS
from alpa_ir.dialects import sharding


def test_every_collective_op_names_its_kind_once() -> None:
    """Each collective op's kind is what XLA compiles for it (the reshard,
    lowered to others, has none), and the HLO name reads back to the kind."""
    ops = {
        c.name: c.KIND
        for c in vars(sharding).values()
        if isinstance(c, type)
        and issubclass(c, sharding.CollectiveOp)
        and c is not sharding.CollectiveOp
    }
    assert ops == {
        "sharding.all_reduce": sharding.CollectiveKind.ALL_REDUCE,
        "sharding.all_reduce_program": sharding.CollectiveKind.ALL_REDUCE,
        "sharding.all_gather": sharding.CollectiveKind.ALL_GATHER,
        "sharding.reduce_scatter": sharding.CollectiveKind.REDUCE_SCATTER,
        "sharding.all_to_all": sharding.CollectiveKind.ALL_TO_ALL,
        "sharding.reshard": None,
    }
    for kind in sharding.CollectiveKind:
        assert kind.hlo in HLO_KINDS
        assert sharding.CollectiveKind.from_hlo(kind.hlo) is kind
    assert sharding.CollectiveKind.from_hlo("collective-permute") is None
