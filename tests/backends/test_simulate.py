"""The simulate backend: iteration time against Eq. 2, schedules, transfers, peak memory."""

from __future__ import annotations

import itertools

import pytest

from alpa_ir.backends.simulate import (
    GiB,
    SimPlan,
    SimStage,
    SimulateBackend,
    eq2_latency,
    simulate,
)
from alpa_ir.errors import AlpaError, PlanError
from alpa_ir.plugins.registry import default_registry


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize(("stages", "micro_batches"), [(1, 1), (1, 5), (2, 4), (4, 8), (5, 3)])
@pytest.mark.parametrize(("fwd", "bwd"), [(1.0, 1.0), (1.0, 2.0), (0.25, 0.75)])
def test_equal_stages_without_transfers_match_eq2(
    schedule: str, stages: int, micro_batches: int, fwd: float, bwd: float
) -> None:
    plan = SimPlan(tuple(SimStage(fwd, bwd) for _ in range(stages)), micro_batches, schedule)
    expected = (stages + micro_batches - 1) * (fwd + bwd)
    assert eq2_latency(plan) == pytest.approx(expected)
    assert simulate(plan).iteration_time == pytest.approx(expected)


def test_unequal_stages_lie_between_the_bottleneck_and_eq2() -> None:
    # Eq. 2 charges every stage's full time once plus (B - 1) bottleneck times; the
    # schedule overlaps the fast stages with the slow one, so it is an upper bound here.
    # Lower bound: stage 1 (6 s per micro-batch) cannot start before stage 0's first
    # forward (1 s) and is followed by stage 0's last backward (2 s).
    stages = (SimStage(1.0, 2.0), SimStage(2.0, 4.0), SimStage(0.5, 1.0))
    for schedule in ("gpipe", "1f1b"):
        plan = SimPlan(stages, 6, schedule)
        t = simulate(plan).iteration_time
        assert 1.0 + 6 * 6.0 + 2.0 - 1e-9 <= t <= eq2_latency(plan) + 1e-9


def test_transfers_and_apply_grad_add_to_the_critical_path() -> None:
    stages = (SimStage(1.0, 1.0, apply_grad=0.5), SimStage(1.0, 1.0, apply_grad=0.5))
    base = simulate(SimPlan(stages, 4, "1f1b")).iteration_time
    assert base == pytest.approx(eq2_latency(SimPlan(stages, 4)) + 0.5)
    # 1F1B on 2 stages keeps stage 0 waiting for stage 1's backward: traced by hand,
    # stage 0 runs F0 [0, 1], F1 [1, 2], B0 [3.6, 4.6], F2, B1 [5.6, 6.6], F3, B2 [8.2, 9.2],
    # B3 [10.2, 11.2], apply-grad to 11.7: four round trips' transfers are exposed.
    slow = simulate(SimPlan(stages, 4, "1f1b", forward_transfers=(0.3,))).iteration_time
    assert slow == pytest.approx(11.7)
    # GPipe exposes one forward and one backward transfer.
    gpipe = simulate(SimPlan(stages, 4, "gpipe", forward_transfers=(0.3,))).iteration_time
    assert gpipe == pytest.approx(base + 2 * 0.3)
    asym = SimPlan(stages, 4, "gpipe", forward_transfers=(0.3,), backward_transfers=(0.1,))
    assert simulate(asym).iteration_time == pytest.approx(base + 0.4)


def test_a_link_carries_one_micro_batch_at_a_time() -> None:
    """A forward transfer of 3 s between stages of 1 s: the link, not the
    stages, sets the pace (arrivals at 4, 7, 10, 13), as a slow stage would."""
    stages = (SimStage(1.0, 1.0), SimStage(1.0, 1.0))
    plan = SimPlan(stages, 4, "gpipe", forward_transfers=(3.0,), backward_transfers=(0.0,))
    result = simulate(plan)
    starts = sorted(t.start for t in result.timeline if (t.stage, t.phase) == (1, "forward"))
    assert starts == pytest.approx([4.0, 7.0, 10.0, 13.0])
    assert result.iteration_time == pytest.approx(19.0)


