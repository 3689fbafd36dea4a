"""A Ray cluster of several nodes on this machine for the tests, joined by
``alpa_ir.init`` (tests/conftest.py keeps every node on 127.0.0.1)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import alpa_ir


@contextlib.contextmanager
def joined_cluster(head: dict[str, Any], *others: dict[str, Any]) -> Iterator[Any]:
    """``ray.cluster_utils.Cluster`` with a head node of ``head``'s arguments
    and one node per other argument dict, joined for the block (a Ray instance
    another test module left connected is left first), then torn down."""
    from ray.cluster_utils import Cluster

    from alpa_ir.runtime.ray_cluster import address_record, unadvertise

    alpa_ir.shutdown()
    previous = address_record()
    cluster = Cluster(initialize_head=True, head_node_args=head)
    unadvertise(cluster.address, previous)  # joined by its address, by nobody else
    try:
        for node in others:
            cluster.add_node(**node)
        alpa_ir.init(cluster="ray", address=cluster.address)
        yield cluster
    finally:
        alpa_ir.shutdown()
        cluster.shutdown()
