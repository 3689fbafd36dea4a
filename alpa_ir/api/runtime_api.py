"""``alpa_ir.init`` and ``alpa_ir.shutdown``: choose where steps run.

- ``init(cluster="local")``: the local JAX devices (the ``xla`` backend);
  nothing to start. Without ``init`` at all, steps run there too.
- ``init()`` / ``init(cluster="ray")`` (Alpa's default): as Alpa
  (``ray.init(address="auto")``), join the
  Ray cluster running here (``RAY_ADDRESS``, else the one ``ray start``
  recorded) when one answers, else start a local Ray instance (no
  dashboard) with as many CPU devices as this process's JAX sees; one log
  line (logger ``alpa_ir.runtime.ray_cluster``, INFO) says which.
  Alpa's ``cluster_address=`` is ``address=``.
  ``init(cluster="ray", num_devices=N)`` or ``address="local"`` always start
  a local instance (of N devices); ``address="host:port"`` joins that cluster.
  Modules then run with ``backend="ray"``: one Ray actor per host, a mesh
  may span hosts; so do the methods (``ShardParallel``, ``PipeshardParallel``,
  ...) whose ``backend`` is left ``None``, as after Alpa's
  ``alpa.init(cluster="ray")`` (an explicit ``backend="xla"`` still runs here). An address that does not answer is an
  :class:`~alpa_ir.errors.AlpaError` within ``timeout_s``. With
  ``probe=True`` (a cluster of two hosts or more) the link between hosts
  is measured once (a few seconds) and automatic pipeline stages plan with
  its α/β; otherwise with a default for the hosts' devices.
- ``shutdown()``: leave Ray; a local instance stops with all its processes,
  and methods without a ``backend`` run on the local devices again.

Both are idempotent.
"""

from __future__ import annotations

from typing import Literal

from alpa_ir.errors import AlpaError


def init(
    cluster: Literal["local", "ray"] = "ray",
    cluster_address: str | None = None,
    *,
    address: str | None = None,
    num_devices: int | None = None,
    timeout_s: float = 30.0,
    probe: bool = False,
    num_nodes: int | None = None,
    num_devices_per_node: int | None = None,
) -> None:
    """Prepare the runtime for ``cluster`` (see the module doc). Alpa's
    ``num_nodes=1, num_devices_per_node=N`` is ``num_devices=N``: a local
    instance of N devices (more nodes need a Ray cluster of that many hosts,
    joined without them)."""
    if cluster_address is not None:
        if address is not None:
            raise AlpaError("give address or Alpa's cluster_address, not both")
        address = cluster_address
    if num_nodes is not None or num_devices_per_node is not None:
        num_devices = _one_node_devices(cluster, num_nodes, num_devices_per_node, num_devices)
    if cluster == "local":
        if address is not None:
            raise AlpaError("address is an option of cluster='ray'")
        if probe:
            raise AlpaError("probe is an option of cluster='ray'")
        return
    if cluster != "ray":
        raise AlpaError(f"unknown cluster '{cluster}'; expected 'local' or 'ray'")
    from alpa_ir.runtime.ray_cluster import start_or_join

    start_or_join(address, num_devices, timeout_s)
    if probe:
        from alpa_ir.backends.ray_link_probe import probe_hosts

        probe_hosts()


def _one_node_devices(
    cluster: str, num_nodes: int | None, per_node: int | None, num_devices: int | None
) -> int:
    """The devices of Alpa's ``num_nodes=1, num_devices_per_node=N`` (N), checked."""
    if cluster != "ray":
        raise AlpaError("num_nodes and num_devices_per_node are options of cluster='ray'")
    if num_devices is not None:
        raise AlpaError("give num_devices or num_devices_per_node, not both")
    if num_nodes not in (None, 1):
        raise AlpaError(
            f"num_nodes={num_nodes}: a local Ray instance has one node; start a Ray cluster of "
            "that many hosts (ray start) and call init(cluster='ray') without num_nodes"
        )
    if (
        per_node is None
        or isinstance(per_node, bool)
        or not isinstance(per_node, int)
        or per_node < 1
    ):
        raise AlpaError(
            f"num_devices_per_node must be a positive integer with num_nodes, got {per_node!r}"
        )
    return per_node


def shutdown() -> None:
    """Leave the Ray instance, if any (a local one stops); idempotent."""
    import sys

    if "ray" not in sys.modules:
        return
    from alpa_ir.runtime.ray_cluster import stop

    stop()


def session_backend(backend: str | None) -> Literal["xla", "ray"]:
    """The backend a method runs on: ``backend`` if given, else ``ray`` while
    this process is connected to Ray (after ``init(cluster="ray")``), else
    ``xla``. The state is Ray's own (``ray.is_initialized()``)."""
    if backend is not None:
        return backend  # type: ignore[return-value]
    import sys

    ray = sys.modules.get("ray")
    return "ray" if ray is not None and ray.is_initialized() else "xla"
