"""A pipeline schedule as data: the ordered list of tasks of each mesh.

This generalises the clocks of :mod:`alpa_ir.pipeline.schedule` to what
interleaved and zero-bubble schedules need:

- **virtual stages**: a mesh may hold several stages (chunks of layers);
  ``mesh_of[s]`` is the mesh of pipeline stage ``s``, so stage ``s``'s forward
  feeds stage ``s + 1``'s whether or not they share a mesh;
- **a split backward**: with ``split_backward``, a stage's backward is two
  tasks, ``backward`` (B: the gradient the previous stage needs) and
  ``backward_weight`` (W: this stage's weight gradients), and W may run any
  time after its B. Without it, ``backward`` runs both.

Dependencies of a task (:func:`dependencies`): ``forward (s, b)`` after
``forward (s−1, b)``; ``backward (s, b)`` after ``forward (s, b)`` and
``backward (s+1, b)``; ``backward_weight (s, b)`` after ``backward (s, b)``;
``apply_grad (s)`` after every other task of stage ``s``. A mesh runs its list
in order, one task at a time; a task starts when its mesh is free and its
dependencies have ended. :func:`check_task_order` verifies that every task runs
once, on its stage's mesh, with apply-grads last, and that the lists cannot
deadlock (:func:`linear_order` finds an order of all tasks that respects both
the lists and the dependencies, or names the tasks that wait on each other).

Memory: a micro-batch's activations on a stage are held from its forward to
its last backward task (W when split, else B); :func:`peak_stage_in_flight` counts
them along the mesh's list, which is exact, since only the mesh's own tasks
change it.

Pure functions over tuples; the builders of each schedule kind are in
:mod:`alpa_ir.pipeline.schedule_kinds`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from alpa_ir.errors import AlpaError
from alpa_ir.pipeline.schedule import Task


@dataclass(frozen=True)
class TaskOrder:
    """Which mesh runs which task, in which order.

    ``mesh_of[s]``: the mesh of pipeline stage ``s``; ``orders[k]``: the tasks
    mesh ``k`` runs, in order."""

    kind: str
    num_micro_batches: int
    mesh_of: tuple[int, ...]
    split_backward: bool
    orders: tuple[tuple[Task, ...], ...]
    forward_only: bool = False
    """An inference schedule: forward tasks only (no backward, no apply-grad);
    a micro-batch's activations on a stage live only during its forward."""

    @property
    def num_stages(self) -> int:
        return len(self.mesh_of)

    @property
    def num_meshes(self) -> int:
        return len(self.orders)

    @property
    def virtual_stages(self) -> int:
        """Stages per mesh (1: one stage per mesh)."""
        return self.num_stages // max(1, self.num_meshes)

    def stages_of(self, mesh: int) -> tuple[int, ...]:
        return tuple(s for s, k in enumerate(self.mesh_of) if k == mesh)

    def release_phase(self) -> str:
        """The task that frees a micro-batch's activations on a stage."""
        return "backward_weight" if self.split_backward else "backward"


def expected_tasks(order: TaskOrder) -> set[Task]:
    """Every task the schedule must run exactly once."""
    if order.forward_only:
        return {
            Task(s, b, "forward")
            for s in range(order.num_stages)
            for b in range(order.num_micro_batches)
        }
    phases = (
        ("forward", "backward", "backward_weight")
        if order.split_backward
        else (
            "forward",
            "backward",
        )
    )
    tasks = {
        Task(s, b, p)  # type: ignore[arg-type]
        for s in range(order.num_stages)
        for b in range(order.num_micro_batches)
        for p in phases
    }
    return tasks | {Task(s, None, "apply_grad") for s in range(order.num_stages)}


def dependencies(task: Task, order: TaskOrder) -> tuple[Task, ...]:
    """The tasks that must end before ``task`` starts (module docstring)."""
    s, b = task.stage, task.micro_batch
    if task.phase == "forward":
        return (Task(s - 1, b, "forward"),) if s > 0 else ()
    if task.phase == "backward":
        own = (Task(s, b, "forward"),)
        return own + ((Task(s + 1, b, "backward"),) if s + 1 < order.num_stages else ())
    if task.phase == "backward_weight":
        return (Task(s, b, "backward"),)
    phases = ("backward", "backward_weight") if order.split_backward else ("backward",)
    return tuple(
        Task(s, mb, p)  # type: ignore[arg-type]
        for mb in range(order.num_micro_batches)
        for p in phases
    )


