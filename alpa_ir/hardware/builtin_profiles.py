"""The built-in device profiles of the GPU presets, each price with its source.

Only microbenchmarks are used (GEMM throughput, memory bandwidth, collective
bus bandwidth), never an end-to-end training measurement: those are the
model's tests (``alpa-bench --measured``). Where a publication gives a figure
for a sibling part (a V100 PCIe instead of SXM2), the conversion is stated.

Sources:

[MAMF] S. Bekman, *Machine Learning Engineering*, "Maximum Achievable Matmul
    FLOPS comparison table" (github.com/stas00/ml-engineering,
    compute/accelerator/README.md): bf16 ``matmul``, best shape of a sweep:
    A100 SXM 267.9 TFLOP/s (85.9 % of 312, CUDA 12.1), H100 SXM 792.1 TFLOP/s
    (80.1 % of 989, CUDA 12.1).
[MARKIDIS] S. Markidis et al., "NVIDIA Tensor Core Programmability,
    Performance & Precision", IPDPSW 2018 (arXiv:1803.04014): cuBLAS
    mixed-precision GEMM with tensor cores, 83 TFLOP/s at N = 8192 on a V100
    PCIe (112 TFLOP/s peak): 74 %; the V100 SXM2's peak is 125 TFLOP/s at
    the same efficiency: 93 TFLOP/s.
[JIA] Z. Jia et al., "Dissecting the NVIDIA Volta GPU Architecture via
    Microbenchmarking", 2018 (arXiv:1804.06826): V100 global memory
    throughput 750 GB/s of 900; L2 cache throughput 2,155 GB/s (its L2
    microbenchmark, against the P100's 1,624).
[NCCL-A100] NVIDIA/nccl-tests issue #149: ``all_reduce_perf`` on 8 A100-SXM4
    80 GB over NVLink 3 / NVSwitch: bus bandwidth about 200 GB/s.
[NCCL-H100] NVIDIA/nccl-tests issue #212 (S. Jeaugey): NCCL reaches about
    370 GB/s of NVLink 4's 450 GB/s line rate (protocol overhead ~20 %) for
    ring collectives, and about 480 GB/s bus bandwidth for NVLink SHARP
    all-reduce on 8 H100.
[P2] The P² paper's §5 and Appendix A (``alpa_ir.p2.system``): V100 NVLink ring
    at 135 GB/s per direction (90 % of 150); a node's NIC reaches 6-8 GB/s of
    its 12.5 GB/s line rate (Appendix A's bounds), 64 % at best.
[LAUNCH] A kernel costs about 5 µs however small on these GPUs (launch and
    tail; XLA's async dispatch hides launches only behind running kernels).
    Published figures: 4-6 µs per kernel (CUDA Programming Guide's measured
    launch latencies, nccl-tests' small-message floors).
[GRAPHS] "Getting Started with CUDA Graphs", NVIDIA Technical Blog
    (developer.nvidia.com/blog/cuda-graphs/, A. Gray, 2019). The figures
    here are NOT VERIFIED: they were quoted from memory, and the stored copy
    of the post that the search tools found shows only its opening. They
    are: on a V100, a chain of short kernels (2.9 µs each) took 9.6 µs per
    kernel when the host waited for each, and 3.8 µs when they were launched
    back to back into a stream (the launch overlaps the previous kernel's
    run). Launches are asynchronous on GPUs (CUDA Programming Guide,
    "Asynchronous Concurrent Execution"): a kernel queued behind a running
    one costs the longer of its run and the launch floor, not their sum
    (``async_launch``).
[TILES] NVIDIA, *Matrix Multiplication Background User's Guide* (DU-09799-001,
    §2.3 and §3): cuBLAS runs a GEMM with one of several output tiles
    (256x128, 128x128, 128x64, 64x64, ...) chosen per problem; larger tiles
    reuse more data, smaller ones fill more SMs (tile and wave quantization),
    and it may split ``k`` (split-K) for outputs of few tiles. The rate of a
    tile is bounded by what the L2 cache serves it; [JIA] measured the V100's
    L2 throughput at 2,155 GB/s: a 64x64 fp16 tile (32 FLOP per byte read)
    reaches at most 69 TFLOP/s, a 128x64 one 92, a 128x128 one 138 (above
    [MARKIDIS]'s 93, so the large tiles run at the measured rate).

Overlap: none in the built-in profiles. XLA of Alpa's time ran a step's
collectives synchronously on the compute stream (its async collectives came
later), and Alpa's OSDI'22 runtime sends cross-mesh tensors between stage
runs; nothing measured says otherwise. A calibrated profile may say more.

The inter-node levels: the line rate (AWS p3.16xlarge 25 Gbps; DGX HDR and
NDR InfiniBand, one 200 / 400 Gb/s HCA per GPU) times the NIC share [P2]
measured (64 %) for the AWS TCP network, and times 90 % for InfiniBand with
GPUDirect RDMA (NCCL's protocol overhead, [NCCL-H100]).
"""

from __future__ import annotations

from alpa_ir.hardware.device_profile import (
    CollectiveFit,
    DeviceProfile,
    GemmPoint,
    Overlap,
)