def test_meshes_sharing_a_hosts_cores_take_the_longer_of_work_and_critical_path() -> None:
    """Two meshes of 4 devices on one host of 8 (one device alone 8x faster
    than all busy): priced all busy, GPipe over 4 micro-batches takes
    (2 + 4 - 1) x 3 = 15 s on devices of their own; sharing the cores, a mesh
    runs at most 8 / 4 = 2x faster (7.5 s on the critical path), and the 24 s
    of tasks x 4 devices spread over 8 devices take 12 s."""
    stages = (SimStage(1.0, 2.0, num_devices=4), SimStage(1.0, 2.0, num_devices=4))
    own = SimPlan(stages, 4, "gpipe")
    assert simulate(own).iteration_time == pytest.approx(15.0)
    shared = SimPlan(stages, 4, "gpipe", solo_speedup=8.0)
    result = simulate(shared)
    assert result.iteration_time == pytest.approx(12.0)
    assert max(t.end for t in result.timeline) == pytest.approx(7.5)
    # a mesh alone 1.5x faster: 10 s on the critical path, the work still 12 s
    slow = simulate(SimPlan(stages, 4, "gpipe", solo_speedup=1.5))
    assert slow.iteration_time == pytest.approx(12.0)
    assert max(t.end for t in slow.timeline) == pytest.approx(10.0)
    # the critical path leads where one stage does all the work
    lopsided = (SimStage(1.0, 2.0, num_devices=4), SimStage(0.0, 0.0, num_devices=4))
    assert simulate(SimPlan(lopsided, 4, "gpipe", solo_speedup=8.0)).iteration_time == (
        pytest.approx(6.0)
    )
    with pytest.raises(AlpaError, match=r"solo_speedup must be >= 1, got 0\.5"):
        simulate(SimPlan(stages, 4, "gpipe", solo_speedup=0.5))


def test_timeline_honours_the_dependencies() -> None:
    plan = SimPlan(tuple(SimStage(1.0, 2.0) for _ in range(3)), 4, "1f1b", (0.2, 0.2))
    result = simulate(plan)
    at = {(t.stage, t.phase, t.micro_batch): t for t in result.timeline}
    for s in range(3):
        for b in range(4):
            if s:
                assert at[(s, "forward", b)].start >= at[(s - 1, "forward", b)].end + 0.2 - 1e-9
            if s < 2:
                assert at[(s, "backward", b)].start >= at[(s + 1, "backward", b)].end + 0.2 - 1e-9
        busy = sorted((t.start, t.end) for t in result.timeline if t.stage == s)
        assert all(a[1] <= b[0] + 1e-12 for a, b in itertools.pairwise(busy))
    # 1F1B on stage 0: forwards of 3 micro-batches, then a backward before the 4th forward.
    order = [(t.phase, t.micro_batch) for t in result.timeline if t.stage == 0]
    assert order[:5] == [
        ("forward", 0),
        ("forward", 1),
        ("forward", 2),
        ("backward", 0),
        ("forward", 3),
    ]


def test_peak_memory_gpipe_keeps_all_micro_batches_1f1b_keeps_stages_left() -> None:
    act, persistent = 1 * GiB, 2 * GiB
    stages = tuple(SimStage(1.0, 2.0, 0.0, persistent, act) for _ in range(4))
    gpipe = simulate(SimPlan(stages, 8, "gpipe"))
    one_f = simulate(SimPlan(stages, 8, "1f1b"))
    assert gpipe.max_in_flight == (8, 8, 8, 8)
    assert one_f.max_in_flight == (4, 3, 2, 1)
    assert gpipe.peak_memory == tuple(persistent + 8 * act for _ in range(4))
    assert one_f.peak_memory == tuple(persistent + (4 - i) * act for i in range(4))
    # Fewer micro-batches than stages: 1F1B holds at most B.
    assert simulate(SimPlan(stages, 2, "1f1b")).max_in_flight == (2, 2, 2, 1)


def test_gpipe_out_of_memory_where_1f1b_fits() -> None:
    stages = tuple(
        SimStage(1.0, 2.0, 0.0, 2 * GiB, 1 * GiB, device_memory=6 * GiB) for _ in range(4)
    )
    simulate(SimPlan(stages, 8, "1f1b"))  # stage 0 holds 2 + 4 x 1 GiB
    with pytest.raises(
        PlanError, match=r"stage 0 is out of memory under gpipe: it needs 10\.000 GiB"
    ):
        simulate(SimPlan(stages, 8, "gpipe"))


def test_1f1b_out_of_memory_on_the_first_stage_only() -> None:
    stages = tuple(
        SimStage(1.0, 2.0, 0.0, 2 * GiB, 1 * GiB, device_memory=5 * GiB) for _ in range(4)
    )
    with pytest.raises(PlanError) as err:
        simulate(SimPlan(stages, 8, "1f1b"))
    assert "stage 0 is out of memory under 1f1b: it needs 6.000 GiB" in str(err.value)
    assert "the device has 5.000 GiB" in str(err.value) and "\n" not in str(err.value)
    result = simulate(SimPlan(stages, 8, "1f1b"), check_memory=False)
    assert result.peak_memory[0] == 6 * GiB


