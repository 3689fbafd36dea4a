"""Start, join and leave the Ray instance that the ``ray`` backend runs on.

Devices are a Ray resource, so that Ray's scheduler puts each mesh worker
where its devices are and the driver can tell, before placing anything,
whether a plan fits:

- GPU nodes offer ``GPU`` (XLA's collectives between them run on NCCL);
- CPU workers use the custom resource ``alpa_cpu_device``: a local instance
  started by :func:`start_or_join` offers ``num_devices`` of them (default:
  as many as the driver's JAX sees); nodes of a real cluster declare theirs
  with ``ray start --resources='{"alpa_cpu_device": N}'``, and a cluster that
  declares none offers its CPUs.

All state is Ray's own (``ray.is_initialized()``): nothing is kept here.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from alpa_ir.errors import AlpaError

CPU_DEVICE_RESOURCE = "alpa_cpu_device"
LOG = logging.getLogger(__name__)
DEFAULT_TIMEOUT_S = 30.0


def _ray() -> Any:
    try:
        import ray
    except ImportError as err:  # pragma: no cover - ray is a dependency
        raise AlpaError("the ray backend needs the 'ray' package (pip install ray)") from err
    return ray


def _one_line(err: BaseException) -> str:
    """The first line of the error, and of its root cause when that differs."""
    lines = []
    cause: BaseException | None = err
    while cause is not None:
        text = str(cause).strip()
        lines.append(text.splitlines()[0] if text else type(cause).__name__)
        cause = cause.__cause__
    return lines[0] if len(lines) == 1 else f"{lines[0]} ({lines[-1]})"


def _probe(address: str, timeout_s: float) -> None:
    """Fail fast when nothing listens at ``host:port`` (Ray itself retries for minutes)."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise AlpaError(f"Ray address '{address}' is not host:port")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError as err:
        reason = "timed out" if isinstance(err, TimeoutError) else (err.strerror or str(err))
        raise AlpaError(f"no Ray cluster answers at {address} ({reason})") from err