GB = 1e9
LAUNCH_OVERHEAD_GPU = 5e-6


def _links(
    level: str, bandwidth: float, latency: float, *, all_reduce: float | None = None
) -> tuple[CollectiveFit, ...]:
    """The fits of one level: every kind at ``bandwidth``, the all-reduce at
    ``all_reduce`` where it differs (NVLink SHARP)."""
    kinds = ("all-gather", "reduce-scatter", "all-to-all", "send-recv")
    return (
        CollectiveFit("all-reduce", level, 0, latency, all_reduce or bandwidth),
        *(CollectiveFit(k, level, 0, latency, bandwidth) for k in kinds),
    )


def v100_sxm2_aws() -> DeviceProfile:
    """AWS p3.16xlarge (Alpa's testbed): V100-SXM2 16 GB, NVLink 2 ring, 25 Gbps."""
    return DeviceProfile(
        name="v100-sxm2-p3.16xlarge",
        device="V100-SXM2-16GB",
        source="built-in: [MARKIDIS] GEMM, [JIA] memory, [P2] NVLink and NIC share "
        "(alpa_ir.hardware.builtin_profiles)",
        peak_flops=(("float16", 125e12), ("float32", 15.7e12)),
        gemm=(
            GemmPoint(8192, 8192, 8192, "float16", 0.74 * 125e12),
            GemmPoint(8192, 8192, 8192, "float32", 0.74 * 15.7e12),
        ),
        memory_bandwidth=750 * GB,
        launch_overhead=LAUNCH_OVERHEAD_GPU,
        collectives=(
            *_links("node", 0.64 * 25e9 / 8, 50e-6),
            *_links("gpu", 135 * GB, 5e-6),
        ),
        overlap=Overlap(gradient_sync=0.0, cross_mesh=0.0),
        sm_count=80,
        gemm_tiles=((256, 128), (128, 256), (128, 64), (64, 128), (64, 64)),  # [TILES]
        l2_bandwidth=2155 * GB,  # [JIA]
        max_split_k=8,  # [TILES]
        async_launch=True,  # [GRAPHS]
    )


def _dgx(
    name: str,
    device: str,
    source: str,
    peak: float,
    mamf: GemmPoint,
    hbm: float,
    nvlink: float,
    hca: float,
    sm_count: int,
    *,
    nvlink_all_reduce: float | None = None,
) -> DeviceProfile:
    """A DGX node's profile: bf16/fp16 at the datasheet ``peak`` (fp32 half of
    it, TF32), the measured GEMM ``mamf`` in both half precisions, 90 % of the
    ``hbm`` bandwidth, NVLink at ``nvlink`` bus bandwidth and one InfiniBand HCA
    of ``hca`` bytes/s line rate per GPU at 90 %."""
    return DeviceProfile(
        name=name,
        device=device,
        source=source,
        peak_flops=(("bfloat16", peak), ("float16", peak), ("float32", peak / 2)),
        gemm=tuple(
            GemmPoint(mamf.m, mamf.n, mamf.k, dtype, mamf.flops_per_s)
            for dtype in ("bfloat16", "float16")
        ),
        memory_bandwidth=0.9 * hbm,
        launch_overhead=LAUNCH_OVERHEAD_GPU,
        collectives=(
            *_links("node", 0.9 * hca, 5e-6),
            *_links("gpu", nvlink, 3e-6, all_reduce=nvlink_all_reduce),
        ),
        overlap=Overlap(gradient_sync=0.0, cross_mesh=0.0),
        sm_count=sm_count,
    )


def a100_sxm4_dgx() -> DeviceProfile:
    """NVIDIA DGX A100: A100-SXM4 80 GB on NVSwitch, one HDR 200 Gb/s HCA per GPU."""
    return _dgx(
        "a100-sxm4-dgx",
        "A100-SXM4-80GB",
        "built-in: [MAMF] GEMM, [NCCL-A100] NVSwitch (alpa_ir.hardware.builtin_profiles)",
        312e12,
        GemmPoint(6912, 16384, 2048, "bfloat16", 267.9e12),
        2039 * GB,
        200 * GB,
        200e9 / 8,
        108,
    )


def h100_sxm5_dgx() -> DeviceProfile:
    """NVIDIA DGX H100: H100-SXM5 80 GB on NVSwitch, one NDR 400 Gb/s HCA per GPU."""
    return _dgx(
        "h100-sxm5-dgx",
        "H100-SXM5-80GB",
        "built-in: [MAMF] GEMM, [NCCL-H100] NVLink (alpa_ir.hardware.builtin_profiles)",
        989e12,
        GemmPoint(6144, 17920, 2816, "bfloat16", 792.1e12),
        3350 * GB,
        370 * GB,
        400e9 / 8,
        132,
        nvlink_all_reduce=480 * GB,
    )


def builtin_profiles() -> dict[str, DeviceProfile]:
    """The built-in profiles by name."""
    return {p.name: p for p in (v100_sxm2_aws(), a100_sxm4_dgx(), h100_sxm5_dgx())}


__all__ = ["a100_sxm4_dgx", "builtin_profiles", "h100_sxm5_dgx", "v100_sxm2_aws"]
