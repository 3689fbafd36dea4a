"""Why this plan: each stage's logical mesh beside the runner-up for its layers."""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, ClassVar

from alpa_ir.api.why_plan import stage_reasons


@dataclass(frozen=True)
class _Cost:
    latency: float

    def choices(self) -> tuple[_Cost, ...]:
        return (self,)


class _Table:
    """Costs of layers 0-1 on the views of a 1x2 and a 1x4 submesh."""

    submeshes = ((1, 2), (1, 4))
    views: ClassVar[dict[tuple[int, int], Any]] = {
        (1, 2): (SimpleNamespace(shape=(1, 2)), SimpleNamespace(shape=(2, 1))),
        (1, 4): (SimpleNamespace(shape=(1, 4)), SimpleNamespace(shape=(2, 2))),
    }
    latency: ClassVar[dict[tuple[int, ...], float]] = {
        (1, 2): 3.0,
        (2, 1): 3.1,
        (1, 4): 1.5,
        (2, 2): 1.2,
    }

    def cost(self, first: int, last: int, shape: tuple[int, ...]) -> _Cost:
        return _Cost(self.latency[tuple(shape)])


def _plan(submesh: tuple[int, int], shape: tuple[int, int], latency: float) -> Any:
    stage = SimpleNamespace(
        first=0, last=1, submesh=submesh, mesh=SimpleNamespace(shape=shape), latency=latency
    )
    return SimpleNamespace(stages=(stage,))


def test_runner_up_is_another_mesh_shape_on_as_many_devices() -> None:
    (reason,) = stage_reasons(_Table(), _plan((1, 4), (2, 2), 1.2))  # type: ignore[arg-type]
    assert (reason.chosen.view, reason.runner_up.view) == ((2, 2), (1, 4))  # type: ignore[union-attr]
    assert reason.text() == (
        "stage 0, layers 0-1: submesh 1x4 as logical mesh [2, 2], 1200 ms per micro-batch; "
        "runner-up: 4 devices 1x4 as [1, 4], 1500 ms (+25.0 %)"
    )


def test_a_transposed_mesh_is_not_a_runner_up() -> None:
    """On 2 devices [2, 1] is [1, 2] transposed: the runner-up comes from elsewhere."""
    (reason,) = stage_reasons(_Table(), _plan((1, 2), (1, 2), 3.0))  # type: ignore[arg-type]
    assert reason.runner_up is not None and reason.runner_up.view == (2, 2)
    assert "runner-up: 4 devices 1x4 as [2, 2], 1200 ms (-60.0 %)" in reason.text()


def test_sharding_terms_name_the_op_and_the_users_line() -> None:
    """A Megatron-style plan: the largest terms are the all-reduces after the
    row-split matmul, named with its strategy and the line that wrote it."""
    import jax.numpy as jnp

    import alpa_ir

    def step(w1: jnp.ndarray, w2: jnp.ndarray, x: jnp.ndarray) -> jnp.ndarray:
        return jnp.tanh(x @ w1) @ w2  # the line the term names

    args = (jnp.ones((64, 256)), jnp.ones((256, 64)), jnp.ones((16, 64)))
    option = alpa_ir.ManualShardingOption(
        mesh_axis_names=("mp",), in_axis_resources=(jax_p(None, "mp"), jax_p("mp", None), jax_p())
    )
    method = alpa_ir.ShardParallel(alpa_ir.LogicalDeviceMesh((4,)), manual_sharding_option=option)
    executable = alpa_ir.parallelize(step, method=method, donate_argnums=()).get_executable(*args)
    text = executable.why_text()
    first = text.splitlines()[1]
    assert first.startswith("  all-reduce of ") and "dot_general -> float32[16, 64]" in first
    assert "test_why_plan.py:" in first


def jax_p(*names: object) -> Any:
    from jax.sharding import PartitionSpec

    return PartitionSpec(*names)
