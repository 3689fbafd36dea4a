"""The main job: alpa-demo plans, draws, trains and checks itself against one device."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from alpa_ir.tools.demo import main


def test_demo_trains_draws_and_matches_one_device(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pictures = tmp_path / "pictures"
    assert main(["--steps", "2", "--pictures", str(pictures)]) == 0
    out = capsys.readouterr().out
    assert "pipeline: 2 stages, 2 micro-batches" in out
    # pipeline, data and tensor parallel at once: (2, 2) meshes, and a weight
    # split or a matrix product split over both mesh axes (since the last
    # stage's backward is a program of its own, its forward may take the
    # weights whole and split the batch over both axes)
    assert len(re.findall(r"stage \d: layers \S+ on mesh \[2, 2\]", out)) == 2
    weight_split = re.search(r"input \[\d+, \d+\]: \[(R, S1|S1, R)\]", out)
    both_axes = re.search(r"dot_general -> [^(]*\(strategy [^)]*->1[^)]*->0", out)
    assert weight_split or both_axes, out
    assert sorted(p.name for p in pictures.iterdir()) == [
        "devices.png", "memory.png", "shardings.png", "timeline.png",
    ]  # fmt: skip
    losses = [float(x) for x in re.findall(r"step \d: loss (\d+\.\d+)", out)]
    assert len(losses) == 2 and losses[1] < losses[0]
    assert re.search(r"one device after 2 steps: loss \d+\.\d+ \(equal\)", out)


@pytest.mark.ray
@pytest.mark.xdist_group("multi_host")
def test_demo_on_two_ray_hosts(capsys: pytest.CaptureFixture[str]) -> None:
    """alpa-demo --cluster ray --hosts 2: a Ray cluster of two nodes on this
    machine, one stage mesh on each, the loss equal to one device's."""
    import alpa_ir

    alpa_ir.shutdown()  # a Ray instance another test module left connected
    assert main(["--cluster", "ray", "--hosts", "2", "--steps", "1"]) == 0
    out = capsys.readouterr().out
    assert "ray: 2 hosts of 4 devices on this machine" in out
    assert "stage 0: mesh @mesh0 [2, 2] on host" in out
    hosts = re.findall(r"stage \d: mesh @mesh\d \[2, 2\] on (host\d)", out)
    assert sorted(hosts) == ["host0", "host1"]
    assert re.search(r"one device after 1 steps: loss \d+\.\d+ \(equal\)", out)


@pytest.mark.ray
@pytest.mark.xdist_group("multi_host")
def test_demo_joins_a_running_cluster(capsys: pytest.CaptureFixture[str]) -> None:
    """alpa-demo --cluster ray --address: the cluster's hosts run the stages
    (here one node of 4 devices holding both stage meshes, the transfers
    between them local copies; this process plans with its 8 devices); the
    loss equals one device's."""
    from ray.cluster_utils import Cluster

    import alpa_ir
    from alpa_ir.runtime.ray_cluster import address_record, unadvertise

    alpa_ir.shutdown()
    previous = address_record()
    cluster = Cluster(
        initialize_head=True, head_node_args={"num_cpus": 1, "resources": {"alpa_cpu_device": 4}}
    )
    address = cluster.address
    unadvertise(address, previous)  # joined by its address, by no other test
    try:
        argv = ["--cluster", "ray", "--address", address, "--devices", "4", "--steps", "1"]
        assert main(argv) == 0
    finally:
        cluster.shutdown()
    out = capsys.readouterr().out
    assert f"ray: the cluster at {address} (host0 (127.0.0.1): 4 alpa_cpu_device)" in out
    assert re.findall(r"stage \d: mesh @mesh\d \[1, 2\] on (host\d)", out) == ["host0", "host0"]
    assert re.search(r"one device after 1 steps: loss \d+\.\d+ \(equal\)", out)
