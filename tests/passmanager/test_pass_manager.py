"""The pass manager: order, verification, timing, IR dumps, reproducers."""

from __future__ import annotations

import gc
import io
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import pytest
from xdsl.context import Context
from xdsl.dialects import func
from xdsl.dialects.builtin import IntegerAttr, ModuleOp, StringAttr, UnitAttr
from xdsl.passes import ModulePass

from alpa_ir.errors import AlpaError, IRVerifyError, PassFailure, PipelineError
from alpa_ir.ir.collection import PLANNING_THRESHOLDS
from alpa_ir.ir.context import make_context
from alpa_ir.ir.text import parse_module, print_module
from alpa_ir.passmanager.pass_manager import VERIFIER_ROW, PassManager, format_timing_report
from alpa_ir.plugins.hookspecs import hookimpl
from alpa_ir.plugins.registry import PluginRegistry, load_registry
from alpa_ir.tools.alpa_opt import main as alpa_opt_main

FIXTURES = Path(__file__).resolve().parents[1] / "plugins_fixture"

SOURCE = """\
builtin.module {
  func.func @f(%a: i32) -> i32 {
    %b = arith.addi %a, %a : i32
    func.return %b : i32
  }
}
"""


@dataclass(frozen=True)
class AppendTrace(ModulePass):
    """Append ``mark`` to the module attribute ``trace`` (shows the order of passes)."""

    name: ClassVar[str] = "append-trace"

    mark: str = "x"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        old = op.attributes.get("trace")
        before = old.data if isinstance(old, StringAttr) else ""
        op.attributes["trace"] = StringAttr(before + self.mark)


@dataclass(frozen=True)
class RenameThenFail(ModulePass):
    """Rename the functions, then raise: the reproducer must hold the IR from before."""

    name: ClassVar[str] = "rename-then-fail"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        for nested in op.walk():
            if isinstance(nested, func.FuncOp):
                nested.sym_name = StringAttr("half_done")
        raise KeyError("missing strategy")


@dataclass(frozen=True)
class CountOps(ModulePass):
    """Record how many ops the module holds."""

    name: ClassVar[str] = "count-ops"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        op.attributes["count"] = IntegerAttr(len(list(op.walk())), 64)


@dataclass(frozen=True)
class RecordCollectionThresholds(ModulePass):
    """Record the garbage collector's thresholds while the pass runs."""

    name: ClassVar[str] = "record-gc-thresholds"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        op.attributes["gc"] = StringAttr(repr(gc.get_threshold()))


class _Plugin:
    @hookimpl
    def alpa_ir_passes(self) -> list[type[ModulePass]]:
        return [AppendTrace, RenameThenFail, CountOps, RecordCollectionThresholds]


@pytest.fixture
def registry(monkeypatch: pytest.MonkeyPatch) -> PluginRegistry:
    monkeypatch.syspath_prepend(str(FIXTURES))
    return load_registry(["alpa_testing_passes", _Plugin()], builtin=False, entry_points=False)


@pytest.fixture
def ctx(registry: PluginRegistry) -> Context:
    return make_context(registry)


def _module(ctx: Context) -> ModuleOp:
    return parse_module(SOURCE, ctx=ctx, filename="input.mlir")


def test_runs_the_passes_in_order(registry: PluginRegistry, ctx: Context) -> None:
    manager = PassManager(registry, "append-trace{mark=a},append-trace{mark=b}")
    module = manager.run(_module(ctx), ctx)
    assert module.attributes["trace"] == StringAttr("ab")
    listed = PassManager(registry, [AppendTrace("c"), AppendTrace("d")])
    assert listed.run(_module(ctx), ctx).attributes["trace"] == StringAttr("cd")
    assert listed.pipeline == "builtin.module(append-trace{mark=c},append-trace{mark=d})"


def test_passes_run_with_rare_full_collections(registry: PluginRegistry, ctx: Context) -> None:
    before = gc.get_threshold()
    try:
        gc.set_threshold(700, 10, 10)  # Python's default
        module = PassManager(registry, "record-gc-thresholds").run(_module(ctx), ctx)
        assert module.attributes["gc"] == StringAttr(repr(PLANNING_THRESHOLDS))
        assert gc.get_threshold() == (700, 10, 10)  # restored after the run
        gc.set_threshold(50_000, 10, 20)  # thresholds set higher are not lowered
        module = PassManager(registry, "record-gc-thresholds").run(_module(ctx), ctx)
        assert module.attributes["gc"] == StringAttr(repr((50_000, 10, 20)))
        assert gc.get_threshold() == (50_000, 10, 20)
        gc.set_threshold(0, 10, 20)  # automatic collection off stays off
        module = PassManager(registry, "record-gc-thresholds").run(_module(ctx), ctx)
        assert module.attributes["gc"] == StringAttr(repr((0, 10, 20)))
    finally:
        gc.set_threshold(*before)


