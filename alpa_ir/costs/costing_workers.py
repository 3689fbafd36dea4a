"""Stage-mesh pairs costed in worker processes (``construct-stages``' cost
table, ``workers > 1``).

A cost table prices a few distinct functions (the layer ranges; identical
ones once) on many logical meshes, each pair independently: an ILP per pair
for the analytical model. The pairs are spread over ``workers`` processes:

* every worker is a fresh interpreter (``spawn``: no state of the parent,
  whose JAX runtime is multithreaded and must not be forked), started with
  the cluster, a fresh copy of the stage cost model
  (:class:`~alpa_ir.costs.stage_cost.ParallelStageCostModel`) and the functions as
  IR text, which it parses once;
* work goes out in *tasks*, one per logical mesh: all functions on that mesh,
  so that a worker plans every function of one mesh with the same
  strategies (the analytical model keeps them per mesh,
  :class:`alpa_ir.autosharding.graph.StrategyCache`); a worker that finishes
  a task gets the next one, largest meshes first;
* a failing pair raises its error, with the worker's message, in the parent;
  a worker that dies is named.

The results are the same as costing in the parent, pair by pair.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from xdsl.dialects import func
from xdsl.dialects.builtin import ModuleOp

from alpa_ir.costs.stage_cost import ParallelStageCostModel, StageCost
from alpa_ir.errors import AlpaError
from alpa_ir.hardware.clusters import Cluster
from alpa_ir.hardware.device_mesh import LogicalDeviceMesh


@dataclass(frozen=True)
class CostJob:
    """One pair: function ``function`` (an index into the functions given to
    :func:`cost_in_workers`) on ``mesh``."""

    function: int
    mesh: LogicalDeviceMesh
    param_args: tuple[int, ...]


def function_text(function: func.FuncOp) -> str:
    """``function`` as the IR text of a module of its own."""
    return str(ModuleOp([function.clone()]))


def cost_in_workers(
    functions: Sequence[func.FuncOp],
    tasks: Sequence[Sequence[CostJob]],
    cluster: Cluster,
    model: ParallelStageCostModel,
    workers: int,
    on_done: Callable[[int], None] | None = None,
) -> list[list[StageCost]]:
    """The :meth:`~ParallelStageCostModel.keyed_cost` of every job of every
    task (in task order), computed by ``workers`` processes; ``on_done(n)``
    after each task with the number of jobs done so far."""
    copy = model.worker_copy
    texts = [function_text(f) for f in functions]
    ctx = multiprocessing.get_context("spawn")
    results: list[list[StageCost] | None] = [None] * len(tasks)
    pending = list(range(len(tasks)))
    pending.reverse()  # pop() takes the tasks in the order given
    processes = []
    connections: list[multiprocessing.connection.Connection] = []
    busy: dict[multiprocessing.connection.Connection, int] = {}
    done_jobs = 0
    try:
        for k in range(min(workers, len(tasks))):
            parent_end, child_end = ctx.Pipe()
            process = ctx.Process(
                target=_worker_main,
                args=(child_end, copy(), cluster, texts),
                name=f"alpa-costing-{k}",
                daemon=True,
            )
            process.start()
            child_end.close()
            processes.append(process)
            connections.append(parent_end)
        for conn in connections:
            _send_next(conn, tasks, pending, busy)
        while busy:
            for conn in multiprocessing.connection.wait(list(busy)):
                assert isinstance(conn, multiprocessing.connection.Connection)
                index = busy.pop(conn)
                try:
                    kind, payload = conn.recv()
                except EOFError:
                    worker = processes[connections.index(conn)]
                    worker.join(timeout=5)
                    raise AlpaError(
                        f"costing worker {worker.name} died (exit code {worker.exitcode}) "
                        f"while costing {len(tasks[index])} pairs on mesh "
                        f"{list(tasks[index][0].mesh.shape)}"
                    ) from None
                if kind == "error":
                    raise AlpaError(payload)
                results[index] = payload
                done_jobs += len(tasks[index])
                if on_done is not None:
                    on_done(done_jobs)
                _send_next(conn, tasks, pending, busy)
    finally:
        for conn in connections:
            try:
                conn.send(None)
            except (BrokenPipeError, OSError):
                pass
            conn.close()
        for process in processes:
            process.join(timeout=5)
            if process.is_alive():
                process.terminate()
                process.join()
    return [r for r in results if r is not None]


def _send_next(
    conn: multiprocessing.connection.Connection,
    tasks: Sequence[Sequence[CostJob]],
    pending: list[int],
    busy: dict[multiprocessing.connection.Connection, int],
) -> None:
    if pending:
        index = pending.pop()
        conn.send(list(tasks[index]))
        busy[conn] = index


def _worker_main(
    conn: multiprocessing.connection.Connection,
    model: Any,
    cluster: Cluster,
    texts: Sequence[str],
) -> None:
    """A worker's loop: parse the functions, then cost each task it receives
    until it receives ``None``."""
    from alpa_ir.ir.module_utils import main_function
    from alpa_ir.ir.text import parse_module

    try:
        functions = [main_function(parse_module(text)) for text in texts]
    except Exception as error:  # the parent reports it; nothing is costed
        conn.send(("error", f"costing worker: cannot read a function: {error}"))
        return
    while True:
        try:
            task = conn.recv()
        except EOFError:
            return
        if task is None:
            return
        try:
            costs = [
                model.keyed_cost(functions[job.function], job.mesh, cluster, job.param_args)
                for job in task
            ]
        except AlpaError as error:
            conn.send(("error", str(error)))
            continue
        except Exception:
            conn.send(("error", "costing worker failed:\n" + traceback.format_exc()))
            continue
        conn.send(("ok", costs))


__all__ = ["CostJob", "cost_in_workers", "function_text"]
