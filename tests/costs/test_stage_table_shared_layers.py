"""A ``layer-sum`` table whose layers share cost objects (an expanded table,
:mod:`alpa_ir.pipeline.repeated_layers`) reads each distinct object once; its
arrays equal those of the same table with every layer's cost a copy of its own."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from alpa_ir.costs.stage_table import StageCostTable, ViewCost, submesh_views
from alpa_ir.hardware.clusters import Cluster, ClusterLevel


def test_shared_layer_costs_give_the_arrays_of_distinct_copies() -> None:
    cluster = Cluster(
        "shared",
        (ClusterLevel("node", 2, 1e9, 1e-5), ClusterLevel("gpu", 2, 1e11, 1e-6)),
        1e9,
        1e12,
    )
    views = submesh_views(cluster, "all")
    layers = 7
    saving = ViewCost(2.5, 40.0, 9.0, 8.0, 3.0, 2.0, gradients=10.0, optimizer_state=20.0)
    interior = ViewCost(1.5, 100.0, 10.0, 8.0, 4.0, 2.0, saving, 30.0, 60.0)
    first = ViewCost(0.75, 60.0, 5.0, 6.0, 7.0, 1.0, gradients=15.0)
    last = ViewCost(0.5, 30.0, 6.0, 5.0, 1.0, 0.5, gradients=5.0)
    rng = np.random.default_rng(0)
    internal = np.triu(rng.uniform(0.0, 1.0, (layers, layers)))
    shared, copies = (
        StageCostTable(cluster, tuple(views), views, layers, internal=(internal, internal / 2))
        for _ in range(2)
    )
    for meshes in views.values():
        for view in meshes:
            for k in range(layers):
                cost = first if k == 0 else last if k == layers - 1 else interior
                shared.costs[(k, k, view.shape)] = cost
                copies.costs[(k, k, view.shape)] = replace(cost)
    for meshes in views.values():
        for view in meshes:
            a, b = shared.arrays(view.shape), copies.arrays(view.shape)
            assert a.keys() == b.keys()
            for name in a:
                assert np.array_equal(a[name], b[name]), name
            # the memory-saving choice of a range of interior layers is their savings' sum
            assert a["latency"][1, 1, 3] == 3 * 2.5 and a["latency"][0, 1, 3] == 3 * 1.5
