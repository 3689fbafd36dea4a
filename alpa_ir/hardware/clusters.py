"""Cluster descriptions for planning: a P²-style hierarchy of levels, device
capabilities, presets, Alpa's submesh space and the logical mesh views of a
submesh with α/β per axis derived from the hardware.

A :class:`Cluster` mirrors the ``mesh.cluster`` op (``alpa_ir.dialects.mesh``):
levels outermost first, each with a cardinality, the bandwidth (bytes/s, one
direction) and latency (s) of the interconnect that joins the units of that
level, and ``shared`` when one link per unit of that level serves every device
below it (a node's NIC); an unshared level gives every device its own link of
that bandwidth (NVLink, NVSwitch ports, one InfiniBand HCA per GPU). Devices are
numbered in mixed radix, level 0 the most significant digit, so the devices of
one node are consecutive ids (as in ``alpa_ir.p2.system``).

Besides the op's fields a cluster records ``hbm_bandwidth`` (bytes/s of device
memory, the memory-traffic term of the stage cost model); on the op it is the
discardable attribute ``mesh.hbm_bandwidth`` (0 = unknown: no memory term).

Alpa's submesh space (§5.2): with ``N`` nodes of ``M`` devices (the innermost
level is the node's devices, every outer level multiplies the node count),
the submeshes are ``(1, 2^m)`` for ``2^m <= M`` and ``(n, M)`` for
``1 <= n <= N``; ``M`` must then be a power of two. The logical meshes of a
submesh are all its row-major 2-d reshapes ``(dp, mp)``, ``dp·mp = n·m``.

α/β of a mesh axis: the axis joins devices that first differ at some
level(s); the outermost such level is its bottleneck and gives α (latency) and
β = 1/bandwidth. On a shared level β is multiplied by the number of the axis's
groups that cross one unit's link at once (e.g. the 8 GPUs of a node each in a
different data-parallel group share the node's NIC: β × 8).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np
from xdsl.dialects.builtin import ArrayAttr, FloatAttr, ModuleOp, StringAttr, f64

from alpa_ir.dialects.mesh import ClusterOp, LevelAttr
from alpa_ir.errors import AlpaError
from alpa_ir.hardware.builtin_profiles import a100_sxm4_dgx, h100_sxm5_dgx, v100_sxm2_aws
from alpa_ir.hardware.device_mesh import LogicalDeviceMesh
from alpa_ir.hardware.device_profile import DeviceProfile
from alpa_ir.hardware.memory_budget import MemoryBudget, local_device_budget
from alpa_ir.ir.module_utils import top_level_ops

HBM_BANDWIDTH_ATTR = "mesh.hbm_bandwidth"
"""Discardable attribute of ``mesh.cluster``: device memory bandwidth in bytes/s."""
DEVICE_PROFILE_ATTR = "mesh.device_profile"
"""Discardable attribute of ``mesh.cluster``: the device profile (JSON) its
prices come from (:mod:`alpa_ir.hardware.device_profile`)."""
MEMORY_SOURCE_ATTR = "mesh.memory_source"
"""Discardable attribute of ``mesh.cluster``: where ``device_memory`` comes from
(e.g. the shared host memory of the local CPU devices, or a figure given by hand)."""

GB = 1e9
GiB = 1024**3


@dataclass(frozen=True)
class ClusterLevel:
    """One level of the hierarchy (see the module docstring); matches ``#mesh.level``."""

    name: str
    cardinality: int
    bandwidth: float
    latency: float
    shared: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.cardinality, bool) or not isinstance(self.cardinality, int):
            raise AlpaError(f"cluster level '{self.name}': cardinality must be an int")
        if self.cardinality < 1:
            raise AlpaError(
                f"cluster level '{self.name}': cardinality must be >= 1, got {self.cardinality}"
            )
        if not (math.isfinite(self.bandwidth) and self.bandwidth > 0):
            raise AlpaError(
                f"cluster level '{self.name}': bandwidth must be a positive number of bytes/s, "
                f"got {self.bandwidth}"
            )
        if not (math.isfinite(self.latency) and self.latency >= 0):
            raise AlpaError(
                f"cluster level '{self.name}': latency must be >= 0 seconds, got {self.latency}"
            )