def test_builds_its_own_context_when_none_is_given(registry: PluginRegistry, ctx: Context) -> None:
    module = PassManager(registry, "count-ops").run(_module(ctx))
    assert module.attributes["count"] == IntegerAttr(4, 64)


def test_rejects_what_is_not_a_pass_or_unknown_dump_names(registry: PluginRegistry) -> None:
    with pytest.raises(PipelineError, match="not a pass"):
        PassManager(registry, ["count-ops"])  # type: ignore[list-item]
    with pytest.raises(PipelineError, match="unknown pass 'cse' given to print-ir-after"):
        PassManager(registry, "count-ops", print_ir_after={"cse"})


def test_verify_each_names_the_pass_that_broke_the_module(
    registry: PluginRegistry, ctx: Context, tmp_path: Path
) -> None:
    manager = PassManager(registry, "count-ops,test-break-verify", reproducer_dir=tmp_path)
    with pytest.raises(IRVerifyError) as info:
        manager.run(_module(ctx), ctx)
    message = str(info.value)
    assert message.startswith(
        "module does not verify after pass 'test-break-verify': input.mlir:3:5: "
        "operation 'arith.addi' does not verify: "
    )
    assert "\n" not in message
    [reproducer] = tmp_path.iterdir()
    assert f"(reproducer: {reproducer})" in message
    unchecked = PassManager(registry, "test-break-verify", verify_each=False)
    unchecked.run(_module(ctx), ctx)  # no verification, no error


def test_verify_at_end_names_the_pass_that_broke_the_module(
    registry: PluginRegistry, ctx: Context, tmp_path: Path
) -> None:
    manager = PassManager(
        registry,
        "count-ops,test-break-verify,count-ops",
        verify_each="end",
        reproducer_dir=tmp_path,
    )
    with pytest.raises(IRVerifyError) as info:
        manager.run(_module(ctx), ctx)
    # verified once at the end, then replayed pass by pass to find the culprit
    assert str(info.value).startswith(
        "module does not verify after pass 'test-break-verify': input.mlir:3:5: "
    )
    [reproducer] = tmp_path.iterdir()
    assert "--pass-pipeline='builtin.module(test-break-verify)'" in reproducer.read_text()
    rows = PassManager(registry, "count-ops,count-ops", verify_each="end").execute(_module(ctx))
    assert [r.name for r in rows.timings] == ["count-ops", "count-ops", VERIFIER_ROW]
    with pytest.raises(PipelineError, match="verify_each must be True, False or 'end'"):
        PassManager(registry, "count-ops", verify_each="each")  # type: ignore[arg-type]


