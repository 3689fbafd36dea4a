"""alpa-suite builds a name-only shim over alpa_ir and a JAX 0.3 layer, and
runs test files from an Alpa checkout; here on a checkout written by the test
(Alpa's own files are not kept in this repository)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

from alpa_ir.tools.alpa_suite import OUT_OF_SET, SUITE, build, main, run, the_set

_UTIL = """
def count_communication_primitives(hlo_ir, ignore_scalar_all_reduce=False):
    return hlo_ir.count("all-reduce(")


def map_to_shape(array_pytree: PyTreeDef):
    return tree_map(lambda x: getattr(x, "shape", None), array_pytree)


def other():
    pass
"""

_TEST = """
import unittest

import jax
import numpy as np
from jax.interpreters.pxla import Chunked, NoSharding, Replicated, ShardedAxis, ShardingSpec
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from alpa import LocalPhysicalDeviceMesh, ShardParallel, parallelize
from alpa.shard_parallel.auto_sharding import AutoShardingOption
from alpa.util import map_to_shape


class T(unittest.TestCase):
    def test_names_are_alpa_irs(self):
        import alpa_ir

        assert ShardParallel is alpa_ir.ShardParallel
        assert AutoShardingOption is alpa_ir.AutoShardingOption
        assert map_to_shape({"a": np.ones((2, 3))}) == {"a": (2, 3)}

    def test_sharding_spec_as_alpa(self):
        mesh = Mesh(np.array(jax.devices()[:4]).reshape(2, 2), ("a", "b"))
        x = jax.device_put(np.zeros((8, 8)), NamedSharding(mesh, P(None, "b")))
        assert x.sharding_spec.sharding == (NoSharding(), Chunked([2]))
        assert x.sharding_spec.mesh_mapping == (Replicated(2), ShardedAxis(0))
        # built with keywords, as Alpa's test_donate_buffer builds one
        assert x.sharding_spec == ShardingSpec(
            sharding=(NoSharding(), Chunked([2])), mesh_mapping=(Replicated(2), ShardedAxis(0))
        )

    def test_fails(self):
        assert False, "a failing test is reported"
"""


def _checkout(root: Path) -> Path:
    (root / "tests" / "shard_parallel").mkdir(parents=True)
    (root / "tests" / "shard_parallel" / "test_x.py").write_text(_TEST)
    (root / "alpa" / "model").mkdir(parents=True)
    for name in ("testing.py", "test_install.py", "model/bert_model.py", "model/moe.py"):
        (root / "alpa" / name).write_text("")
    (root / "alpa" / "model" / "model_util.py").write_text(
        "import jaxlib.xla_extension as jax_xla\nArray = jax_xla.DeviceArray\n"
    )
    (root / "alpa" / "util.py").write_text(textwrap.dedent(_UTIL))
    return root


def test_alpa_tests_run_unchanged_through_the_shim(tmp_path: Path) -> None:
    work = tmp_path / "work"
    build(_checkout(tmp_path / "alpa"), work)
    util = (work / "shim" / "alpa" / "util.py").read_text()
    assert "def count_communication_primitives" in util and "def other" not in util
    rows = run(work, ["tests/shard_parallel/test_x.py"], timeout=600)
    outcomes = {test.rsplit("::", 1)[-1]: outcome for outcome, test, _ in rows}
    assert outcomes == {
        "test_names_are_alpa_irs": "PASSED",
        "test_sharding_spec_as_alpa": "PASSED",
        "test_fails": "FAILED",
    }, rows


_LONG_IDS = """
import unittest


class AVeryLongTestCaseNameAsAlpasOwnFollowParallelTest(unittest.TestCase):
    def test_the_first_failure_with_a_long_name(self):
        raise ValueError("the first reason")

    def test_the_second_failure_with_a_long_name(self):
        raise KeyError("the second reason")
"""


def test_each_failure_is_reported_with_its_own_reason(tmp_path: Path) -> None:
    """Test ids longer than a terminal line (Alpa's runtime tests): each row
    keeps its own reason, not the first error line of its file."""
    alpa = _checkout(tmp_path / "alpa")
    (alpa / "tests" / "shard_parallel" / "test_x.py").write_text(_LONG_IDS)
    work = tmp_path / "work"
    build(alpa, work)
    rows = run(work, ["tests/shard_parallel/test_x.py"], timeout=600)
    why = {test.rsplit("::", 1)[-1]: reason for _, test, reason in rows}
    assert "the first reason" in why["test_the_first_failure_with_a_long_name"], rows
    assert "the second reason" in why["test_the_second_failure_with_a_long_name"], rows


def test_a_folder_without_alpa_tests_is_refused(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "alpa_ir.tools.alpa_suite", "--alpa", str(tmp_path)],
        capture_output=True,
        text=True,
    )
    assert done.returncode != 0
    assert "is not an Alpa checkout" in done.stderr


_SKIPS = """
import unittest

import jax


class A(unittest.TestCase):
    def test_kept(self):
        pass

    @unittest.skip(
        "Alpa skips it itself")
    def test_skipped(self):
        pass

    @unittest.skipIf(jax.device_count('gpu') < 8, "no enough device")
    def test_eight_gpus(self):
        pass


class B(A):
    def test_distributed_array(self):
        pass
"""


def test_the_set_leaves_out_skipped_gpu_and_internal_tests(tmp_path: Path) -> None:
    folder = tmp_path / "tests" / "runtime"
    folder.mkdir(parents=True)
    (folder / "test_device_mesh.py").write_text(
        _SKIPS.replace("class B(A)", "class DeviceMeshTest(A)")
    )
    assert the_set(tmp_path, ["tests/runtime/test_device_mesh.py"]) == [
        "tests/runtime/test_device_mesh.py::A::test_kept"
    ]
    # every file of the set is named once, and none of them is also out of it
    assert len(set(SUITE)) == len(SUITE) and not set(SUITE) & set(OUT_OF_SET)


def test_a_gpu_skip_condition_imports_on_cpu(tmp_path: Path) -> None:
    alpa = _checkout(tmp_path / "alpa")
    (alpa / "tests" / "shard_parallel" / "test_x.py").write_text(_SKIPS)
    work = tmp_path / "work"
    build(alpa, work)
    rows = run(work, ["tests/shard_parallel/test_x.py"], timeout=600)
    assert sorted((test.rsplit("::", 1)[-1], outcome) for outcome, test, _ in rows) == [
        ("test_distributed_array", "PASSED"),
        ("test_kept", "PASSED"),
        ("test_kept", "PASSED"),
    ], rows


def test_the_tool_counts_over_the_set(tmp_path: Path, capsys: Any) -> None:
    alpa = _checkout(tmp_path / "alpa")
    args = ["--alpa", str(alpa), "--work", str(tmp_path / "work")]
    assert main([*args, "--files", "tests/shard_parallel/test_x.py"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert any(
        line.startswith("FAILED tests/shard_parallel/test_x.py::T::test_fails ") for line in out
    )
    assert out[-2:] == ["  2 of   3  tests/shard_parallel/test_x.py", "2 of 3 passed"]