@dataclass(frozen=True)
class Cluster:
    """A cluster: hierarchy levels (outermost first) and each device's capabilities.

    ``device_memory`` in bytes, ``peak_flops`` in FLOP/s (the dense half-precision
    tensor-core peak for GPUs), ``hbm_bandwidth`` in bytes/s (0 = unknown);
    ``memory_source`` says where ``device_memory`` comes from (empty: the
    preset's datasheet figure), for messages about plans that do not fit.
    ``profile``: the measured prices (:mod:`alpa_ir.hardware.device_profile`)
    of its devices and links; None: nominal prices from ``peak_flops`` and
    ``hbm_bandwidth`` (the stage cost options' efficiencies).
    """

    name: str
    levels: tuple[ClusterLevel, ...]
    device_memory: float
    peak_flops: float
    hbm_bandwidth: float = 0.0
    device_name: str = ""
    memory_source: str = ""
    profile: DeviceProfile | None = None
    _strides: tuple[int, ...] = field(default=(), init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        levels = tuple(self.levels)
        object.__setattr__(self, "levels", levels)
        if not levels:
            raise AlpaError(f"cluster '{self.name}': needs at least one level")
        names = [lv.name for lv in levels]
        if len(set(names)) != len(names):
            raise AlpaError(f"cluster '{self.name}': level names repeat: {names}")
        for what, value in (("device_memory", self.device_memory), ("peak_flops", self.peak_flops)):
            if not (math.isfinite(value) and value > 0):
                raise AlpaError(f"cluster '{self.name}': {what} must be positive, got {value}")
        if not (math.isfinite(self.hbm_bandwidth) and self.hbm_bandwidth >= 0):
            raise AlpaError(
                f"cluster '{self.name}': hbm_bandwidth must be >= 0 bytes/s, "
                f"got {self.hbm_bandwidth}"
            )
        cards = [lv.cardinality for lv in levels]
        strides = tuple(math.prod(cards[j + 1 :]) for j in range(len(cards)))
        object.__setattr__(self, "_strides", strides)

    # -- shape ----------------------------------------------------------------

    @property
    def num_devices(self) -> int:
        return math.prod(lv.cardinality for lv in self.levels)

    @property
    def devices_per_node(self) -> int:
        """``M``: the cardinality of the innermost level (the devices of one node)."""
        return self.levels[-1].cardinality

    def with_profile(self, profile: DeviceProfile) -> Cluster:
        """This cluster priced by ``profile``: each level's link at the bus
        bandwidth and latency the profile measured for it (all-reduce); a level
        the profile does not name keeps its line rate scaled as the nearest
        inner level the profile names (the share of a NIC's line rate NCCL
        reaches holds on every switching tier above it)."""
        levels: list[ClusterLevel] = []
        share = 1.0
        for lv in reversed(self.levels):
            fit = profile.collective("all-reduce", lv.name, lv.cardinality)
            if fit is not None and fit.level == lv.name:
                share = fit.bus_bandwidth / lv.bandwidth
                levels.append(replace(lv, bandwidth=fit.bus_bandwidth, latency=fit.latency))
            else:
                levels.append(replace(lv, bandwidth=lv.bandwidth * share))
        return replace(self, levels=tuple(reversed(levels)), profile=profile)

    def one_node(self, num_devices: int) -> Cluster:
        """One node of ``num_devices`` of this cluster's devices, linked as the
        devices of one of its nodes are (its innermost level)."""
        inner = self.levels[-1]
        return replace(self, levels=(replace(inner, cardinality=num_devices),))

    def across_hosts(self, hosts: int, bandwidth: float, latency: float) -> Cluster:
        """``hosts`` copies of this cluster joined by one more, outermost level
        (``host``: one shared link per host, of ``bandwidth`` and ``latency``)."""
        level = ClusterLevel("host", hosts, bandwidth, latency, shared=True)
        return replace(self, levels=(level, *self.levels))

    @property
    def num_nodes(self) -> int:
        """``N``: the product of the outer levels' cardinalities."""
        return self.num_devices // self.devices_per_node

    def coordinates(self, device: int) -> tuple[int, ...]:
        """Mixed-radix coordinates of a device id, level 0 first."""
        return tuple(
            (device // s) % lv.cardinality for s, lv in zip(self._strides, self.levels, strict=True)
        )

    def check_devices(self, num_devices: int, where: str = "") -> None:
        """Raise unless ``num_devices`` is the cluster's device count."""
        if num_devices != self.num_devices:
            at = f"{where}: " if where else ""
            raise AlpaError(
                f"{at}{num_devices} devices requested but cluster '{self.name}' has "
                f"{self.num_devices} ({self.num_nodes} x {self.devices_per_node})"
            )

    # -- Alpa's submesh space ---------------------------------------------------

    def submesh_shapes(self) -> tuple[tuple[int, int], ...]:
        """Alpa's submeshes: ``(1, 2^m)`` within a node, then ``(n, M)`` whole nodes."""
        m = self.devices_per_node
        if m & (m - 1):
            raise AlpaError(
                f"cluster '{self.name}': the submesh space (1, 2^k) needs a power-of-two "
                f"number of devices per node, got {m}"
            )
        inner = [(1, 1 << k) for k in range(m.bit_length())]
        whole = [(n, m) for n in range(2, self.num_nodes + 1)]
        return tuple(inner + whole)

    def logical_mesh(
        self, shape: Sequence[int], devices: Sequence[int] | None = None
    ) -> LogicalDeviceMesh:
        """The logical mesh of ``shape`` over ``devices`` (row-major; default
        ``0..n-1``) with α/β per axis derived from the levels (module docstring)."""
        shape = tuple(int(s) for s in shape)
        size = math.prod(shape)
        ids = tuple(range(size)) if devices is None else tuple(int(d) for d in devices)
        if len(ids) != size:
            raise AlpaError(
                f"cluster '{self.name}': a mesh of shape {list(shape)} needs {size} devices, "
                f"got {len(ids)}"
            )
        bad = [d for d in ids if not 0 <= d < self.num_devices]
        if bad:
            raise AlpaError(
                f"cluster '{self.name}': device {bad[0]} is outside the cluster's "
                f"{self.num_devices} devices"
            )
        grid = np.array(ids, dtype=np.int64).reshape(shape)
        coords = np.stack(
            [
                (grid // s) % lv.cardinality
                for s, lv in zip(self._strides, self.levels, strict=True)
            ],
            axis=-1,
        )  # [*shape, levels]
        alpha, beta = [], []
        for axis in range(len(shape)):
            a, b = self._axis_alpha_beta(coords, axis)
            alpha.append(a)
            beta.append(b)
        return LogicalDeviceMesh(shape, tuple(alpha), tuple(beta), ids)

    def _axis_alpha_beta(self, coords: np.ndarray, axis: int) -> tuple[float, float]:
        """α/β of one mesh axis: its outermost crossed level, β scaled by link sharing."""
        nlev = len(self.levels)
        groups = np.moveaxis(coords, axis, -2).reshape(-1, coords.shape[axis], nlev)
        crossed = [
            j for j in range(nlev) if np.any(groups[:, :, j] != groups[:, :1, j])
        ]  # levels at which members of one group differ
        if not crossed:  # a size-1 axis: no communication; the innermost link's figures
            inner = self.levels[-1]
            return inner.latency, 1.0 / inner.bandwidth
        j = crossed[0]
        level = self.levels[j]
        sharing = 1
        if level.shared and j < nlev - 1:
            # Groups whose members sit in several units of level j each pass their
            # traffic through the link of every unit they touch; count per unit.
            per_unit: dict[tuple[int, ...], int] = {}
            for g in range(groups.shape[0]):
                for unit in {tuple(c[: j + 1]) for c in groups[g].tolist()}:
                    per_unit[unit] = per_unit.get(unit, 0) + 1
            sharing = max(per_unit.values())
        return level.latency, sharing / level.bandwidth

    def submesh_logical_meshes(
        self, submesh: tuple[int, int], start: int = 0
    ) -> tuple[LogicalDeviceMesh, ...]:
        """Every ``(dp, mp)`` view of the submesh ``(n, m)`` whose devices are
        ``start .. start + n·m − 1`` (start at a node boundary for ``n > 1``)."""
        n, m = submesh
        if (n, m) not in self.submesh_shapes():
            raise AlpaError(
                f"cluster '{self.name}': {n}x{m} is not a submesh of Alpa's space "
                f"{list(self.submesh_shapes())}"
            )
        size = n * m
        if start < 0 or start + size > self.num_devices:
            raise AlpaError(
                f"cluster '{self.name}': submesh {n}x{m} at device {start} leaves the cluster"
            )
        if start % m:
            raise AlpaError(
                f"cluster '{self.name}': submesh {n}x{m} must start at a multiple of {m}, "
                f"got {start}"
            )
        devices = tuple(range(start, start + size))
        return tuple(
            self.logical_mesh((dp, size // dp), devices)
            for dp in range(1, size + 1)
            if size % dp == 0
        )

    # -- the mesh.cluster op ---------------------------------------------------

    def to_op(self, name: str | None = None) -> ClusterOp:
        props = {
            "sym_name": StringAttr(name or self.name),
            "levels": ArrayAttr(
                [
                    LevelAttr.make(lv.name, lv.cardinality, lv.bandwidth, lv.latency, lv.shared)
                    for lv in self.levels
                ]
            ),
            "device_memory": FloatAttr(float(self.device_memory), f64),
            "peak_flops": FloatAttr(float(self.peak_flops), f64),
        }
        if self.device_name:
            props["device_name"] = StringAttr(self.device_name)
        attrs: dict[str, FloatAttr | StringAttr] = {}
        if self.hbm_bandwidth:
            attrs[HBM_BANDWIDTH_ATTR] = FloatAttr(float(self.hbm_bandwidth), f64)
        if self.memory_source:
            attrs[MEMORY_SOURCE_ATTR] = StringAttr(self.memory_source)
        if self.profile is not None:
            attrs[DEVICE_PROFILE_ATTR] = StringAttr(self.profile.dumps())
        return ClusterOp.create(properties=props, attributes=attrs)

    @staticmethod
    def of_module(module: ModuleOp) -> Cluster | None:
        """The cluster of ``module``'s ``mesh.cluster`` op, or None without one."""
        op = next(top_level_ops(module, ClusterOp), None)
        return Cluster.from_op(op) if isinstance(op, ClusterOp) else None

    @staticmethod
    def from_op(op: ClusterOp) -> Cluster:
        levels = tuple(
            ClusterLevel(
                lv.level_name.data,
                lv.size.data,
                float(lv.bandwidth.value.data),
                float(lv.latency.value.data),
                bool(lv.shared.data),
            )
            for lv in op.levels.data
        )
        hbm = op.attributes.get(HBM_BANDWIDTH_ATTR)
        source = op.attributes.get(MEMORY_SOURCE_ATTR)
        profile = op.attributes.get(DEVICE_PROFILE_ATTR)
        return Cluster(
            op.sym_name.data,
            levels,
            float(op.device_memory.value.data),
            float(op.peak_flops.value.data),
            float(hbm.value.data) if isinstance(hbm, FloatAttr) else 0.0,
            op.device_name.data if op.device_name is not None else "",
            source.data if isinstance(source, StringAttr) else "",
            DeviceProfile.loads(profile.data, f"cluster '{op.sym_name.data}'")
            if isinstance(profile, StringAttr)
            else None,
        )


# -- presets ---------------------------------------------------------------------

ClusterFactory = Callable[[int | None], Cluster]
"""A preset: called with the number of nodes (None = the preset's default)."""


def preset_nodes(preset: str, num_nodes: int | None, default: int) -> int:
    """A preset's node count: ``num_nodes``, or ``default``; checked."""
    n = default if num_nodes is None else num_nodes
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise AlpaError(f"cluster preset '{preset}': the number of nodes must be >= 1, got {n!r}")
    return n


# AWS p3.16xlarge (Alpa's testbed, §8): 8 x V100-SXM2 16 GB on NVLink 2.0 (hybrid
# cube mesh; 6 links x 25 GB/s = 150 GB/s per GPU and direction), 25 Gbps
# networking per instance (https://aws.amazon.com/ec2/instance-types/p3/).
# V100 SXM2: 125 TFLOP/s fp16 tensor, 900 GB/s HBM2 (NVIDIA V100 datasheet).
def alpa_testbed(num_nodes: int | None = None) -> Cluster:
    n = preset_nodes("alpa-testbed", num_nodes, 8)
    return Cluster(
        "alpa-testbed",
        (
            ClusterLevel("node", n, 25e9 / 8, 50e-6, shared=True),
            ClusterLevel("gpu", 8, 150 * GB, 5e-6),
        ),
        device_memory=16 * GiB,
        peak_flops=125e12,
        hbm_bandwidth=900 * GB,
        device_name="V100-SXM2-16GB",
    ).with_profile(v100_sxm2_aws())


@dataclass(frozen=True)
class FabricTier:
    """One switching tier of a scale-out network, innermost first.

    The tier's switches join the units of the tier below (the first tier: the
    nodes) into units of its own, ``name``, of at most ``nodes`` nodes (the
    largest whole number of the units below that divides the cluster: the
    units of a level are equal); the last tier joins whatever remains. Its
    links give each GPU the NIC's bandwidth over ``oversubscription`` (1: full
    bisection) at ``latency`` seconds.
    """

    name: str
    nodes: int
    latency: float
    oversubscription: float = 1.0


def largest_divisor(n: int, limit: int, step: int = 1) -> int:
    """The largest multiple of ``step`` dividing ``n`` and at most ``limit``
    (``step`` when none is larger; ``step`` must divide ``n``)."""
    best = step
    for k in range(step, min(n, limit) + 1, step):
        if n % k == 0:
            best = k
    return best


def scale_out_levels(
    num_nodes: int, nic: ClusterLevel, tiers: Sequence[FabricTier]
) -> tuple[ClusterLevel, ...]:
    """The levels above one node's devices, outermost first, for ``num_nodes``
    nodes with a NIC like ``nic`` (its bandwidth, sharing and name; cardinality
    and latency ignored) under the switching ``tiers`` (innermost first). A
    level joins the units of one tier inside a unit of the next, priced by that
    tier; a tier with a single unit below it adds no level, so a cluster
    under one first-tier switch keeps a single level of nodes."""
    if not tiers:
        raise AlpaError(f"cluster level '{nic.name}': a scale-out network needs a tier")
    levels: list[ClusterLevel] = []
    below, name = 1, nic.name  # nodes per unit of the tier below, and the units' name
    for k, tier in enumerate(tiers):
        last = k == len(tiers) - 1
        unit = num_nodes if last else largest_divisor(num_nodes, tier.nodes, below)
        if unit > below:
            bandwidth = nic.bandwidth / tier.oversubscription
            levels.append(ClusterLevel(name, unit // below, bandwidth, tier.latency, nic.shared))
            below, name = unit, tier.name
        if unit == num_nodes:
            break
    if not levels:  # one node
        levels.append(ClusterLevel(nic.name, 1, nic.bandwidth, tiers[0].latency, nic.shared))
    return tuple(reversed(levels))


# NVIDIA DGX A100 (DGX A100 datasheet / user guide): 8 x A100-SXM4 80 GB on six
# NVSwitches, NVLink 3 600 GB/s bidirectional per GPU (300 GB/s per direction);
# 8 x ConnectX-6 200 Gb/s HDR InfiniBand for compute, one per GPU (25 GB/s per
# GPU, not shared). A100: 312 TFLOP/s dense bf16, 2,039 GB/s HBM2e (A100 datasheet).
# Scale-out as a DGX SuperPOD (NVIDIA's DGX A100 SuperPOD reference architecture,
# Selene, where Megatron-LM's Table 1 ran): scalable units of 20 nodes on
# rail-optimized leaf switches, 7 units (140 nodes) per full fat tree of spine
# switches, core switches above; non-blocking at every tier. Each tier up is
# charged 1 us more latency (an HDR switch's port-to-port latency is ~0.13 us;
# the rest is the longer cables and adaptive routing, an estimate).
DGX_A100_TIERS = (
    FabricTier("su", 20, 5e-6),
    FabricTier("pod", 140, 6e-6),
    FabricTier("cluster", 1 << 30, 7e-6),
)


def dgx_a100(
    num_nodes: int | None = None, *, tiers: Sequence[FabricTier] = DGX_A100_TIERS
) -> Cluster:
    n = preset_nodes("dgx-a100", num_nodes, 4)
    nic = ClusterLevel("node", n, 200e9 / 8, 5e-6)
    return Cluster(
        "dgx-a100",
        (*scale_out_levels(n, nic, tiers), ClusterLevel("gpu", 8, 300 * GB, 3e-6)),
        device_memory=80 * GiB,
        peak_flops=312e12,
        hbm_bandwidth=2039 * GB,
        device_name="A100-SXM4-80GB",
    ).with_profile(a100_sxm4_dgx())


# NVIDIA DGX H100 (DGX H100 datasheet): 8 x H100-SXM5 80 GB on four NVSwitches,
# NVLink 4 900 GB/s bidirectional per GPU (450 GB/s per direction); 8 x
# ConnectX-7 400 Gb/s NDR InfiniBand, one per GPU (50 GB/s per GPU). H100 SXM:
# 989 TFLOP/s dense bf16, 3.35 TB/s HBM3 (H100 datasheet).
# Scale-out: scalable units of 32 nodes on rail-optimized leaf switches (DGX
# H100 SuperPOD reference architecture), full bisection up to pods of 3,072
# GPUs (384 nodes), and pods joined by aggregation switches at 1:7
# oversubscription, as the 24K-GPU cluster Llama 3 405B was trained on
# (Llama 3 paper, §3.3.1: 3,072-GPU pods of full bisection, 1:7 above them).
# A cluster whose node count 384 does not divide gets pods of the largest
# whole number of units that does (8,192 GPUs: 4 pods of 2,048).
DGX_H100_TIERS = (
    FabricTier("su", 32, 5e-6),
    FabricTier("pod", 384, 6e-6),
    FabricTier("cluster", 1 << 30, 7e-6, oversubscription=7.0),
)


def dgx_h100(
    num_nodes: int | None = None, *, tiers: Sequence[FabricTier] = DGX_H100_TIERS
) -> Cluster:
    n = preset_nodes("dgx-h100", num_nodes, 4)
    nic = ClusterLevel("node", n, 400e9 / 8, 5e-6)
    return Cluster(
        "dgx-h100",
        (*scale_out_levels(n, nic, tiers), ClusterLevel("gpu", 8, 450 * GB, 2e-6)),
        device_memory=80 * GiB,
        peak_flops=989e12,
        hbm_bandwidth=3350 * GB,
        device_name="H100-SXM5-80GB",
    ).with_profile(h100_sxm5_dgx())


# The local JAX devices, with nominal speeds (a CPU core: ~10^11 FLOP/s,
# ~20 GB/s memory, copies between devices at ~10 GB/s) and the memory they
# really have (alpa_ir.hardware.memory_budget).
def local_cpu(num_nodes: int | None = None, *, budget: MemoryBudget | None = None) -> Cluster:
    """The local JAX devices as one node. ``device_memory`` is ``budget``, by
    default :func:`~alpa_ir.hardware.memory_budget.local_device_budget`: a
    figure given by hand (``ALPA_DEVICE_MEMORY``), else for CPU devices the
    host's available memory shared among them, else the device's own."""
    import jax

    if num_nodes not in (None, 1):
        raise AlpaError(f"cluster preset 'local-cpu' is one node, got {num_nodes} nodes")
    devices = jax.local_devices()
    budget = budget or local_device_budget(devices=devices)
    return Cluster(
        "local-cpu",
        (ClusterLevel("device", len(devices), 10 * GB, 10e-6),),
        device_memory=budget.per_device,
        peak_flops=1e11,
        hbm_bandwidth=20 * GB,
        device_name=devices[0].platform,
        memory_source=budget.source,
    )


def builtin_presets() -> dict[str, ClusterFactory]:
    """The built-in cluster presets of this folder (the built-in plugin registers
    them with the P² systems' presets, :func:`alpa_ir.p2.system_clusters.p2_cluster_presets`)."""
    presets: dict[str, ClusterFactory] = {
        "alpa-testbed": alpa_testbed,
        "dgx-a100": dgx_a100,
        "dgx-h100": dgx_h100,
        "local-cpu": local_cpu,
    }
    return presets


def get_cluster(
    name: str,
    *,
    num_nodes: int | None = None,
    num_devices: int | None = None,
    presets: Mapping[str, Callable[..., object]] | None = None,
) -> Cluster:
    """A preset cluster by name, with ``num_nodes`` nodes, or as many nodes as
    ``num_devices`` devices fill (``--gpus``); presets from ``presets`` (a
    registry's ``cluster_presets``, which include the plugins'; default: the
    built-in ones)."""
    if presets is None:
        presets = builtin_presets()
    if name not in presets:
        raise AlpaError(f"unknown cluster preset '{name}'; known: {', '.join(sorted(presets))}")
    factory = presets[name]
    if num_devices is not None:
        probe = factory(None)
        assert isinstance(probe, Cluster)
        per_node = probe.devices_per_node
        if num_devices < 1 or num_devices % per_node:
            raise AlpaError(
                f"cluster preset '{name}': {num_devices} devices is not a whole number of "
                f"nodes of {per_node}"
            )
        if num_nodes is not None and num_nodes * per_node != num_devices:
            raise AlpaError(
                f"cluster preset '{name}': {num_nodes} nodes of {per_node} are not "
                f"{num_devices} devices"
            )
        num_nodes = num_devices // per_node
    cluster = factory(num_nodes)
    if not isinstance(cluster, Cluster):
        raise AlpaError(f"cluster preset '{name}' returned {type(cluster).__name__}, not a Cluster")
    return cluster


__all__ = [
    "DGX_A100_TIERS",
    "DGX_H100_TIERS",
    "HBM_BANDWIDTH_ATTR",
    "MEMORY_SOURCE_ATTR",
    "Cluster",
    "ClusterLevel",
    "FabricTier",
    "alpa_testbed",
    "builtin_presets",
    "dgx_a100",
    "dgx_h100",
    "get_cluster",
    "largest_divisor",
    "local_cpu",
    "preset_nodes",
    "scale_out_levels",
]