def start_or_join(
    address: str | None = None,
    num_devices: int | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> None:
    """Join the Ray cluster at ``address`` (``host:port``, ``auto``,
    ``ray://...``); with ``address=None``, as Alpa's ``ray.init(address="auto")``,
    the cluster running here (``RAY_ADDRESS``, else the one ``ray start``
    recorded) when one answers, else a local instance started for this
    process. ``address="local"`` or a given ``num_devices`` always starts a
    local instance (of ``num_devices`` devices, default as many as the
    driver's JAX sees). Which one it was is logged in one line. A no-op when
    this process is already connected."""
    ray = _ray()
    if ray.is_initialized():
        current = _connected_address(ray)
        if address not in (None, "auto", "local") and current is not None and address != current:
            raise AlpaError(
                f"already connected to the Ray cluster at {current}; call alpa_ir.shutdown() "
                f"before joining {address}"
            )
        return
    if address is None and num_devices is None:
        address = running_cluster_address()
        if address is None:
            LOG.info("no Ray cluster is running here: starting a local Ray instance")
        else:
            LOG.info("joining the running Ray cluster at %s", address)
    kwargs: dict[str, Any] = {
        "include_dashboard": False,
        "log_to_driver": False,
        "configure_logging": False,
    }
    if address in (None, "local"):
        if num_devices is None:
            import jax

            num_devices = len(jax.devices())
        if num_devices < 1:
            raise AlpaError(f"num_devices must be at least 1, got {num_devices}")
        kwargs |= {"address": "local", "resources": {CPU_DEVICE_RESOURCE: num_devices}}
        try:
            ray.init(**kwargs)
        except Exception as err:
            raise AlpaError(f"could not start a local Ray instance: {_one_line(err)}") from err
        return
    else:
        if num_devices is not None:
            raise AlpaError(
                "num_devices applies to a local Ray instance; a cluster declares its own"
            )
        if address != "auto" and not address.startswith("ray://"):
            _probe(address, timeout_s)
        kwargs["address"] = address
    _init_within(ray, kwargs, timeout_s, address)


def running_cluster_address() -> str | None:
    """The address of the Ray cluster that ``ray.init()`` would join (as Ray
    finds it: ``RAY_ADDRESS``, else the cluster the last ``ray start`` on this
    machine recorded), when it answers; None when there is none (or
    ``RAY_ADDRESS=local``)."""
    from ray._private import services

    try:
        address = services.canonicalize_bootstrap_address(None)
    except Exception:  # a malformed RAY_ADDRESS: ray.init names it
        return os.environ.get("RAY_ADDRESS") or None
    if address is None:
        return None
    try:
        _probe(address, 2.0)
    except AlpaError:  # a stale record of a cluster that has stopped
        return None
    return address


def _connected_address(ray: Any) -> str | None:
    """The GCS address of the cluster this process is connected to, if known."""
    try:
        return str(ray.get_runtime_context().gcs_address)
    except Exception:  # an old Ray or a client connection: unknown
        return None


def _init_within(ray: Any, kwargs: dict[str, Any], timeout_s: float, where: str) -> None:
    """``ray.init`` that gives up after ``timeout_s`` (it can otherwise wait for
    minutes on an address that accepts connections but is no Ray cluster)."""
    outcome: list[BaseException | None] = []

    def target() -> None:
        try:
            ray.init(**kwargs)
            outcome.append(None)
        except BaseException as err:
            outcome.append(err)

    thread = threading.Thread(target=target, name="alpa-ray-init", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if not outcome:
        raise AlpaError(f"could not connect to {where} within {timeout_s:.0f} s")
    err = outcome[0]
    if err is not None:
        raise AlpaError(join_error(err, where)) from err


def join_error(err: BaseException, where: str) -> str:
    """Why joining the cluster at ``where`` failed, in one line; a cluster that
    asks for its token (Ray's token authentication, the default of ``ray
    start``) says how to give it: Ray never sends one to an explicit address
    unless ``RAY_AUTH_MODE=token``."""
    text = "\n".join(str(e) for e in _chain(err))
    mode = os.environ.get("RAY_AUTH_MODE", "unset")
    if "no authentication token was found" in text:
        return (
            f"RAY_AUTH_MODE is {mode} but this process has no token for the Ray cluster at "
            f"{where}: put the cluster's token in ~/.ray/auth_token or RAY_AUTH_TOKEN (for a "
            "cluster without token authentication, unset RAY_AUTH_MODE)"
        )
    if "InvalidAuthToken" in text or "AuthenticationError" in text:
        return (
            f"the Ray cluster at {where} asks for its authentication token (RAY_AUTH_MODE is "
            f"{mode}): set RAY_AUTH_MODE=token, with the cluster's token in ~/.ray/auth_token "
            "or RAY_AUTH_TOKEN, as on its nodes"
        )
    return f"could not join the Ray cluster at {where}: {_one_line(err)}"


def _chain(err: BaseException) -> Iterator[BaseException]:
    cause: BaseException | None = err
    while cause is not None:
        yield cause
        cause = cause.__cause__ or cause.__context__


def stop() -> None:
    """Disconnect; a local instance this process started is shut down with all
    its processes. Idempotent."""
    try:
        import ray
    except ImportError:  # pragma: no cover
        return
    if ray.is_initialized():
        ray.shutdown()


def require_ray() -> Any:
    """The ``ray`` module, connected; a clear error otherwise."""
    ray = _ray()
    if not ray.is_initialized():
        raise AlpaError(
            "the ray backend needs a Ray instance: call alpa_ir.init(cluster='ray') first"
        )
    return ray


@contextlib.contextmanager
def local_cluster(hosts: int, devices_per_host: int) -> Iterator[None]:
    """A Ray cluster of ``hosts`` nodes on this machine (``ray.cluster_utils``,
    every node on 127.0.0.1), each declaring ``devices_per_host`` CPU devices;
    joined for the block, then torn down with all its processes."""
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    from ray.cluster_utils import Cluster

    resources = {CPU_DEVICE_RESOURCE: devices_per_host}
    previous = address_record()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "resources": resources})
    unadvertise(cluster.address, previous)
    try:
        for _ in range(hosts - 1):
            cluster.add_node(num_cpus=1, resources=resources)
        start_or_join(cluster.address)
        yield
    finally:
        stop()
        cluster.shutdown()


def address_record() -> str | None:
    """The cluster address ``ray start`` recorded on this machine, if any."""
    from ray._private import utils

    return utils.read_ray_address()