def test_the_module_is_copied_once_per_run_not_per_pass(
    registry: PluginRegistry, ctx: Context, monkeypatch: pytest.MonkeyPatch
) -> None:
    copies = []
    original = ModuleOp.clone

    def counted(self: ModuleOp, *args: object, **kwargs: object) -> ModuleOp:
        copies.append(self)
        return original(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(ModuleOp, "clone", counted)
    PassManager(registry, "count-ops,append-trace,count-ops,append-trace").run(_module(ctx), ctx)
    assert len(copies) == 1


@dataclass(frozen=True)
class PassOnce(ModulePass):
    """Passes the first time it runs and fails after (a non-deterministic pass)."""

    name: ClassVar[str] = "pass-once"
    runs: ClassVar[list[int]] = []

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        self.runs.append(1)
        if len(self.runs) > 1:
            raise KeyError("second run")


def test_a_replay_that_fails_gives_the_pipeline_level_reproducer(
    registry: PluginRegistry, ctx: Context, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(PassOnce, "runs", [])
    manager = PassManager(
        registry, [PassOnce(), CountOps(), RenameThenFail()], reproducer_dir=tmp_path
    )
    with pytest.raises(PassFailure, match="rename-then-fail") as info:
        manager.run(_module(ctx), ctx)
    text = Path(str(info.value.reproducer)).read_text()
    # replaying the passes before rename-then-fail fails in pass-once: the
    # run's input and every pass up to the failing one reproduce it instead
    assert "--pass-pipeline='builtin.module(pass-once,count-ops,rename-then-fail)'" in text
    assert "count = " not in text


def test_timing_reports_each_pass_and_the_total(registry: PluginRegistry, ctx: Context) -> None:
    stream = io.StringIO()
    manager = PassManager(registry, "count-ops,append-trace", timing=True, timing_stream=stream)
    result = manager.execute(_module(ctx), ctx)
    assert [t.name for t in result.timings] == ["count-ops", "append-trace", VERIFIER_ROW]
    assert all(t.seconds >= 0 for t in result.timings)
    report = stream.getvalue()
    assert "Execution time report" in report
    rows = re.findall(r"^\s+([\d.]+) \(\s*([\d.]+)%\)  (.+)$", report, flags=re.MULTILINE)
    assert [name for _, _, name in rows] == ["count-ops", "append-trace", VERIFIER_ROW, "Total"]
    assert rows[-1][1] == "100.0"
    assert sum(float(s) for s, _, _ in rows[:-1]) == pytest.approx(float(rows[-1][0]), abs=5e-4)


def test_timing_report_of_known_rows() -> None:
    from alpa_ir.passmanager.pass_manager import PassTiming

    report = format_timing_report([PassTiming("a", 0.75), PassTiming("b", 0.25)])
    assert "    0.7500 ( 75.0%)  a\n" in report
    assert "    0.2500 ( 25.0%)  b\n" in report
    assert "    1.0000 (100.0%)  Total\n" in report


def test_print_ir_before_and_after_named_passes(registry: PluginRegistry, ctx: Context) -> None:
    dumps: list[str] = []
    manager = PassManager(
        registry,
        "count-ops,test-rename-funcs{prefix=new_}",
        print_ir_before={"test-rename-funcs"},
        print_ir_after={"test-rename-funcs"},
        ir_printer=dumps.append,
    )
    manager.run(_module(ctx), ctx)
    before, after = dumps
    assert before.startswith("// -----// IR Dump Before test-rename-funcs //----- //\n")
    assert "@f(" in before and "count = 4" in before
    assert after.startswith("// -----// IR Dump After test-rename-funcs //----- //\n")
    assert "@new_f(" in after


def test_print_ir_after_all_to_a_stream(registry: PluginRegistry, ctx: Context) -> None:
    stream = io.StringIO()
    manager = PassManager(
        registry,
        "count-ops,append-trace",
        print_ir_after_all=True,
        print_ir_before_all=True,
        ir_printer=stream,
        debuginfo=True,
    )
    manager.run(_module(ctx), ctx)
    headers = re.findall(r"^// -----// IR Dump (\w+) ([\w-]+) //----- //$", stream.getvalue(), re.M)
    assert headers == [
        ("Before", "count-ops"),
        ("After", "count-ops"),
        ("Before", "append-trace"),
        ("After", "append-trace"),
    ]
    assert 'loc("input.mlir":3:5)' in stream.getvalue()


def test_failing_pass_raises_pass_failure_with_reproducer(
    registry: PluginRegistry, ctx: Context, tmp_path: Path
) -> None:
    manager = PassManager(registry, "count-ops,rename-then-fail", reproducer_dir=tmp_path)
    with pytest.raises(PassFailure) as info:
        manager.run(_module(ctx), ctx)
    reproducer = info.value.reproducer
    assert reproducer is not None and Path(reproducer).parent == tmp_path
    assert str(info.value) == (
        f"pass 'rename-then-fail' failed: KeyError: 'missing strategy' (reproducer: {reproducer})"
    )
    assert isinstance(info.value.__cause__, KeyError)
    text = Path(reproducer).read_text()
    assert "// alpa-opt-reproducer: --pass-pipeline='builtin.module(rename-then-fail)'" in text
    assert "@f(" in text and "half_done" not in text  # the input of the failing pass
    assert "count = 4" in text  # ... which is the output of the pass before it
    reparsed = parse_module(text, ctx=ctx)
    assert print_module(reparsed).startswith("builtin.module attributes {count = 4 : i64}")


def test_reproducer_reruns_with_alpa_opt(
    registry: PluginRegistry, ctx: Context, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    manager = PassManager(registry, 'test-fail{message="no \\"plan\\""}', reproducer_dir=tmp_path)
    with pytest.raises(PassFailure) as info:
        manager.run(_module(ctx), ctx)
    reproducer = str(info.value.reproducer)
    assert "--load-plugin=alpa_testing_passes" in Path(reproducer).read_text()
    rerun_dir = tmp_path / "again"
    # the file's plugins are not loaded from the file: the user names them
    code = alpa_opt_main(
        [reproducer, "--run-reproducer"], builtin_plugins=False, entry_point_plugins=False
    )
    assert code == 1
    assert "add --load-plugin=alpa_testing_passes" in capsys.readouterr().err
    code = alpa_opt_main(
        [
            reproducer,
            "--run-reproducer",
            "--load-plugin=alpa_testing_passes",
            "--reproducer",
            str(rerun_dir),
        ],
        builtin_plugins=False,
        entry_point_plugins=False,
    )
    assert code == 1
    err = capsys.readouterr().err
    assert err.startswith("alpa-opt: error: pass 'test-fail' failed: RuntimeError: no \"plan\"")
    [second] = rerun_dir.iterdir()
    assert second.read_text().splitlines()[3:] == Path(reproducer).read_text().splitlines()[3:]


def test_alpa_error_passes_through_with_a_reproducer_note(
    registry: PluginRegistry, ctx: Context, tmp_path: Path
) -> None:
    manager = PassManager(registry, "test-user-error", reproducer_dir=tmp_path)
    with pytest.raises(AlpaError) as info:
        manager.run(_module(ctx), ctx)
    assert type(info.value) is AlpaError
    assert str(info.value) == "the model does not fit in memory"
    [reproducer] = tmp_path.iterdir()
    assert info.value.__notes__ == [f"reproducer: {reproducer}"]


def test_no_reproducer_when_disabled(
    registry: PluginRegistry, ctx: Context, tmp_path: Path
) -> None:
    manager = PassManager(registry, "test-fail", reproducer_dir=tmp_path, crash_reproducer=False)
    with pytest.raises(PassFailure) as info:
        manager.run(_module(ctx), ctx)
    assert str(info.value) == "pass 'test-fail' failed: RuntimeError: boom"
    assert info.value.reproducer is None
    assert not list(tmp_path.iterdir())


def test_unwritable_reproducer_dir_does_not_hide_the_error(
    registry: PluginRegistry, ctx: Context, tmp_path: Path
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    manager = PassManager(registry, "test-fail", reproducer_dir=blocker / "sub")
    with pytest.raises(
        PassFailure,
        match=r"^pass 'test-fail' failed: RuntimeError: boom \("
        r"reproducer not written: (FileExistsError|NotADirectoryError): ",
    ):
        manager.run(_module(ctx), ctx)


def test_progress_is_called_before_each_pass(registry: PluginRegistry, ctx: Context) -> None:
    seen: list[tuple[int, int, str]] = []
    manager = PassManager(
        registry, "count-ops,append-trace", progress=lambda i, n, p: seen.append((i, n, p.name))
    )
    manager.run(_module(ctx), ctx)
    assert seen == [(1, 2, "count-ops"), (2, 2, "append-trace")]


def test_pass_statistics_leave_the_ir_and_two_runs_print_the_same_module(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Solve times and ILP sizes are pass statistics (--pass-statistics), not
    attributes: planning the same module twice prints the same text."""

    source = tmp_path / "mlp.mlir"
    source.write_text(_MLP_FOR_STATISTICS)
    pipeline = "auto-sharding{mesh-shape=1,4}"
    outputs = []
    for _ in range(2):
        assert alpa_opt_main([str(source), "-p", pipeline, "--pass-statistics"]) == 0
        out, err = capsys.readouterr()
        outputs.append(out)
        assert "solve_time" not in out and "num_nodes" not in out
        assert "Pass statistics report" in err
        assert re.search(r"auto-sharding\n(  \(S\) .*\n)*  \(S\) +\d+ num-nodes", err)
        assert re.search(r"\(S\) +[\d.e-]+ solve-time - seconds in the ILP solver", err)
    assert outputs[0] == outputs[1]


_MLP_FOR_STATISTICS = """\
builtin.module {
  func.func @main(%x: tensor<8x256xf32>, %w1: tensor<256x1024xf32>) -> tensor<8x1024xf32> {
    %0 = lax.dot_general %x, %w1 {dimension_numbers = #lax.dot<lhs_contracting = [1], rhs_contracting = [0], lhs_batch = [], rhs_batch = []>, preferred_element_type = f32} : (tensor<8x256xf32>, tensor<256x1024xf32>) -> tensor<8x1024xf32>
    %1 = lax.tanh %0 : (tensor<8x1024xf32>) -> tensor<8x1024xf32>
    func.return %1 : tensor<8x1024xf32>
  }
}
"""


def test_a_snapshot_given_by_the_caller_is_the_reproducers_input(
    registry: PluginRegistry, ctx: Context, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``execute(..., snapshot=)``: the caller's unchanged copy (plan_pipeshard
    keeps one of the imported step) stands for the module as it was; the
    manager copies nothing of its own."""
    module = _module(ctx)
    snapshot = module.clone()
    snapshot.attributes["from_the_snapshot"] = UnitAttr()
    clones: list[ModuleOp] = []
    real_clone = ModuleOp.clone

    def counting_clone(self: ModuleOp, *args: Any, **kwargs: Any) -> ModuleOp:
        clones.append(self)
        return real_clone(self, *args, **kwargs)

    manager = PassManager(registry, "count-ops,rename-then-fail", reproducer_dir=tmp_path)
    monkeypatch.setattr(ModuleOp, "clone", counting_clone)
    with pytest.raises(PassFailure) as info:
        manager.execute(module, ctx, snapshot=snapshot)
    assert module not in clones  # the reproducer replays copies of the snapshot
    text = Path(str(info.value.reproducer)).read_text()
    assert "from_the_snapshot" in text and "count = 4" in text
