"""Alpa's published end-to-end measurements (the OSDI'22 artifact), in this
repository's FLOP convention.

The data (``alpa_osdi22_e2e.csv`` beside this module) is ``results_e2e_ref.tsv``
of the artifact (repository alpa-projects/alpa, branch ``osdi22_artifact``,
folder ``osdi22_artifact/``): per-GPU TFLOPS of GPT-3, GShard MoE and
Wide-ResNet measured on the paper's testbed (:data:`TESTBED`) for Alpa, its
intra-op-only and inter-op-only variants and the baselines, with the measured
iteration latencies where the artifact gives them.

**One FLOP convention** (:data:`CONVENTION`): every figure here is converted
to :func:`alpa_ir.models.train_step.train_step_flops` (matmul and convolution
FLOPs of one step without recomputation: GPT 72·B·s·l·h²·(1 + s/6h) + 6·B·s·h·V),
the count ``alpa-bench`` divides by its simulated iteration time. The
artifact counts differently:

- GPT (Alpa and Megatron-LM rows): ``compute_gpt_tflops(...,
  checkpoint_activations=True)`` of Alpa's ``benchmark/util.py``,
  96·B·s·l·h²·(1 + s/6h) + 6·B·s·h·V: the recomputed forward is counted.
- MoE (Alpa and DeepSpeed rows): ``compute_moe_tflops(...,
  checkpoint_activations=True)``, four times the forward of every block
  (the recomputation), its gating and dispatch terms proportional to the
  expert group size (2048 for Alpa; DeepSpeed's B·s/(micro-batches·dp), 8192
  in the artifact's DeepSpeed suite, 4096 on 32 GPUs).
- Wide-ResNet: the executable's own count, XLA's dot and convolution FLOPs of
  the unoptimized HLO (``hlo_module_count_flop_dot_conv_only``), with the
  recomputed forward where the run rematerializes (every row but intra-op
  only). It is estimated from the intra-op-only row of the same size (no
  remat, its latency given: TFLOPS × GPUs × latency is XLA's count) times
  (3·stem + 4·rest)/(2·stem + 3·rest) of :func:`alpa_ir.models.wresnet.forward_flops`
  (the forward once more, the stem's input gradient never computed).

Where the artifact gives latencies, the figure here is exact: this
repository's FLOPs divided by GPUs × the mean latency. Elsewhere it is the
artifact's TFLOPS times (ours / the artifact's FLOP count), and the latency is
derived from the artifact's TFLOPS and its count (``latency_measured`` False);
so also for a row whose latencies are of another batch (:data:`OTHER_BATCH`).
"""

from __future__ import annotations

import csv
import functools
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from alpa_ir.errors import AlpaError

DATA_FILE = Path(__file__).with_name("alpa_osdi22_e2e.csv")
SOURCE = (
    "github.com/alpa-projects/alpa, branch osdi22_artifact (commit e0ae8bf8), "
    "osdi22_artifact/results_e2e_ref.tsv (Figure 8 of the Alpa paper)"
)
TESTBED = "AWS p3.16xlarge: 8 NVIDIA V100-SXM2 16 GB per node (NVLink), 25 Gbps between nodes"
CONVENTION = (
    "per-GPU TFLOPS of train_step_flops: matmul and convolution FLOPs of one step without "
    "recomputation (GPT: 72·B·s·l·h²·(1 + s/6h) + 6·B·s·h·V)"
)
OTHER_BATCH = 0.1
"""A row whose TFLOPS × GPUs × mean latency differs from the artifact's FLOP
count of one global batch by more than this fraction measured another batch
(MoE-70B intra-op only: half of it); its latencies are not used."""
SUITE_METHODS = {
    "gpt3": ("alpa", "intra-op", "inter-op", "megatron"),
    "moe": ("alpa", "intra-op", "inter-op", "deepspeed"),
    "wresnet": ("alpa", "intra-op", "inter-op", "pp-dp"),
}
"""The methods the artifact measured for each suite (Figure 8), by the names
``alpa-bench`` gives its plans."""

