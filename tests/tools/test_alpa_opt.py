"""alpa-opt: options, split input, dumps, timing, and one clear line per bad input."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import pytest

from alpa_ir.tools import alpa_opt
from alpa_ir.tools.alpa_opt import main

FIXTURES = Path(__file__).resolve().parents[1] / "plugins_fixture"
TESTING = "--load-plugin=alpa_testing_passes"

GOOD = """\
builtin.module {
  func.func @f(%a: i32) -> i32 {
    %b = arith.addi %a, %a : i32
    func.return %b : i32
  }
}
"""


@pytest.fixture(autouse=True)
def _fixture_plugins_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(FIXTURES))


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """Run alpa-opt in this process with only the fixture plugins; (code, stdout, stderr)."""
    code = main(list(argv), builtin_plugins=False, entry_point_plugins=False)
    out, err = capsys.readouterr()
    return code, out, err


def write(tmp_path: Path, text: str, name: str = "in.mlir") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_runs_a_pipeline_on_a_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = write(tmp_path, GOOD)
    code, out, err = run(capsys, src, TESTING, "--pass-pipeline=builtin.module(test-rename-funcs)")
    assert (code, err) == (0, "")
    assert out == GOOD.replace("@f(", "@renamed_f(")
    code, out2, _ = run(capsys, src, TESTING, "-p", "test-rename-funcs{prefix=x_}")
    assert code == 0 and "@x_f(" in out2


def test_reads_stdin_and_writes_output_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "stdin", io.StringIO(GOOD))
    out_path = tmp_path / "out.mlir"
    code = main(
        ["-", "-o", str(out_path), "--load-plugin=alpa_testing_passes"],
        builtin_plugins=False,
        entry_point_plugins=False,
    )
    assert code == 0
    assert capsys.readouterr().out == ""
    assert out_path.read_text() == GOOD


def test_split_input_file_reports_file_lines_and_continues(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    broken = "builtin.module {\n  func.func @g() {\n    func.return %\n  }\n}\n"
    src = write(tmp_path, GOOD + "// -----\n" + broken + "// -----\n" + GOOD)
    code, out, err = run(capsys, src, TESTING, "--split-input-file", "-p", "test-rename-funcs")
    assert code == 1
    renamed = GOOD.replace("@f(", "@renamed_f(")
    assert out == renamed + "// -----\n// -----\n" + renamed
    assert err == f"alpa-opt: error: {src}:10:17: Expected suffix identifier after '%'\n"


def test_split_output_to_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = write(tmp_path, GOOD + "// -----\n" + GOOD)
    out_path = tmp_path / "out.mlir"
    code, out, _ = run(capsys, src, TESTING, "--split-input-file", "-o", str(out_path))
    assert (code, out) == (0, "")
    assert out_path.read_text() == GOOD + "// -----\n" + GOOD


def test_print_ir_before_and_after(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = write(tmp_path, GOOD)
    pipeline = "test-rename-funcs{prefix=a_},test-rename-funcs{prefix=b_}"
    code, _, err = run(capsys, src, TESTING, "-p", pipeline, "--print-ir-after=test-rename-funcs")
    assert code == 0
    assert err.count("// -----// IR Dump After test-rename-funcs //----- //\n") == 2
    assert "@a_f(" in err and "@b_a_f(" in err
    code, _, err = run(
        capsys,
        src,
        TESTING,
        "--load-plugin=alpa_sample_plugin",
        "-p",
        "sample-count-ops,test-rename-funcs",
        "--print-ir-before=test-rename-funcs,sample-count-ops",
        "--print-ir-after-all",
    )
    headers = [line for line in err.splitlines() if line.startswith("// -----// IR Dump")]
    assert headers == [
        "// -----// IR Dump Before sample-count-ops //----- //",
        "// -----// IR Dump After sample-count-ops //----- //",
        "// -----// IR Dump Before test-rename-funcs //----- //",
        "// -----// IR Dump After test-rename-funcs //----- //",
    ]
    code, _, err = run(capsys, src, TESTING, "-p", "test-rename-funcs", "--print-ir-before-all")
    assert err.startswith("// -----// IR Dump Before test-rename-funcs //----- //\nbuiltin.module")


def test_timing_and_debuginfo(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = write(tmp_path, GOOD)
    code, out, err = run(
        capsys, src, TESTING, "-p", "test-rename-funcs", "--timing", "--mlir-print-debuginfo"
    )
    assert code == 0
    assert f'arith.addi %a, %a : i32 loc("{src}":3:5)' in out
    names = [line.split("%)  ")[1] for line in err.splitlines() if "%)  " in line]
    assert names == ["Parser", "test-rename-funcs", "(verifier)", "Output", "Total"]
    split = write(tmp_path, GOOD + "// -----\n" + GOOD, "split.mlir")
    code, _, err = run(
        capsys,
        split,
        TESTING,
        "--split-input-file",
        "--timing",
        "-p",
        "test-rename-funcs{prefix=a_},test-rename-funcs{prefix=b_}",
    )
    names = [line.split("%)  ")[1] for line in err.splitlines() if "%)  " in line]
    assert names == [
        "Parser",
        "test-rename-funcs",
        "test-rename-funcs",
        "(verifier)",
        "Output",
        "Total",
    ]  # one row per pass of the pipeline, summed over the chunks


def test_no_verify_each_lets_broken_ir_through(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = write(tmp_path, GOOD)
    code, out, err = run(capsys, src, TESTING, "-p", "test-break-verify", "--no-verify-each")
    assert (code, err) == (0, "")
    assert "func.return" not in out
    code, out, err = run(
        capsys, src, TESTING, "-p", "test-break-verify", "--reproducer-dir", str(tmp_path / "r")
    )
    assert code == 1 and out == ""
    assert err.startswith(
        "alpa-opt: error: module does not verify after pass 'test-break-verify': "
        f"{src}:3:5: operation 'arith.addi' does not verify: "
    )


def test_list_passes_shows_summary_options_types_defaults(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, err = run(capsys, "--list-passes", TESTING)
    assert (code, err) == (0, "")
    assert "  test-fail  [plugin alpa_testing_passes]\n" in out
    assert "      Raise a RuntimeError (an internal bug of a pass).\n" in out
    assert "      message: str = boom\n" in out
    assert "      prefix: str = renamed_\n" in out


def test_every_builtin_option_has_help(capsys: pytest.CaptureFixture[str]) -> None:
    """Options are documented one way, by the docstring under the field, and
    --list-passes shows every one (inline, or wrapped under a long one)."""
    assert main(["--list-passes"], entry_point_plugins=False) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    options = [
        k
        for k, line in enumerate(lines)
        if line.startswith("      ")
        and ": " in line
        and not line.startswith("          ")
        and (" = " in line or "(required)" in line)
    ]
    assert len(options) >= 40
    undocumented = [
        lines[k].strip()
        for k in options
        if " -- " not in lines[k] and not (k + 1 < len(lines) and lines[k + 1].startswith(" " * 10))
    ]
    assert undocumented == []
    assert "      layers: int = 2  -- Number of layers to cut the forward pass into.\n" in out


def test_print_pipeline_is_canonical(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, TESTING, "-p", "test-fail, test-rename-funcs", "--print-pipeline")
    assert code == 0
    assert out == "builtin.module(test-fail{message=boom},test-rename-funcs{prefix=renamed_})\n"


def test_pass_failure_names_pass_and_reproducer(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = write(tmp_path, GOOD)
    code, _, err = run(
        capsys, src, TESTING, "-p", "test-user-error", "--reproducer-dir", str(tmp_path / "r")
    )
    [reproducer] = (tmp_path / "r").iterdir()
    assert code == 1
    assert err == (
        "alpa-opt: error: the model does not fit in memory\n"
        f"alpa-opt: note: reproducer: {reproducer}\n"
    )


BAD_IR = [
    ("builtin.module {\n  func.func @f() {\n    func.return %\n  }\n}\n", ":3:17: Expected suffix"),
    ("builtin.module {\n  foo.bar\n}\n", ":2:3: unknown dialect 'foo' in operation 'foo.bar'"),
    ("builtin.module {\n  %x = arith.nope\n}\n", ":2:8: unknown operation 'arith.nope'"),
    (GOOD.replace("-> i32 {", "-> i64 {"), ":4:5: operation 'func.return' does not verify: "),
]


@pytest.mark.parametrize(("text", "message"), BAD_IR)
def test_bad_ir_is_one_located_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, message: str
) -> None:
    src = write(tmp_path, text)
    code, out, err = run(capsys, src, TESTING)
    assert (code, out) == (1, "")
    assert err.startswith(f"alpa-opt: error: {src}{message}")
    assert err.count("\n") == 1


BAD_INVOCATIONS = [
    (["-p", "nope"], "unknown pass 'nope'; known passes: test-break-verify, test-fail, "),
    (["-p", "test-fail{msg=1}"], "unknown option 'msg' of pass 'test-fail'; its options: message"),
    (
        ["-p", "test-rename-funcs{prefix=a,b}"],
        "option 'prefix' of pass 'test-rename-funcs' expects",
    ),
    (["--pass-pipeline=builtin.module(test-fail"], "malformed pipeline at column 25: expected ')'"),
    (["--print-ir-after=nope"], "unknown pass 'nope' given to print-ir-after; known passes: "),
    (["missing.mlir"], "cannot read input file 'missing.mlir': No such file or directory"),
    (
        ["--load-plugin=alpa_broken_plugin"],
        "plugin 'alpa_broken_plugin' failed to load: "
        "RuntimeError: the sample plugin is broken on purpose",
    ),
    (
        ["--load-plugin=no_such_plugin_module"],
        "plugin 'no_such_plugin_module' failed to load: "
        "ModuleNotFoundError: No module named 'no_such_plugin_module'",
    ),
    (
        ["--import", "no_such_module_xyz:f"],
        "--import no_such_module_xyz:f: cannot import module "
        "'no_such_module_xyz': ModuleNotFoundError",
    ),
    (
        ["--import", "alpa_testing_passes:no_factory"],
        "--import alpa_testing_passes:no_factory: "
        "module 'alpa_testing_passes' has no factory 'no_factory'",
    ),
    (
        ["--import", "alpa_testing_passes:TestFail"],
        "--import alpa_testing_passes:TestFail: the "
        "factory must return (fn, example_args), got TestFail",
    ),
]


@pytest.mark.parametrize(("argv", "message"), BAD_INVOCATIONS)
def test_bad_invocations_are_one_line(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    argv: list[str],
    message: str,
) -> None:
    monkeypatch.chdir(tmp_path)
    write(tmp_path, GOOD, "in.mlir")
    if not any(a.startswith(("missing", "--import")) for a in argv):
        argv = ["in.mlir", *argv]
    code, out, err = run(capsys, *argv, TESTING)
    assert (code, out) == (1, "")
    assert err.startswith(f"alpa-opt: error: {message}")
    assert err.count("\n") == 1 and "Traceback" not in err


def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(capsys, "-p", "a", "--pass-pipeline=b")[0] == 2
    assert run(capsys, "--import", "no_colon")[0] == 2
    code, _, err = run(capsys, "x.mlir", "--import", "m:f")
    assert code == 2 and "--import replaces the input file" in err


def test_internal_error_is_one_line_with_a_hint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def explode(*args: object, **kwargs: object) -> str:
        raise ZeroDivisionError("division by zero")

    monkeypatch.setattr(alpa_opt, "print_module", explode)
    src = write(tmp_path, GOOD)
    code, _, err = run(capsys, src, TESTING)
    assert code == alpa_opt.EXIT_INTERNAL_ERROR == 70
    assert err == (
        "alpa-opt: internal error: ZeroDivisionError: division by zero "
        "(rerun with --traceback to see where)\n"
    )
    code, _, err = run(capsys, src, TESTING, "--traceback")
    assert code == 70 and err.startswith("Traceback (most recent call last):")


def test_console_script_exit_codes_without_traceback(tmp_path: Path) -> None:
    """The installed ``alpa-opt`` (built-in plugin included): a user error is one line."""
    script = Path(sys.executable).parent / "alpa-opt"
    src = write(tmp_path, "builtin.module {\n  foo.bar\n}\n")
    done = subprocess.run([str(script), src], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert done.stderr.startswith(f"alpa-opt: error: {src}:2:3: unknown dialect 'foo'")
    assert done.stderr.count("\n") == 1
    listing = subprocess.run(
        [str(script), "--list-passes"], capture_output=True, text=True, timeout=120
    )
    assert listing.returncode == 0 and "  merge-trivial-ops\n" in listing.stdout