@pytest.mark.parametrize(
    ("plan", "message"),
    [
        (SimPlan((), 4), "the plan has no stages"),
        (SimPlan((SimStage(1.0),), 0), "num_micro_batches must be an int >= 1, got 0"),
        (
            SimPlan((SimStage(1.0),), 2, "interleaved"),
            "unknown schedule 'interleaved'; known: gpipe, 1f1b",
        ),
        (SimPlan((SimStage(-1.0),), 2), "stage 0 forward must be finite and >= 0 seconds"),
        (SimPlan((SimStage(float("nan")),), 2), "stage 0 forward must be finite"),
        (
            SimPlan((SimStage(1.0), SimStage(1.0)), 2, "1f1b", (0.1, 0.2)),
            "forward_transfers needs 1 values",
        ),
        (
            SimPlan((SimStage(1.0), SimStage(1.0)), 2, "1f1b", (-0.1,)),
            r"forward_transfers\[0\] must be finite",
        ),
        (SimPlan((SimStage(1.0, activation_memory=-1.0),), 2), "activation_memory must be >= 0"),
        (SimPlan((SimStage(1.0, device_memory=0.0),), 2), "device_memory must be > 0"),
    ],
)
def test_bad_plans_are_one_line_errors(plan: SimPlan, message: str) -> None:
    with pytest.raises(AlpaError, match=message) as err:
        simulate(plan)
    assert "\n" not in str(err.value)


def test_registered_as_backend_and_scales_to_many_stages() -> None:
    backend = default_registry().get("backends", "simulate")()
    assert isinstance(backend, SimulateBackend)
    # 64 stages (e.g. 64 x 8 GPUs, planning on paper) with 128 micro-batches, no execution.
    plan = SimPlan(tuple(SimStage(0.01, 0.02) for _ in range(64)), 128, "1f1b")
    assert backend.simulate(plan).iteration_time == pytest.approx((64 + 127) * 0.03)


def _outlined_module(num_micro_batches: int, schedule: str) -> object:
    import jax
    import jax.numpy as jnp

    import alpa_ir
    from alpa_ir.hardware.clusters import get_cluster
    from alpa_ir.ir.module_utils import main_function
    from alpa_ir.pipeline.stage_assignment import StageSlice
    from alpa_ir.pipeline.stage_outline import outline_stages

    def step(params: list[jax.Array], x: jax.Array) -> tuple[list[jax.Array], jax.Array]:
        def loss(p: list[jax.Array]) -> jax.Array:
            h = jnp.tanh(x @ p[0])
            h = alpa_ir.mark_pipeline_boundary(h)
            return jnp.mean(jnp.tanh(h @ p[1]) ** 2)

        value, grads = alpa_ir.value_and_grad(loss)(params)
        return [w - 0.1 * g for w, g in zip(params, grads, strict=True)], value

    params = [jnp.full((32, 32), 0.01), jnp.full((32, 32), 0.01)]
    module = alpa_ir.import_jax(step, params, jnp.ones((8, 32)), batch_argnums=(1,))
    cluster = get_cluster("alpa-testbed", num_nodes=1)
    main = main_function(module)
    for k, devices in enumerate(((0, 1, 2, 3), (4, 5, 6, 7))):
        mesh = cluster.logical_mesh((1, 4), devices).to_op(f"mesh{k}")
        module.body.block.insert_op_before(mesh, main)  # type: ignore[attr-defined]
    slices = [StageSlice(0, 0, "mesh0"), StageSlice(1, 1, "mesh1")]
    outline_stages(module, slices, num_micro_batches, schedule)  # type: ignore[arg-type]
    return module, cluster


def test_an_outlined_module_is_priced_per_stage_and_simulated() -> None:
    from alpa_ir.backends.simulate import plan_from_module

    module, cluster = _outlined_module(4, "1f1b")
    plan = plan_from_module(module, cluster)  # type: ignore[arg-type]
    assert plan.num_micro_batches == 4 and plan.schedule == "1f1b"
    assert len(plan.stages) == 2
    # Every stage, the last too, has a forward and a backward function (as in Alpa).
    for stage in plan.stages:
        assert stage.forward > 0 and stage.backward > 0 and stage.apply_grad > 0
        # One 32x32 f32 layer (w, its gradient, Adam-style m and v), sharded over 4 devices.
        assert 4 * 32 * 32 * 4 / 4 <= stage.persistent_memory <= 4 * 32 * 32 * 4
        assert stage.activation_memory > 0 and stage.num_devices == 4
    result = SimulateBackend().compile(module, cluster)  # type: ignore[arg-type]
    assert result.iteration_time == pytest.approx(simulate(plan).iteration_time)
    assert result.iteration_time >= eq2_latency(plan)  # apply-grad comes on top
