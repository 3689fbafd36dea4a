"""``alpa-demo``: the main job. Trains the tiny GPT of the model zoo on the 8
local CPU devices with ``PipeshardParallel``: automatic layers
(``cluster-operators``), two pipeline stages on two submeshes of 4 devices,
each a (2, 2) logical mesh: the batch split over the first axis (data
parallel), each stage auto-sharded by the ILP, which shards weights over the
second (tensor parallel), 1F1B over 2 micro-batches. Prints the plan (stages,
meshes, shardings) and the loss, and checks it against one device.

Runs on any machine: it asks XLA for ``--devices`` host CPU devices before JAX
starts (``--xla_force_host_platform_device_count`` in ``XLA_FLAGS``, replacing
a count already there; ``JAX_PLATFORMS=cpu`` unless set). Called in a process
where JAX already runs, the device count cannot change any more: then
``--devices`` must be the count JAX has.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

from alpa_ir.tools.cli_args import OneLineParser, positive_int

TINY_MODELS = ("mlp-tiny", "gpt-tiny", "moe-tiny", "wresnet-tiny", "bert-tiny")
"""The zoo models small enough to train on CPU (the paper sizes are not)."""
MAX_DEVICES = 1024
"""The most host CPU devices asked of XLA (the tiny models' batch is 8 samples)."""
_DEVICE_COUNT = re.compile(r"--xla_force_host_platform_device_count(=\S*)?")


def _build_parser() -> OneLineParser:
    parser = OneLineParser(prog="alpa-demo", description=__doc__)
    parser.add_argument("--model", default="gpt-tiny", choices=TINY_MODELS, help="zoo model")
    parser.add_argument("--steps", type=positive_int, default=5, help="training steps")
    parser.add_argument(
        "--devices",
        type=positive_int,
        default=8,
        help=f"devices of the plan (at most {MAX_DEVICES}; a multiple of --stages): local CPU "
        "devices, or with --address the cluster's",
    )
    parser.add_argument(
        "--stages", type=positive_int, default=2, help="pipeline stages (dividing --devices)"
    )
    parser.add_argument(
        "--micro-batches",
        type=positive_int,
        default=2,
        help="micro-batches per step (dividing the model's batch of 8)",
    )
    parser.add_argument(
        "--pictures",
        metavar="DIR",
        help="draw the plan into DIR: timeline, memory, devices, shardings (PNG)",
    )
    parser.add_argument(
        "--cluster",
        choices=("local", "ray"),
        default="local",
        help="local: the stages run in this process; ray: one Ray actor per host of a Ray "
        "cluster, --hosts nodes started on this machine or the cluster at --address",
    )
    parser.add_argument(
        "--hosts",
        type=positive_int,
        default=1,
        help="with --cluster ray: Ray nodes, each holding --devices / --hosts devices",
    )
    parser.add_argument(
        "--address",
        metavar="HOST:PORT",
        help="with --cluster ray: join the running Ray cluster there (e.g. GPU nodes started "
        "with 'ray start'), whose hosts hold the stage meshes, instead of starting one",
    )
    parser.add_argument(
        "--no-check",
        action="store_true",
        help="skip training the same steps on one device to compare the loss",
    )
    return parser


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = _build_parser()
    args = parser.parse_args(argv)
    if args.devices > MAX_DEVICES:
        parser.error(f"--devices must be at most {MAX_DEVICES}, got {args.devices}")
    if args.stages > args.devices or args.devices % args.stages:
        parser.error(
            f"--stages {args.stages} cannot split --devices {args.devices} evenly "
            f"(each stage gets the same number of devices)"
        )
    if args.hosts > 1 and args.cluster != "ray":
        parser.error("--hosts needs --cluster ray")
    if args.address is not None and args.cluster != "ray":
        parser.error("--address needs --cluster ray")
    if args.address is not None and args.hosts > 1:
        parser.error("--hosts starts a cluster on this machine; --address joins one (not both)")
    if args.devices % args.hosts or args.hosts > args.stages:
        parser.error(
            f"--hosts {args.hosts} must divide --devices {args.devices} and be at most "
            f"--stages {args.stages} (a stage's mesh lives on one host)"
        )
    from alpa_ir.models.registry import get_config  # jax loads, its devices do not start

    batch = int(get_config(args.model).batch_size)
    if args.micro_batches > batch or batch % args.micro_batches:
        parser.error(
            f"--micro-batches {args.micro_batches} does not divide the batch of {args.model} "
            f"({batch} samples)"
        )
    return args


def with_device_count(flags: str, devices: int) -> str:
    """``XLA_FLAGS`` with the host device count set to ``devices`` (other flags kept)."""
    rest = _DEVICE_COUNT.sub("", flags).split()
    return " ".join([*rest, f"--xla_force_host_platform_device_count={devices}"])


def _jax_started() -> bool:
    """Whether JAX has started its devices (then XLA_FLAGS no longer counts)."""
    if "jax" not in sys.modules:
        return False
    try:
        from jax._src import xla_bridge
    except ImportError:  # pragma: no cover - a JAX without it: assume started
        return True
    started = getattr(xla_bridge, "backends_are_initialized", None)
    return bool(started()) if callable(started) else True


def _use_devices(devices: int) -> str:
    """Ask for ``devices`` host devices before JAX starts; '' or why it cannot."""
    if _jax_started():
        import jax

        have = jax.device_count()
        if have != devices:
            return (
                f"--devices {devices} cannot take effect: JAX already runs in this process "
                f"with {have} {jax.default_backend()} devices (run alpa-demo in a new process)"
            )
        return ""
    os.environ["XLA_FLAGS"] = with_device_count(os.environ.get("XLA_FLAGS", ""), devices)
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax

    try:
        have = jax.device_count()
    except Exception as err:  # a platform that is not here (an AssertionError on JAX 0.10)
        return (
            f"JAX found no devices of JAX_PLATFORMS={os.environ['JAX_PLATFORMS']!r} "
            f"({type(err).__name__}{': ' + str(err) if str(err) else ''})"
        )
    if have != devices:
        return (
            f"--devices {devices}: JAX started with {have} {jax.default_backend()} devices "
            f"(JAX_PLATFORMS={os.environ.get('JAX_PLATFORMS', '')!r}; the host device count "
            "applies to the cpu platform only)"
        )
    return ""


def stage_mesh_shape(devices: int) -> tuple[int, int]:
    """Each stage's logical mesh: ``(2, devices / 2)`` when it splits (a
    data-parallel axis of 2 and a tensor-parallel axis), else ``(1, devices)``."""
    return (2, devices // 2) if devices >= 4 and devices % 2 == 0 else (1, devices)


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    problem = ""
    if args.address is None:
        problem = _use_devices(args.devices)
    else:  # this process plans and checks; the cluster's devices (GPUs: keep off them) run
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
    if problem:
        print(f"alpa-demo: error: {problem}", file=sys.stderr)
        return 2
    import jax

    import alpa_ir
    from alpa_ir.api.pipeshard import AutoLayerOption, PipeshardParallel, UniformStageOption
    from alpa_ir.api.sharding_options import AutoShardingOption
    from alpa_ir.errors import AlpaError
    from alpa_ir.models import make_train_step

    stack = contextlib.ExitStack()
    try:
        step, (state, batch) = make_train_step(args.model)
        shape = stage_mesh_shape(args.devices // args.stages)
        method = PipeshardParallel(
            num_micro_batches=args.micro_batches,
            layer_option=AutoLayerOption(layer_num=args.stages),
            stage_option=UniformStageOption(num_stages=args.stages, submesh_logical_shape=shape),
            # data parallel over the first mesh axis; the ILP shards weights over the second
            auto_sharding_option=AutoShardingOption(
                force_batch_dim_to_mesh_dim=0 if shape[0] > 1 else None,
                reduce_scatter="none",
            ),
        )
        if args.cluster == "ray":
            method = replace(method, backend="ray")
            stack.enter_context(_ray_cluster(args))
        parallel = alpa_ir.parallelize(step, method=method)
        start = time.perf_counter()
        try:
            executable = parallel.get_executable(state, batch)
        except AlpaError as err:
            if "layers requested" in str(err):  # more stages than the model can be cut into
                raise AlpaError(f"--stages {args.stages} for {args.model}: {err}") from err
            raise
        stack.callback(executable.close)
        print(f"model {args.model}: compiled in {time.perf_counter() - start:.1f} s")
        print(executable.plan_text())
        if args.cluster == "ray":
            print(_stage_hosts(executable))
        print(executable.why_text())
        if args.pictures:
            _draw(executable, args.pictures)
        reference = None if args.no_check else jax.jit(step)
        expected = state if reference is not None else None
        state = jax.tree.map(lambda x: x.copy() if isinstance(x, jax.Array) else x, state)
        for k in range(args.steps):
            start = time.perf_counter()
            state, loss = parallel(state, batch)
            print(f"step {k}: loss {float(loss):.4f} ({time.perf_counter() - start:.2f} s)")
            if reference is not None:
                expected, want = reference(expected, batch)
        if reference is not None:
            gap = abs(float(loss) - float(want))
            verdict = "equal" if gap <= 1e-4 * max(1.0, abs(float(want))) else "DIFFERENT"
            print(f"one device after {args.steps} steps: loss {float(want):.4f} ({verdict})")
            if verdict != "equal":
                return 1
    except AlpaError as err:
        print(f"alpa-demo: error: {err}", file=sys.stderr)
        return 1
    finally:
        stack.close()
    return 0


@contextlib.contextmanager
def _ray_cluster(args: argparse.Namespace) -> Iterator[None]:
    """The Ray cluster of ``--address``, joined, or ``--hosts`` nodes started here."""
    from alpa_ir.runtime.ray_cluster import cluster_hosts, local_cluster

    if args.address is None:
        per_host = args.devices // args.hosts
        with local_cluster(args.hosts, per_host):
            print(f"ray: {args.hosts} hosts of {per_host} devices on this machine")
            yield
        return
    import alpa_ir

    alpa_ir.init(cluster="ray", address=args.address)
    try:
        hosts = cluster_hosts()
        held = ", ".join(f"{h.name}: {h.num_devices} {h.resource}" for h in hosts)
        print(f"ray: the cluster at {args.address} ({held})")
        yield
    finally:
        alpa_ir.shutdown()


def _stage_hosts(executable: Any) -> str:
    """The Ray hosts that run each stage's mesh."""
    hosts = executable.remote.mesh_hosts()
    lines = []
    meshes = executable.stage_mesh_names()
    for k, (placement, mesh) in enumerate(zip(executable.placements, meshes, strict=True)):
        where = " and ".join(hosts[mesh])
        lines.append(f"  stage {k}: mesh @{mesh} {list(placement.mesh.shape)} on {where}")
    return "hosts:\n" + "\n".join(lines)


def _draw(executable: object, folder: str) -> None:
    from pathlib import Path

    from alpa_ir.plots.views import KINDS

    where = Path(folder)
    try:
        where.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        from alpa_ir.errors import AlpaError

        raise AlpaError(f"--pictures {folder}: {exc.strerror}") from None
    paths = [executable.plot(kind, where / f"{kind}.png").path for kind in KINDS]  # type: ignore[attr-defined]
    print("pictures: " + ", ".join(str(p) for p in paths))


if __name__ == "__main__":
    sys.exit(main())
