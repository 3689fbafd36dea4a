"""alpa-suite: run Alpa's own tests against alpa_ir through a name-only shim.

Alpa's test files are read from an Alpa checkout given on the command line
(``--alpa``, e.g. a clone of alpa-projects/alpa) and run unchanged in a work
folder outside this repository: nothing of Alpa's is kept here. The shim is
a package ``alpa`` whose names resolve to alpa_ir's (``alpa.ShardParallel``
is ``alpa_ir.ShardParallel``, ``alpa.device_mesh`` is ``alpa_ir.device_mesh``,
``alpa.shard_parallel.auto_sharding.AutoShardingOption`` is
``alpa_ir.AutoShardingOption``, ...). What is Alpa's test code rather than
its compiler is taken from the checkout as it is: its test helpers
(``alpa/testing.py``, ``alpa/test_install.py``), its model zoo files
(``alpa/model/{model_util,bert_model,moe}.py``) and two HLO/pytree helpers
of ``alpa/util.py`` (``count_communication_primitives``, ``map_to_shape``).
Alpa ran on JAX 0.3: a small layer gives the installed JAX the names its
tests import (``jax.interpreters.pxla``'s ``ShardingSpec`` classes and an
array's ``sharding_spec``, converted from its HLO sharding as Alpa did;
``jax.experimental.pjit.PartitionSpec``; ``jax.experimental.maps``).

    python -m alpa_ir.tools.alpa_suite --alpa ~/alpa --work /tmp/alpa_suite

prints one line per test of the set (PASSED/FAILED/ERROR with the first
error line), each file's count, and the count over the set as "N of M".

The set (:data:`SUITE` filtered by :func:`the_set`) is every test of Alpa's
``tests`` folder that exercises the API an Alpa user calls and needs no
GPU-only feature: 61 shard-parallel tests (63 less the 2 Alpa skips itself),
28 pipeline tests and 22 runtime tests, 111 in all. :data:`OUT_OF_SET` says
for every other file (and the two single tests left out) why it is not in.
``--files`` chooses the test files.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

SHARD_PARALLEL = (
    "tests/shard_parallel/test_basic.py",
    "tests/shard_parallel/test_mlp.py",
    "tests/shard_parallel/test_manual.py",
    "tests/shard_parallel/test_mixed_2d.py",
    "tests/shard_parallel/test_numerical_correctness.py",
    "tests/shard_parallel/test_gradient_accumulation.py",
    "tests/shard_parallel/test_conv.py",
    "tests/shard_parallel/test_bert.py",
    "tests/shard_parallel/test_moe.py",
)
"""Every file of Alpa's ``tests/shard_parallel`` (63 tests, 2 of which Alpa
skips itself)."""

PIPELINE_PARALLEL = (
    "tests/pipeline_parallel/test_mlp.py",
    "tests/pipeline_parallel/test_bert.py",
    "tests/pipeline_parallel/test_tied_embedding.py",
    "tests/pipeline_parallel/test_reduce_scatter.py",
    "tests/pipeline_parallel/test_manual_sharding.py",
    "tests/pipeline_parallel/test_global_norm.py",
    "tests/pipeline_parallel/test_set_input_shard.py",
    "tests/pipeline_parallel/test_inference_only.py",
    "tests/pipeline_parallel/test_inference_auto.py",
    "tests/pipeline_parallel/test_layer_construction.py",
    "tests/pipeline_parallel/test_remat.py",
    "tests/pipeline_parallel/test_stage_construction.py",
    "tests/pipeline_parallel/test_scatter_gather.py",
    "tests/pipeline_parallel/test_multi_graph.py",
)
"""The files of Alpa's ``tests/pipeline_parallel`` that test its user API
(``parallelize`` with ``PipeshardParallel``, its options and executables)."""

RUNTIME = (
    "tests/runtime/test_create_state.py",
    "tests/runtime/test_follow_parallel.py",
    "tests/runtime/test_random_seed.py",
    "tests/runtime/test_debug_info.py",
    "tests/runtime/test_parallel_plan.py",
    "tests/runtime/test_save_load.py",
    "tests/runtime/test_dist_save_load.py",
    "tests/runtime/test_tracing.py",
    "tests/runtime/test_data_loader.py",
    "tests/runtime/test_device_mesh.py",
)
"""The files of Alpa's ``tests/runtime`` that test its user API
(``CreateStateParallel``, ``FollowParallel``, ``set_seed``, parallel plans,
checkpoints, tracing, the mesh data loader, ``preshard_dynamic_args``)."""

SUITE = SHARD_PARALLEL + PIPELINE_PARALLEL + RUNTIME
"""The files of the set (see :data:`OUT_OF_SET` for every other test file of
Alpa's ``tests`` folder and why it is not in)."""

OUT_OF_SET: dict[str, str] = {
    # files
    "tests/pipeline_parallel/test_cross_mesh_resharding.py": "NCCL/cupy communicators, GPU only",
    "tests/pipeline_parallel/test_dynamic_programming.py": "Alpa's internal stage DP (numba)",
    "tests/pipeline_parallel/test_old_dp_vs_new_dp.py": "two internal DP implementations of Alpa",
    "tests/pipeline_parallel/test_pipeline_marker.py": "Alpa's XLA custom call of its marker",
    "tests/pipeline_parallel/test_schedules.py": "Alpa's internal schedule classes",
    "tests/pipeline_parallel/test_stage_construction_util.py": "Alpa's internal stage profiling",
    "tests/pipeline_parallel/test_stage_construction_slow.py": (
        "Alpa's own runner skips it (run_all.py slow_testcases: profiling an 8-layer BERT)"
    ),
    "tests/runtime/test_cross_mesh_communicator.py": "NCCL communicators, GPU only",
    "tests/runtime/test_xla_nccl.py": "NCCL, GPU only",
    "tests/runtime/test_memory_leak.py": "the live buffers of Alpa's Ray mesh workers",
    "tests/runtime/test_install.py": "pytest collects no test (it imports only suite())",
    "tests/serve": "Alpa's model serving, not the compiler",
    "tests/torch_frontend": "the torch frontend",
    "tests/tpu": "TPU only",
    "tests/util": "Alpa's internal HLO cost model and ordered set",
    # single tests of files in the set
    "tests/runtime/test_device_mesh.py::DeviceMeshTest::test_distributed_array": (
        "Alpa's driver/worker remote buffers (PhysicalDeviceMesh.shard_args_to_arrays)"
    ),
    "tests/runtime/test_dist_save_load.py::DistSaveLoadTest::test_distributed_array_save_load": (
        "Alpa's driver/worker remote buffers (DistributedArray.save, get_remote_buffers)"
    ),
}
"""Alpa's tests that are not in the set, and why: a GPU-only feature (NCCL,
cupy, TPU), Alpa's internal modules (what a user does not import: a
name-only shim cannot give them a meaning), or not run by Alpa itself.
Tests Alpa skips itself (``@unittest.skip``) and tests that need more GPUs
than a CPU host has (``skipIf(jax.device_count("gpu") < N)``) are left out
where they stand (:func:`the_set`)."""

_SKIPPED = re.compile(
    r"@unittest\.skip\(|@unittest\.skipIf\(jax\.(?:local_)?device_count\(['\"]gpu"
)


def the_set(tests_root: Path, files: Sequence[str] = SUITE) -> list[str]:
    """The pytest ids of the set: every test of ``files`` (paths under the
    checkout's root ``tests_root``) except those Alpa skips itself or that ask
    for GPUs, and those of :data:`OUT_OF_SET`."""
    ids = []
    for name in files:
        if name in OUT_OF_SET:
            continue
        cls, decorated = "", False
        for line in (tests_root / name).read_text().splitlines():
            if match := re.match(r"class (\w+)\(", line):
                cls = match.group(1)
            elif _SKIPPED.match(line.strip()):
                decorated = True
            elif match := re.match(r"    def (test_\w+)\(", line):
                test = f"{name}::{cls}::{match.group(1)}"
                if not decorated and test not in OUT_OF_SET:
                    ids.append(test)
                decorated = False
    return ids


_NAMES = {
    "__init__.py": (
        "import alpa_ir as _a\nfrom alpa_ir import *  # noqa\n\n\n"
        "def __getattr__(name):\n    return getattr(_a, name)\n"
    ),
    "api.py": "from alpa_ir import init, shutdown, parallelize, grad, value_and_grad  # noqa\n",
    "parallel_method.py": (
        "from alpa_ir import (ShardParallel, PipeshardParallel, DataParallel,  # noqa\n"
        "    Zero2Parallel, Zero3Parallel, LocalPipelineParallel)\n"
    ),
    "device_mesh.py": (
        "import alpa_ir.device_mesh as _d\nfrom alpa_ir.device_mesh import *  # noqa\n\n\n"
        "def __getattr__(name):\n    return getattr(_d, name)\n"
    ),
    "global_env.py": "from alpa_ir import global_config  # noqa\n",
    "parallel_plan.py": "from alpa_ir.api.parallel_plan import PlacementSpec, plan_to_method  # noqa\n",
    "data_loader.py": "from alpa_ir import DataLoader, MeshDriverDataLoader  # noqa\n",
    "pipeline_parallel/__init__.py": "",
    "pipeline_parallel/primitive_def.py": "from alpa_ir import mark_pipeline_boundary  # noqa\n",
    "pipeline_parallel/layer_construction.py": (
        "from alpa_ir import AutoLayerOption, ManualLayerOption, manual_layer_construction  # noqa\n"
    ),
    "pipeline_parallel/stage_construction.py": (
        "from alpa_ir import UniformStageOption, ManualStageOption, AutoStageOption  # noqa\n"
        "from alpa_ir.api.stage_result import get_last_dp_result  # noqa\n"
        "StageOption = object\n"
    ),
    "shard_parallel/__init__.py": "",
    "shard_parallel/auto_sharding.py": "from alpa_ir import AutoShardingOption  # noqa\n",
    "model/__init__.py": "",
}

_JAX_COMPAT = '''"""JAX 0.3 names that Alpa's tests import, over the installed JAX."""
import dataclasses
import sys
import types

import jax
import jax.experimental.pjit as pjit
import jax.interpreters.pxla as pxla
import numpy as np
from jax._src.array import ArrayImpl


def _frozen(name, fields):
    def init(self, *values, **named):
        given = dict(zip(fields, values))
        given.update(named)
        for f, v in given.items():
            object.__setattr__(self, f, tuple(v) if f in ("chunks", "sharding", "mesh_mapping") else v)
    cls = dataclasses.dataclass(frozen=True)(type(name, (), {"__annotations__": {f: object for f in fields}}))
    cls.__init__ = init
    return cls


NoSharding = _frozen("NoSharding", ())
Chunked = _frozen("Chunked", ("chunks",))
Unstacked = _frozen("Unstacked", ("size",))
ShardedAxis = _frozen("ShardedAxis", ("axis",))
Replicated = _frozen("Replicated", ("replicas",))
ShardingSpec = _frozen("ShardingSpec", ("sharding", "mesh_mapping"))


def _step(ids):
    ids = np.asarray(ids).ravel()
    if len(ids) < 2:
        return 1
    d = ids[1] - ids[0]
    return int(d) if np.all(np.diff(ids) == d) else None


def _sharding_spec(x):
    """Alpa's hlo_sharding_to_sharding_spec of the array's sharding."""
    hlo = x.sharding._to_xla_hlo_sharding(x.ndim)
    if hlo.is_replicated() or x.sharding.is_fully_replicated:
        return ShardingSpec((NoSharding(),) * x.ndim, (Replicated(len(x.sharding.device_set)),))
    dims = list(hlo.tile_assignment_dimensions())
    devices = np.array(hlo.tile_assignment_devices()).reshape(dims)
    tiled = [i for i, d in enumerate(dims) if d != 1]
    steps = [_step(devices[tuple(0 if i != t else slice(None) for i in range(devices.ndim))])
             for t in tiled]
    sharding, mapping = [], []
    for i in range(x.ndim):
        if dims[i] == 1:
            sharding.append(NoSharding())
        else:
            sharding.append(Chunked([dims[i]]))
            mapping.append(ShardedAxis(len(mapping)))
    if len(tiled) > len(mapping):
        mapping.append(Replicated(dims[-1]))
    if None not in steps:
        mapping = [mapping[i] for i in sorted(range(len(tiled)), key=lambda i: -steps[i])]
    return ShardingSpec(sharding, mapping)


for _cls in (NoSharding, Chunked, Unstacked, ShardedAxis, Replicated, ShardingSpec):
    setattr(pxla, _cls.__name__, _cls)
pxla.ShardedDeviceArray = jax.Array
pjit.PartitionSpec = jax.sharding.PartitionSpec
_maps = types.ModuleType("jax.experimental.maps")
_maps.FrozenDict = dict
sys.modules.setdefault("jax.experimental.maps", _maps)
ArrayImpl.sharding_spec = property(_sharding_spec)


def _none_if_absent(count):
    """A platform that is absent has no devices: Alpa's tests skip on
    ``jax.device_count("gpu") < 8`` at import, where JAX raises without a GPU."""
    def counted(backend=None):
        try:
            return count(backend)
        except RuntimeError:
            if backend is None:
                raise
            return 0
    return counted


for _name in ("tree_map", "tree_flatten", "tree_unflatten", "tree_leaves", "tree_structure"):
    if not hasattr(jax, _name):
        setattr(jax, _name, getattr(jax.tree_util, _name))
if not hasattr(jax, "ShapedArray"):
    jax.ShapedArray = jax.core.ShapedArray
jax.device_count = _none_if_absent(jax.device_count)
jax.local_device_count = _none_if_absent(jax.local_device_count)
'''

_CONFTEST = (
    "import os\n"
    'os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")\n'
    'os.environ.setdefault("JAX_PLATFORMS", "cpu")\n'
    "import jax_compat  # noqa\n"
)


def _util_helpers(util_source: str) -> str:
    """Alpa's ``count_communication_primitives`` and ``map_to_shape``, as they are."""
    out = ["from jax.tree_util import PyTreeDef, tree_map\n"]
    for name in ("count_communication_primitives", "map_to_shape"):
        match = re.search(rf"^def {name}\(.*?(?=^def |^class |\Z)", util_source, re.S | re.M)
        if match is None:
            raise SystemExit(f"alpa-suite: alpa/util.py of the checkout has no {name}")
        out.append(match.group(0))
    out.append(
        "\n\ndef __getattr__(name):\n    import alpa_ir.util\n    return getattr(alpa_ir.util, name)\n"
    )
    return "".join(out)


def build(alpa: Path, work: Path) -> None:
    """The work folder: Alpa's tests, the shim, Alpa's test helpers and models."""
    if not (alpa / "tests" / "shard_parallel").is_dir():
        raise SystemExit(f"alpa-suite: {alpa} is not an Alpa checkout (no tests/shard_parallel)")
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(alpa / "tests", work / "tests")
    (work / "tests" / "conftest.py").write_text(_CONFTEST)
    shim = work / "shim"
    (shim / "jax_compat.py").parent.mkdir(parents=True)
    (shim / "jax_compat.py").write_text(_JAX_COMPAT)
    for name, text in _NAMES.items():
        path = shim / "alpa" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    src = alpa / "alpa"
    for name in ("testing.py", "test_install.py", "model/bert_model.py", "model/moe.py"):
        (shim / "alpa" / name).write_text(
            (src / name)
            .read_text()
            .replace(
                "from jax.experimental.maps import FrozenDict as FrozenDictJax",
                "FrozenDictJax = dict",
            )
        )
    model_util = (src / "model" / "model_util.py").read_text()
    model_util = model_util.replace(
        "import jaxlib.xla_extension as jax_xla", "jax_xla = type('jax_xla', (), {})"
    ).replace("jax_xla.DeviceArray", "jax.Array")
    (shim / "alpa" / "model" / "model_util.py").write_text("import jax\n" + model_util)
    (shim / "alpa" / "util.py").write_text(_util_helpers((src / "util.py").read_text()))


_RESULT = re.compile(r"^(PASSED|FAILED|ERROR) (\S+)(?: - (.*))?$")


def run(work: Path, files: Sequence[str], timeout: float) -> list[tuple[str, str, str]]:
    """(outcome, test id, first error line) for every test of ``files``."""
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(work / "shim"), os.environ.get("PYTHONPATH", "")]),
        # pytest's summary fits each line to the terminal: a long test id leaves
        # no room for its reason, which then must not be another test's
        COLUMNS="1000",
    )
    rows = []
    for name in files:
        cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist",
               "-q", "-rA", "--tb=line", "--rootdir", str(work), name]  # fmt: skip
        try:
            done = subprocess.run(
                cmd, cwd=work, env=env, capture_output=True, text=True, timeout=timeout
            )
            text = done.stdout + done.stderr
        except subprocess.TimeoutExpired:
            rows.append(("ERROR", name, f"timed out after {timeout:.0f} s"))
            continue
        errors = [line[4:].strip() for line in text.splitlines() if line.startswith("E   ")]
        if f"ERROR {name}" in text.splitlines() or f"ERROR {name} " in text:
            # the file did not import: each of its tests failed
            why = errors[0] if errors else "collection error"
            rows += [("ERROR", test, why) for test in the_set(work, [name])]
            continue
        for line in text.splitlines():
            match = _RESULT.match(line)
            if match:
                outcome, test, why = match.groups()
                rows.append((outcome, test, why or (errors[0] if errors else "")))
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="alpa-suite", description=__doc__.split("\n")[0])
    parser.add_argument("--alpa", type=Path, required=True, help="an Alpa checkout")
    parser.add_argument("--work", type=Path, default=Path("alpa_suite_work"))
    parser.add_argument("--files", nargs="*", default=list(SUITE))
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per test file")
    args = parser.parse_args(argv)
    build(args.alpa, args.work)
    passed: dict[str, list[int]] = {}
    for name in args.files:  # each file's lines as soon as it has run
        rows = run(args.work, [name], args.timeout)
        results = {test: (outcome, why) for outcome, test, why in rows}
        counts = passed.setdefault(name, [0, 0])
        for test in the_set(args.work, [name]):
            # a file that timed out reports one row under its own name
            outcome, why = results.get(test) or results.get(name) or ("ERROR", "no result")
            print(f"{outcome:6s} {test}" + (f"  {why[:160]}" if outcome != "PASSED" else ""))
            counts[0] += outcome == "PASSED"
            counts[1] += 1
        sys.stdout.flush()
    for name, (n, m) in passed.items():
        print(f"{n:3d} of {m:3d}  {name}")
    total, size = (sum(c[k] for c in passed.values()) for k in (0, 1))
    print(f"{total} of {size} passed")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