ARTIFACT_MICRO_BATCHES = {
    # suite_artifact_e2e_gpt.py (artifact_result_e2e_gpt_suite); 39B, which the
    # artifact does not run, from benchmark/alpa/suite_paper_auto_gpt.py
    # (tmp_auto_gpt_suite's 64-GPU plan; the search tried 128 to 1024)
    "gpt3-350m": 512,
    "gpt3-1.3b": 128,
    "gpt3-2.6b": 128,
    "gpt3-6.7b": 64,
    "gpt3-15b": 128,
    "gpt3-39b": 256,
    # suite_artifact_e2e_moe.py; 70B from suite_paper_auto_moe.py (64 GPUs)
    "moe-380m": 512,
    "moe-1.3b": 32,
    "moe-2.4b": 32,
    "moe-10b": 16,
    "moe-27b": 128,
    "moe-70b": 64,
    # suite_artifact_e2e_wresnet.py (artifact_result_e2e_wresnet_suite); 13B from
    # suite_paper_wresnet.py (64 GPUs: 32 or 48 micro-batches of a 1536 batch)
    "wresnet-250m": 24,
    "wresnet-1b": 24,
    "wresnet-2b": 24,
    "wresnet-4b": 32,
    "wresnet-6.8b": 32,
    "wresnet-13b": 32,
}
"""The micro-batches per step of Alpa's measured plan of each suite size."""
ARTIFACT_DTYPE = {"gpt3": "float16", "moe": "float16", "wresnet": "float32"}
"""The computation dtype of each suite in the artifact: GPT and MoE in mixed
precision (``dtype = jnp.float16`` in benchmark_3d_one_case_{gpt_bert,moe}.py),
Wide-ResNet in fp32 (``wresnet_specs`` of suite_paper_wresnet.py: "fp32" for
every size)."""


def artifact_dtype(model: str) -> str | None:
    """The artifact's computation dtype of a suite size; None for other models."""
    for suite, dtype in ARTIFACT_DTYPE.items():
        if model.startswith(suite) and model in ARTIFACT_MICRO_BATCHES:
            return dtype
    return None


@dataclass(frozen=True)
class Measurement:
    """One measured (suite, size, GPUs, method) of the artifact."""

    suite: str
    size: str
    """The artifact's name of the size (``"1.3B"``)."""
    model: str
    """This repository's config of the size; empty for a size no suite here has."""
    gpus: int
    method: str
    """``alpa-bench``'s name of the method (``alpa``, ``intra-op``, ``megatron``, ...)."""
    artifact_method: str
    artifact_tflops: float | None
    """Per-GPU TFLOPS as the artifact counts them; None where it did not run."""
    latencies: tuple[float, ...]
    """Measured seconds per iteration (empty where the artifact gives none)."""
    params_b: float | None
    remat: bool
    moe_group_size: int | None
    tflops: float | None
    """Per-GPU TFLOPS in :data:`CONVENTION`; None where there is no figure."""
    latency: float | None
    """Seconds per iteration: the mean measured latency, or derived from the
    artifact's TFLOPS and FLOP count (``latency_measured`` False)."""
    latency_measured: bool
    note: str = ""
    """Why a figure is read otherwise than the module docstring says, if it is."""

    @property
    def failed(self) -> bool:
        """The artifact has no figure (-1: the method ran out of memory or did not run)."""
        return self.artifact_tflops is None


def gpt_artifact_flops(config: Any, remat: bool = True) -> float:
    """Alpa's ``compute_gpt_tflops`` numerator (``checkpoint_activations=remat``)."""
    b, s = config.batch_size, config.seq_len
    h, layers, v = config.hidden_size, config.num_layers, config.vocab_size
    factor = 96 if remat else 72
    return factor * b * s * h * h * layers * (1 + s / (6 * h)) + 6 * b * s * h * v


def moe_artifact_flops(config: Any, group_size: int, remat: bool = True) -> float:
    """Alpa's ``compute_moe_tflops`` numerator (half the layers dense, half MoE)."""
    b, s, h = config.batch_size, config.seq_len, config.hidden_size
    layers, experts = config.num_layers, config.num_experts
    r, v = config.mlp_ratio, config.vocab_size
    factor = 4 if remat else 3
    dense = (b * s * h * h * (8 + 4 * r) + 4 * b * s * s * h) * factor
    moe = b * s * h * h * 8 + 4 * b * s * s * h + 8 * b * s * h * h * r
    moe += 2 * b * s * h * experts + 4 * b * s * group_size + 8 * b * s * h * group_size
    embedding = 6 * b * s * h * v
    return dense * layers / 2 + moe * factor * layers / 2 + embedding


def wresnet_remat_factor(config: Any) -> float:
    """(3·stem + 4·rest) / (2·stem + 3·rest): a Wide-ResNet step's dot and
    convolution FLOPs with the forward recomputed, over those without."""
    from alpa_ir.models.wresnet import forward_flops

    stem, rest = forward_flops(config)
    return (3 * stem + 4 * rest) / (2 * stem + 3 * rest)


