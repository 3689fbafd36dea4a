"""Third-party plugins: --load-plugin, entry-point discovery, broken and clashing plugins.

The sample plugin lives in tests/plugins_fixture/ (a package with its own
pyproject.toml). Entry-point discovery is tested in a subprocess that sees a
hand-written ``*.dist-info`` (what ``pip install`` would create) on its path.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from alpa_ir.plugins.registry import PluginLoadError, load_registry
from alpa_ir.tools.alpa_opt import main

FIXTURES = Path(__file__).resolve().parents[1] / "plugins_fixture"
ALPA_OPT = Path(sys.executable).parent / "alpa-opt"

FUNC_IR = """\
builtin.module {
  func.func @f() {
    func.return
  }
  func.func @g() {
    func.return
  }
}
"""


@pytest.fixture(autouse=True)
def _fixture_plugins_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(FIXTURES))


def _fake_install(tmp_path: Path, entry_points: dict[str, str]) -> Path:
    """A site folder holding the metadata pip would write for the fixture package."""
    site = tmp_path / "site"
    dist = site / "alpa_sample_plugin-0.1.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: alpa-sample-plugin\nVersion: 0.1.0\n"
    )
    lines = "".join(f"{name} = {target}\n" for name, target in entry_points.items())
    (dist / "entry_points.txt").write_text("[alpa_ir]\n" + lines)
    return site


def _alpa_opt(site: Path, *argv: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(site), str(FIXTURES)])
    return subprocess.run(
        [str(ALPA_OPT), *argv], input=stdin, capture_output=True, text=True, env=env, timeout=120
    )


def test_registry_loads_a_plugin_by_module_name() -> None:
    registry = load_registry(["alpa_sample_plugin"], builtin=False, entry_points=False)
    assert "sample-count-ops" in registry.passes
    assert registry.owners[("passes", "sample-count-ops")] == "alpa_sample_plugin"
    assert registry.explicit_plugins == ("alpa_sample_plugin",)


def test_load_plugin_lists_and_runs_its_pass(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plugin = "--load-plugin=alpa_sample_plugin"
    assert main(["--list-passes", plugin], builtin_plugins=False, entry_point_plugins=False) == 0
    listing = capsys.readouterr().out
    assert "  sample-count-ops  [plugin alpa_sample_plugin]\n" in listing
    assert "      prefix: str = sample  -- prefix of the attribute name\n" in listing
    src = tmp_path / "in.mlir"
    src.write_text(FUNC_IR)
    argv = [str(src), plugin, "-p", "sample-count-ops{prefix=n}"]
    assert main(argv, builtin_plugins=False, entry_point_plugins=False) == 0
    assert capsys.readouterr().out.startswith("builtin.module attributes {n.op_count = 4 : i64}")


def test_entry_point_plugin_is_discovered(tmp_path: Path) -> None:
    site = _fake_install(tmp_path, {"sample": "alpa_sample_plugin"})
    listing = _alpa_opt(site, "--list-passes")
    assert listing.returncode == 0, listing.stderr
    assert "  sample-count-ops  [plugin sample]\n" in listing.stdout
    assert "  merge-trivial-ops\n" in listing.stdout  # the built-in passes are still there
    done = _alpa_opt(site, "-", "-p", "sample-count-ops", stdin=FUNC_IR)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("builtin.module attributes {sample.op_count = 4 : i64}")


def test_broken_entry_point_plugin_warns_and_the_tool_still_works(tmp_path: Path) -> None:
    site = _fake_install(tmp_path, {"broken": "alpa_broken_plugin", "sample": "alpa_sample_plugin"})
    listing = _alpa_opt(site, "--list-passes")
    assert listing.returncode == 0
    assert listing.stderr == (
        "alpa-opt: warning: plugin 'broken' (RuntimeError: the sample plugin is broken on "
        "purpose) failed to load; skipped\n"
    )
    assert "  sample-count-ops  [plugin sample]\n" in listing.stdout
    done = _alpa_opt(site, "-", "-p", "sample-count-ops", stdin=FUNC_IR)
    assert done.returncode == 0 and "sample.op_count = 4" in done.stdout
    missing = _alpa_opt(site, "-", "-p", "broken-pass", stdin=FUNC_IR)
    assert missing.returncode == 1
    error = missing.stderr.splitlines()[-1]
    assert error.startswith("alpa-opt: error: unknown pass 'broken-pass'; known passes: ")
    assert error.endswith(
        "(plugins that failed to load: 'broken' (RuntimeError: the sample "
        "plugin is broken on purpose))"
    )


def test_broken_plugin_loaded_on_request_is_an_error() -> None:
    with pytest.raises(PluginLoadError) as info:
        load_registry(["alpa_broken_plugin"], builtin=False, entry_points=False)
    assert str(info.value) == (
        "plugin 'alpa_broken_plugin' failed to load: RuntimeError: the sample plugin is broken "
        "on purpose"
    )


def test_duplicate_pass_names_name_both_plugins(capsys: pytest.CaptureFixture[str]) -> None:
    message = (
        "pass 'sample-count-ops' is contributed twice: by plugin 'alpa_sample_plugin' and by "
        "plugin 'alpa_duplicate_plugin'"
    )
    with pytest.raises(PluginLoadError) as info:
        load_registry(
            ["alpa_sample_plugin", "alpa_duplicate_plugin"], builtin=False, entry_points=False
        )
    assert str(info.value) == message
    argv = [
        "--list-passes",
        "--load-plugin=alpa_sample_plugin",
        "--load-plugin=alpa_duplicate_plugin",
    ]
    assert main(argv, builtin_plugins=False, entry_point_plugins=False) == 1
    assert capsys.readouterr().err == f"alpa-opt: error: {message}\n"


def test_duplicate_between_entry_point_and_load_plugin(tmp_path: Path) -> None:
    site = _fake_install(tmp_path, {"sample": "alpa_sample_plugin"})
    done = _alpa_opt(site, "--list-passes", "--load-plugin=alpa_duplicate_plugin")
    assert done.returncode == 1
    assert done.stderr == (
        "alpa-opt: error: pass 'sample-count-ops' is contributed twice: by plugin 'sample' "
        "and by plugin 'alpa_duplicate_plugin'\n"
    )


CUSTOM_PRIMITIVE_IR = """\
builtin.module {
  func.func @main(%w: tensor<256x256xf32>, %x: tensor<512x256xf32>) -> tensor<512x256xf32> {
    %0 = lax.dot_general %x, %w {dimension_numbers = #lax.dot<lhs_contracting = [1], rhs_contracting = [0], lhs_batch = [], rhs_batch = []>, preferred_element_type = f32} : (tensor<512x256xf32>, tensor<256x256xf32>) -> tensor<512x256xf32>
    %1 = lax.primitive "row_scale" %0 {params = {}} : (tensor<512x256xf32>) -> tensor<512x256xf32>
    %2 = lax.dot_general %1, %w {dimension_numbers = #lax.dot<lhs_contracting = [1], rhs_contracting = [0], lhs_batch = [], rhs_batch = []>, preferred_element_type = f32} : (tensor<512x256xf32>, tensor<256x256xf32>) -> tensor<512x256xf32>
    func.return %2 : tensor<512x256xf32>
  }
}
"""


def _custom_op_line(out: str) -> str:
    return next(line for line in out.splitlines() if '"row_scale"' in line)


def test_a_plugins_sharding_rule_changes_the_plan(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without a rule the custom primitive runs replicated (and says so), which
    under the memory budget costs communication; the plugin's rule lets
    auto-sharding split it, which lowers the objective."""
    pipeline = "--pass-pipeline=auto-sharding{mesh-shape=8 memory-budget=1500000}"

    def plan(*extra: str) -> tuple[str, str]:
        monkeypatch.setattr(sys, "stdin", __import__("io").StringIO(CUSTOM_PRIMITIVE_IR))
        assert main([pipeline, *extra]) == 0
        captured = capsys.readouterr()
        return captured.out, captured.err

    with pytest.warns(UserWarning, match="no sharding rule for primitive 'row_scale'"):
        without, _ = plan()
    with_rule, _ = plan("--load-plugin=alpa_rule_plugin")
    assert "[R, R]" in _custom_op_line(without)
    assert "[S0, R]" in _custom_op_line(with_rule) or "[R, S0]" in _custom_op_line(with_rule)

    def objective(out: str) -> float:
        return float(out.split("sharding.objective = ")[1].split(" ")[0].rstrip(",}:"))

    assert objective(with_rule) < objective(without)


def test_construct_stages_finds_a_plugins_cluster_preset(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The pass uses the caller's registry: a preset from --load-plugin is found."""
    source = str(
        Path(__file__).resolve().parents[1] / "filecheck" / "alpa-opt" / "construct-stages.mlir"
    )
    pipeline = "cluster-operators{layers=2},construct-stages{cluster=lab-2x4 progress=false}"
    assert main([source, "-p", pipeline]) == 1
    assert "unknown cluster preset 'lab-2x4'" in capsys.readouterr().err
    assert main([source, "-p", pipeline, "--load-plugin=alpa_cluster_plugin"]) == 0
    out = capsys.readouterr().out
    assert 'mesh.cluster @"lab-2x4" {levels = [#mesh.level<"node" x 2' in out


def test_listing_passes_imports_no_pass_jax_or_solver() -> None:
    """The registry names built-in passes, dialects, backends and solvers
    lazily: `alpa-opt --list-passes` reads the passes' options from source."""
    code = (
        "import sys\n"
        "from alpa_ir.tools.alpa_opt import main\n"
        "assert main(['--list-passes']) == 0\n"
        "loaded = [m for m in sys.modules if m in ('jax', 'mip', 'highspy')"
        " or m.startswith('alpa_ir.passes.') or m.startswith('alpa_ir.dialects.')]\n"
        "print('LOADED', sorted(loaded))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    assert "auto-sharding" in done.stdout and "shard-stages" in done.stdout
    assert done.stdout.rstrip().endswith("LOADED []")


def test_a_lazy_pass_is_listed_as_its_class_reads() -> None:
    """Reading a built-in pass from source gives what importing it gives."""
    from alpa_ir.passmanager.pass_options import format_value, pass_options, type_text
    from alpa_ir.passmanager.pass_source import read_pass_source
    from alpa_ir.plugins.contributions import Lazy
    from alpa_ir.plugins.registry import default_registry
    from alpa_ir.tools.pass_listing import pass_summary

    registry = default_registry()
    for name, entry in registry.passes.items():
        assert isinstance(entry, Lazy)
        cls = entry.load()
        assert cls.name == name
        source = read_pass_source(entry.module, entry.attribute)
        assert source.summary == pass_summary(cls), name
        want = [
            (o.name, type_text(o.type), o.required, format_value(o.default, o.type), o.help)
            for o in pass_options(cls)
        ]
        got = [
            (o.name, type_text(o.type), o.required, format_value(o.default, o.type), o.help)
            for o in source.options
        ]
        assert got == want, name