def unadvertise(address: str, previous: str | None) -> None:
    """Undo what ``ray.cluster_utils.Cluster`` does for Ray's own unit tests:
    recording its head as the cluster ``ray.init()`` joins on this machine.
    A cluster of ours is joined by its address; left recorded, every
    ``init(cluster="ray")`` here (another test, another user) would join it.
    The record ``previous`` to it comes back."""
    from ray._private import utils

    path = utils.get_ray_address_file(None)
    with contextlib.suppress(OSError):
        if address_record() != address:
            return
        if previous is None:
            os.remove(path)
        else:
            with open(path, "w") as f:
                f.write(previous)


@dataclass(frozen=True)
class Host:
    """A Ray node that offers devices."""

    name: str
    node_id: str
    address: str
    resource: str
    num_devices: int


def cluster_hosts() -> list[Host]:
    """The alive Ray nodes that offer devices, by address (then node id)."""
    ray = require_ray()
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    found = []  # (address, node id, resource, devices)
    # a cluster that declares no devices offers its CPUs, one device each
    for kinds in ((CPU_DEVICE_RESOURCE, "GPU"), ("CPU",)):
        for node in nodes:
            resources = node.get("Resources", {})
            for resource in kinds:
                count = int(resources.get(resource, 0))
                if count:
                    address = node.get("NodeManagerAddress", "?")
                    found.append((address, node["NodeID"], resource, count))
                    break
        if found:
            break
    return [
        Host(f"host{k} ({address})", node_id, address, resource, count)
        for k, (address, node_id, resource, count) in enumerate(sorted(found))
    ]


def backend_devices(backend: str) -> int | None:
    """How many devices a step of ``backend`` may use, when they are not this
    process's: on ``ray``, the connected cluster's hosts' (a driver plans for
    devices it does not hold); None for the local backends."""
    if backend != "ray":
        return None
    return sum(h.num_devices for h in cluster_hosts())


@dataclass(frozen=True)
class HostLink:
    """The link between two hosts: bytes/s one way and seconds per message."""

    bandwidth: float
    latency: float
    probed: bool
    """Measured by :func:`alpa_ir.runtime.link_probe.probe_hosts`, else a default."""


DEFAULT_LINKS = {
    CPU_DEVICE_RESOURCE: HostLink(0.8e9, 1e-4, False),
    "CPU": HostLink(0.8e9, 1e-4, False),
    "GPU": HostLink(25e9, 5e-6, False),
}
"""Without a probe: CPU hosts as measured between two local Ray nodes with
gloo (about 0.8 GB/s), GPU hosts as a 200 Gb/s InfiniBand link."""
_LINK_KEY = b"alpa_ir/host_link"


def record_link(link: HostLink) -> None:
    """Keep the probed link in the connected cluster's key-value store (Ray's
    own state, which Ray's libraries use the same way; nothing kept here)."""
    from ray.experimental import internal_kv

    require_ray()
    internal_kv._internal_kv_put(
        _LINK_KEY, f"{link.bandwidth} {link.latency}".encode(), overwrite=True
    )


def host_link(resource: str) -> HostLink:
    """The probed link of the connected cluster, else the default for its devices."""
    from ray.experimental import internal_kv

    require_ray()
    value = internal_kv._internal_kv_get(_LINK_KEY)
    if value:
        bandwidth, latency = (float(x) for x in value.decode().split())
        return HostLink(bandwidth, latency, True)
    return DEFAULT_LINKS.get(resource, DEFAULT_LINKS["CPU"])


def _session_key(name: str) -> bytes:
    """``name``'s key in the cluster's key-value store for this driver's job:
    another driver of the same cluster, or this process after ``shutdown()``
    and ``init()`` again (a new job), does not see it."""
    ray = require_ray()
    return f"alpa_ir/session/{ray.get_runtime_context().get_job_id()}/{name}".encode()


def session_put(name: str, value: str) -> None:
    """Keep ``value`` for this driver's Ray session (Ray's key-value store,
    as :func:`record_link`; nothing kept in this process): it lasts until
    ``shutdown()``."""
    from ray.experimental import internal_kv

    internal_kv._internal_kv_put(_session_key(name), value.encode(), overwrite=True)


def session_get(name: str) -> str | None:
    """What :func:`session_put` kept under ``name`` in this driver's Ray
    session; None when nothing was, or when this process is not connected."""
    import sys

    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return None
    from ray.experimental import internal_kv

    value = internal_kv._internal_kv_get(_session_key(name))
    return value.decode() if value else None