@dataclass(frozen=True)
class _Row:
    suite: str
    size: str
    model: str
    gpus: int
    method: str
    artifact_method: str
    tflops: float | None
    latencies: tuple[float, ...]
    params_b: float | None
    remat: bool
    group: int | None


def _float_or_none(text: str, where: str) -> float | None:
    if not text.strip():
        return None
    try:
        value = float(text)
    except ValueError:
        raise AlpaError(f"{where}: not a number: {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise AlpaError(f"{where}: not a positive number: {text!r}")
    return value


def _rows(path: Path) -> Iterator[_Row]:
    with path.open(newline="") as handle:
        lines = [line for line in handle if not line.startswith("#")]
    for number, record in enumerate(csv.DictReader(lines), start=2):
        where = f"{path.name}, data row {number - 1}"
        try:
            latencies = tuple(
                _float_or_none(x, f"{where}, latencies_s") or 0.0
                for x in record["latencies_s"].split()
            )
            yield _Row(
                suite=record["suite"],
                size=record["size"],
                model=record["model"],
                gpus=int(record["gpus"]),
                method=record["method"],
                artifact_method=record["artifact_method"],
                tflops=_float_or_none(record["tflops"], f"{where}, tflops"),
                latencies=latencies,
                params_b=_float_or_none(record["params_b"], f"{where}, params_b"),
                remat=record["remat"] == "1",
                group=int(record["moe_group_size"]) if record["moe_group_size"] else None,
            )
        except (KeyError, ValueError) as error:
            raise AlpaError(f"{where}: malformed row ({error})") from None


def _artifact_flops(row: _Row, xla_counts: dict[str, float]) -> float:
    """The FLOPs of one step as the artifact counted them for ``row``."""
    from alpa_ir.models.registry import get_config
    from alpa_ir.models.train_step import train_step_flops

    config = get_config(row.model)
    if row.suite == "gpt3":
        return gpt_artifact_flops(config, row.remat)
    if row.suite == "moe":
        return moe_artifact_flops(config, row.group or config.expert_group_size, row.remat)
    plain = xla_counts.get(row.model, train_step_flops(row.model))
    return plain * wresnet_remat_factor(config) if row.remat else plain


@functools.cache
def load_measurements(path: Path = DATA_FILE) -> tuple[Measurement, ...]:
    """Every row of the artifact's table, converted to :data:`CONVENTION`."""
    from alpa_ir.models.train_step import train_step_flops

    rows = list(_rows(path))
    # XLA's own count of a Wide-ResNet step without remat: its intra-op-only row
    xla_counts = {
        r.model: r.tflops * 1e12 * r.gpus * (sum(r.latencies) / len(r.latencies))
        for r in rows
        if r.suite == "wresnet" and r.model and not r.remat and r.latencies and r.tflops
    }
    out = []
    for r in rows:
        tflops = latency = None
        note = ""
        measured = bool(r.latencies) and r.tflops is not None
        mean = sum(r.latencies) / len(r.latencies) if r.latencies else 0.0
        if r.model and r.tflops is not None:
            count = _artifact_flops(r, xla_counts)
            if measured and r.suite != "wresnet":
                batches = r.tflops * 1e12 * r.gpus * mean / count
                if abs(batches - 1) > OTHER_BATCH:
                    measured = False
                    note = (
                        f"its latencies are of {batches:.2f} of the global batch: "
                        "converted by the FLOP counts"
                    )
            latency = mean if measured else count / (r.tflops * 1e12 * r.gpus)
            tflops = train_step_flops(r.model) / latency / r.gpus / 1e12
        elif measured:
            latency = mean
        out.append(
            Measurement(
                suite=r.suite,
                size=r.size,
                model=r.model,
                gpus=r.gpus,
                method=r.method,
                artifact_method=r.artifact_method,
                artifact_tflops=r.tflops,
                latencies=r.latencies,
                params_b=r.params_b,
                remat=r.remat,
                moe_group_size=r.group,
                tflops=tflops,
                latency=latency,
                latency_measured=measured,
                note=note,
            )
        )
    return tuple(out)


def measurement(model: str, gpus: int, method: str) -> Measurement | None:
    """The artifact's row of ``model`` on ``gpus`` GPUs under ``method``, if any."""
    for m in load_measurements():
        if m.model == model and m.gpus == gpus and m.method == method:
            return m
    return None