def linear_order(order: TaskOrder) -> dict[Task, int]:
    """A position for every task such that each mesh's list and every dependency
    go forward; raise :class:`AlpaError` if the lists deadlock."""
    position = [0] * order.num_meshes
    done: dict[Task, int] = {}
    total = sum(len(o) for o in order.orders)
    while len(done) < total:
        progressed = False
        for k, tasks in enumerate(order.orders):
            while position[k] < len(tasks):
                task = tasks[position[k]]
                if any(d not in done for d in dependencies(task, order)):
                    break
                done[task] = len(done)
                position[k] += 1
                progressed = True
        if not progressed:
            waiting = [
                str(o[position[k]]) for k, o in enumerate(order.orders) if position[k] < len(o)
            ]
            raise AlpaError(
                f"schedule '{order.kind}' deadlocks: the next tasks {waiting} each wait on a "
                "task that a mesh runs later"
            )
    return done


def check_task_order(order: TaskOrder) -> None:
    """Raise :class:`AlpaError` unless ``order`` runs every task once on its stage's
    mesh, apply-grads last on each mesh, without deadlock."""
    if order.num_micro_batches < 1:
        raise AlpaError(f"schedule '{order.kind}' needs at least 1 micro-batch")
    if sorted(set(order.mesh_of)) != list(range(order.num_meshes)):
        raise AlpaError(
            f"schedule '{order.kind}': stages are on meshes {list(order.mesh_of)}, but there are "
            f"{order.num_meshes} meshes"
        )
    seen: dict[Task, int] = {}
    for k, tasks in enumerate(order.orders):
        for task in tasks:
            if task in seen:
                raise AlpaError(f"schedule '{order.kind}' runs {task} twice")
            seen[task] = k
            if not 0 <= task.stage < order.num_stages or order.mesh_of[task.stage] != k:
                raise AlpaError(f"schedule '{order.kind}' runs {task} on mesh {k}, not its stage's")
        tail = [t.phase == "apply_grad" for t in tasks]
        if tail != sorted(tail):
            raise AlpaError(f"schedule '{order.kind}': mesh {k} runs a task after its apply-grad")
    expected = expected_tasks(order)
    if set(seen) != expected:
        missing = sorted(map(str, expected - set(seen)))[:4]
        extra = sorted(map(str, set(seen) - expected))[:4]
        raise AlpaError(f"schedule '{order.kind}' misses {missing}, has extra {extra}")
    linear_order(order)


def peak_stage_in_flight(order: TaskOrder) -> list[int]:
    """Per stage, the most micro-batches in flight at once."""
    release = order.release_phase()
    peaks = [0] * order.num_stages
    for tasks in order.orders:
        counts: dict[int, int] = {}
        for task in tasks:
            if task.phase == "forward":
                counts[task.stage] = counts.get(task.stage, 0) + 1
                peaks[task.stage] = max(peaks[task.stage], counts[task.stage])
                if order.forward_only:  # released when the forward ends
                    counts[task.stage] -= 1
            elif task.phase == release:
                counts[task.stage] -= 1
    return peaks


def peak_mesh_activations(order: TaskOrder, activations: Sequence[float]) -> list[float]:
    """Per mesh, the most activation bytes held at once: ``activations[s]`` is one
    micro-batch's activations on stage ``s``; a mesh holds those of every
    micro-batch in flight on each of its stages."""
    if len(activations) != order.num_stages:
        raise AlpaError(
            f"schedule '{order.kind}': {len(activations)} activation sizes for "
            f"{order.num_stages} stages"
        )
    release = order.release_phase()
    peaks: list[float] = []
    for tasks in order.orders:
        held = peak = 0.0
        for task in tasks:
            if task.phase == "forward":
                held += activations[task.stage]
                peak = max(peak, held)
                if order.forward_only:  # released when the forward ends
                    held -= activations[task.stage]
            elif task.phase == release:
                held -= activations[task.stage]
        peaks.append(peak)
    return peaks


__all__ = [
    "TaskOrder",
    "check_task_order",
    "dependencies",
    "expected_tasks",
    "linear_order",
    "peak_mesh_activations",
    "peak_stage_in_flight",
]
