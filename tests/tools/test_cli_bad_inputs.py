"""Bad command lines of alpa-bench, alpa-p2 and alpa-demo: each is rejected at
once (no benchmark, no compilation) with a non-zero exit status and one line
that names the option and the value, never a traceback; and the good ones
still pass the same checks."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence

import pytest

import alpa_ir.models
from alpa_ir.tools import alpa_bench, alpa_p2, bench_suite, demo
from alpa_ir.tools.bench_suite import SUITES

pytestmark = pytest.mark.bad_input


Main = Callable[[list[str]], int]
TOOLS: dict[str, Main] = {
    "alpa-bench": alpa_bench.main,
    "alpa-p2": alpa_p2.main,
    "alpa-demo": demo.main,
}
P2 = ["--system", "gcp-a100-16x4", "--axes", "4,16", "--reduce", "1"]
TINY = ["--models", "mlp-tiny", "--cluster", "local-cpu", "--micro-batches", "2"]


@pytest.fixture(scope="module", autouse=True)
def _warm() -> Iterator[None]:
    """Load what the checks read (model zoo, cluster presets, plugins) and start
    JAX on conftest's 8 CPU devices once for the module (and
    alpa-demo in this process finds JAX running: its XLA_FLAGS stay untouched)."""
    import jax

    from alpa_ir.hardware.clusters import builtin_presets
    from alpa_ir.models.registry import list_configs
    from alpa_ir.plugins.registry import default_registry

    assert jax.device_count() == 8
    builtin_presets()
    list_configs()
    default_registry()
    yield


def _run(
    capsys: pytest.CaptureFixture[str], tool: str, argv: Sequence[str]
) -> tuple[int, str, str]:
    try:
        code = TOOLS[tool](list(argv))
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else 1
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _no_work(*args: object, **kwargs: object) -> None:
    raise AssertionError("the real work started before the command line was checked")


@pytest.fixture
def work_forbidden(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every tool's real work (tracing, planning, synthesis, compiling) fails the
    test: a bad command line is rejected before any of it starts."""
    monkeypatch.setattr(bench_suite, "trace", _no_work)
    monkeypatch.setattr(bench_suite, "bench_model", _no_work)
    monkeypatch.setattr(alpa_bench, "bench_model", _no_work)
    monkeypatch.setattr(alpa_p2, "explore", _no_work)
    monkeypatch.setattr(alpa_ir.models, "make_train_step", _no_work)


BAD: list[tuple[str, list[str], str]] = [
    # alpa-bench
    ("alpa-bench", ["--micro-batches", "0"], r"--micro-batches must be .*'auto', got '0'"),
    ("alpa-bench", ["--micro-batches", "abc"], r"--micro-batches must be .*, got 'abc'"),
    ("alpa-bench", ["--micro-batches=-4"], r"--micro-batches must be .*, got '-4'"),
    ("alpa-bench", ["--micro-batches", "3"], r"--micro-batches 3 does not divide .*gpt3-350m"),
    ("alpa-bench", ["--models", "mlp-tiny"], r"--micro-batches 16 does not divide .*mlp-tiny"),
    ("alpa-bench", ["--figure", "scaling.pdf"], r"--figure must name a \.png or \.svg file"),
    ("alpa-bench", ["--figure", "/no/such/dir/f.png"], r"folder /no/such/dir does not exist"),
    ("alpa-bench", ["--gpus", "0"], r"--gpus must be a positive integer, got '0'"),
    ("alpa-bench", ["--gpus", "-8"], r"--gpus must be a positive integer, got '-8'"),
    ("alpa-bench", ["--gpus", "2.5"], r"--gpus must be a positive integer, got '2\.5'"),
    (
        "alpa-bench",
        ["--gpus", "100000"],
        r"--gpus 100000: .* the search that scales plans it, and it cannot: .*12500 nodes",
    ),
    (
        "alpa-bench",
        ["--gpus", "1024", "--micro-batches", "auto"],
        r"--micro-batches auto: .*1024 GPUs .*at most 648 GPUs .*search that scales",
    ),
    ("alpa-bench", ["--gpus", "3"], r"--gpus 3: .*power-of-two"),
    ("alpa-bench", ["--gpus", "12"], r"--gpus 12: .*not a whole number of nodes of 8"),
    (
        "alpa-bench",
        ["--cluster", "gcp-a100-16x4", "--gpus", "128"],
        r"--gpus 128: .*'gcp-a100-16x4' has 4 nodes, got 8",
    ),
    ("alpa-bench", [*TINY, "--gpus", "16"], r"--gpus 16: .*'local-cpu' is one node"),
    ("alpa-bench", ["--cluster", "nope"], r"--cluster: unknown cluster preset 'nope'"),
    (
        "alpa-bench",
        ["--cluster", "gcp-a100-16x2"],
        r"--cluster gcp-a100-16x2 cannot run gpt3-6\.7b on its 16 GPUs",
    ),
    ("alpa-bench", ["--epsilon", "-1"], r"--epsilon must be a finite number >= 0, got '-1'"),
    ("alpa-bench", ["--epsilon", "nan"], r"--epsilon must be .*, got 'nan'"),
    ("alpa-bench", ["--epsilon", "inf"], r"--epsilon must be .*, got 'inf'"),
    ("alpa-bench", ["--time-limit", "-5"], r"--time-limit must be a positive .*, got '-5'"),
    ("alpa-bench", ["--time-limit", "0"], r"--time-limit must be a positive .*, got '0'"),
    ("alpa-bench", ["--time-limit", "nan"], r"--time-limit must be a positive .*, got 'nan'"),
    ("alpa-bench", ["--max-micro-batches", "0"], r"--max-micro-batches must be .*, got '0'"),
    (
        "alpa-bench",
        ["--max-micro-batches", "8"],
        r"--max-micro-batches 8 applies only with --micro-batches auto",
    ),
    ("alpa-bench", ["--layers", "0"], r"--layers must be 'auto' or a positive integer, got '0'"),
    ("alpa-bench", ["--layers", "zero"], r"--layers must be .*, got 'zero'"),
    ("alpa-bench", ["--workers", "0"], r"--workers must be a positive integer, got '0'"),
    ("alpa-bench", ["--workers", "100000"], r"--workers must be at most .*, got 100000"),
    (
        "alpa-bench",
        ["--suite", "moe", "--models", "gpt3-350m"],
        r"--models 'gpt3-350m' is not a size of --suite moe \(gpt3-350m is a size of suite gpt3",
    ),
    (
        "alpa-bench",
        ["--suite", "gpt3", "--models", "mlp-tiny"],
        r"--models 'mlp-tiny' is not a size of --suite gpt3 \(mlp-tiny is in no suite",
    ),
    ("alpa-bench", ["--suite", "bert"], r"--suite: invalid choice: 'bert'"),
    ("alpa-bench", ["--models", "nope"], r"--models: unknown model 'nope'; known: .*gpt3-39b"),
    ("alpa-bench", ["--models", ""], r"--models must name at least one model, got ''"),
    ("alpa-bench", ["--models", "gpt3-350m,,gpt3-1.3b"], r"--models has an empty name in '"),
    ("alpa-bench", ["--models", "gpt3-350m,gpt3-350m"], r"--models names 'gpt3-350m' twice"),
    ("alpa-bench", ["--cost-mode", "fast"], r"--cost-mode: invalid choice: 'fast'"),
    ("alpa-bench", ["--submesh-space", "2d"], r"--submesh-space: invalid choice: '2d'"),
    ("alpa-bench", ["--gpus", "2", "--gpus", "4"], r"--gpus given twice .*--gpus 2, then --gpus 4"),
    ("alpa-bench", ["--remat", "--no-remat"], r"--remat and --no-remat contradict each other"),
    ("alpa-bench", ["--gpus"], r"--gpus expects a value"),
    ("alpa-bench", ["--bogus", "1"], r"unrecognized arguments: --bogus 1"),
    # alpa-p2
    ("alpa-p2", [*P2, "--bytes", "inf"], r"--bytes must be a positive finite number, got 'inf'"),
    ("alpa-p2", [*P2, "--bytes", "nan"], r"--bytes must be .*, got 'nan'"),
    ("alpa-p2", [*P2, "--bytes", "-1"], r"--bytes must be .*, got '-1'"),
    ("alpa-p2", [*P2, "--bytes", "0"], r"--bytes must be .*, got '0'"),
    ("alpa-p2", [*P2, "--bytes", "1e400"], r"--bytes must be .*, got '1e400'"),
    ("alpa-p2", [*P2, "--top", "-1"], r"--top must be an integer >= 0, got '-1'"),
    ("alpa-p2", [*P2, "--top", "x"], r"--top must be an integer >= 0, got 'x'"),
    ("alpa-p2", [*P2, "--max-size", "0"], r"--max-size must be a positive integer, got '0'"),
    ("alpa-p2", [*P2, "--max-size", "50"], r"--max-size must be between 1 and \d+, got 50"),
    ("alpa-p2", [*P2, "--algorithm", "star"], r"--algorithm: invalid choice: 'star'"),
    ("alpa-p2", [*P2[:4], "--reduce", "1,1"], r"--reduce 1,1: axis 1 is named twice"),
    ("alpa-p2", [*P2[:4], "--reduce", "5"], r"--reduce 5: axis 5 is out of range for --axes 4,16"),
    ("alpa-p2", [*P2[:4], "--reduce=-1"], r"--reduce must be .*integers >= 0, got '-1'"),
    ("alpa-p2", [*P2[:4], "--reduce", ""], r"--reduce must be .*, got ''"),
    ("alpa-p2", [*P2[:4], "--reduce", "one"], r"--reduce must be .*, got 'one'"),
    ("alpa-p2", [*P2[:4]], r"required: --reduce"),
    ("alpa-p2", [*P2[:2], "--axes", "0,64", *P2[4:]], r"--axes must be .*positive .*'0,64'"),
    ("alpa-p2", [*P2[:2], "--axes=-4,-16", *P2[4:]], r"--axes must be .*, got '-4,-16'"),
    ("alpa-p2", [*P2[:2], "--axes", "-4,-16", *P2[4:]], r"--axes expects a value, .*'-4,-16'"),
    ("alpa-p2", [*P2[:2], "--axes", "4,,16", *P2[4:]], r"--axes must be .*, got '4,,16'"),
    ("alpa-p2", [*P2[:2], "--axes", "4.0,16", *P2[4:]], r"--axes must be .*, got '4\.0,16'"),
    ("alpa-p2", [*P2[:2], "--axes", "3,16", *P2[4:]], r"--axes 3,16 has 48 devices .* has 64"),
    ("alpa-p2", ["--system", "nope", *P2[2:]], r"--system: unknown system 'nope'; known: gcp"),
    ("alpa-p2", ["--system", "custom-0x4", *P2[2:]], r"--system: unknown system 'custom-0x4'"),
    ("alpa-p2", ["--system", "custom-\u00b2", *P2[2:]], r"--system: unknown system 'custom-"),
    (
        "alpa-p2",
        ["--system", "custom-1000x1000", "--axes", "1000,1000", "--reduce", "1"],
        r"--system custom-1000x1000: 1000000 devices is more than",
    ),
    # alpa-demo
    ("alpa-demo", ["--devices", "0"], r"--devices must be a positive integer, got '0'"),
    ("alpa-demo", ["--devices", "-1"], r"--devices must be a positive integer, got '-1'"),
    ("alpa-demo", ["--devices", "abc"], r"--devices must be a positive integer, got 'abc'"),
    ("alpa-demo", ["--devices", "2000"], r"--devices must be at most \d+, got 2000"),
    ("alpa-demo", ["--devices", "6", "--stages", "4"], r"--stages 4 cannot split --devices 6"),
    ("alpa-demo", ["--stages", "16"], r"--stages 16 cannot split --devices 8"),
    ("alpa-demo", ["--hosts", "2"], r"--hosts needs --cluster ray"),
    ("alpa-demo", ["--address", "127.0.0.1:1"], r"--address needs --cluster ray"),
    (
        "alpa-demo",
        ["--cluster", "ray", "--hosts", "2", "--address", "127.0.0.1:1"],
        r"--hosts starts a cluster on this machine; --address joins one",
    ),
    (
        "alpa-demo",
        ["--cluster", "ray", "--hosts", "4"],
        r"--hosts 4 must divide --devices 8 and be at most --stages 2",
    ),
    ("alpa-demo", ["--cluster", "slurm"], r"--cluster: invalid choice: 'slurm'"),
    ("alpa-demo", ["--stages", "0"], r"--stages must be a positive integer, got '0'"),
    ("alpa-demo", ["--steps", "0"], r"--steps must be a positive integer, got '0'"),
    ("alpa-demo", ["--steps", "-3"], r"--steps must be a positive integer, got '-3'"),
    ("alpa-demo", ["--steps", "1.5"], r"--steps must be a positive integer, got '1\.5'"),
    ("alpa-demo", ["--model", "gpt3-39b"], r"--model: invalid choice: 'gpt3-39b'"),
    ("alpa-demo", ["--model", "nope"], r"--model: invalid choice: 'nope'"),
    ("alpa-demo", ["--micro-batches", "0"], r"--micro-batches must be a positive integer, got '0'"),
    ("alpa-demo", ["--micro-batches", "3"], r"--micro-batches 3 does not divide .*gpt-tiny"),
    ("alpa-demo", ["--micro-batches", "16"], r"--micro-batches 16 does not divide .*gpt-tiny"),
    # JAX already runs in this process with 8 devices: the count cannot change any more
    ("alpa-demo", ["--devices", "4"], r"--devices 4 cannot take effect: JAX already runs"),
]


def _case_id(case: tuple[str, list[str], str]) -> str:
    tool, argv, _ = case
    return f"{tool} {' '.join(argv)}"


@pytest.mark.parametrize(("tool", "argv", "pattern"), BAD, ids=[_case_id(c) for c in BAD])
def test_bad_input_is_one_clean_line(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    work_forbidden: None,
    tool: str,
    argv: list[str],
    pattern: str,
) -> None:
    monkeypatch.setenv("XLA_FLAGS", os.environ.get("XLA_FLAGS", ""))  # restored afterwards
    code, out, err = _run(capsys, tool, argv)
    assert code != 0
    assert "Traceback" not in out + err
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"{tool}: error: ")
    assert re.search(pattern, lines[0]), lines[0]


def test_enough_bad_cases_per_tool() -> None:
    counts = {tool: sum(case[0] == tool for case in BAD) for tool in TOOLS}
    assert counts["alpa-bench"] >= 20 and counts["alpa-p2"] >= 12 and counts["alpa-demo"] >= 10


@pytest.mark.parametrize(
    ("module", "argv", "pattern"),
    [
        ("alpa_bench", ["--micro-batches", "0"], "--micro-batches must be"),
        ("alpa_p2", ["--system", "custom-\u00b2", "--axes", "2", "--reduce", "0"], "--system"),
        ("demo", ["--devices", "0"], "--devices must be"),
        # a platform that is not there (as JAX_PLATFORMS=cuda on a machine without a GPU)
        ("demo", ["--steps", "1"], "JAX found no devices of JAX_PLATFORMS='nosuch'"),
    ],
)
def test_console_has_no_traceback(module: str, argv: list[str], pattern: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", f"alpa_ir.tools.{module}", *argv],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
        env={**os.environ, "JAX_PLATFORMS": "nosuch"} if "JAX_PLATFORMS" in pattern else None,
    )
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    (line,) = proc.stderr.strip().splitlines()
    assert pattern in line


# -- good invocations pass the same checks, quickly --------------------------------------


def test_bench_help_lists_presets_suites_models_and_defaults(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, err = _run(capsys, "alpa-bench", ["--help"])
    assert code == 0 and err == ""
    for text in ("alpa-testbed", "dgx-a100", "local-cpu", "gpt3-39b (64 GPUs)", "moe-70b"):
        assert text in out
    assert "wresnet-13b" in out and "mlp-tiny" in out
    assert "(default: artifact)" in out and "(default: 64)" in out and "(default: 60.0)" in out


def test_bench_checks_accept_good_runs() -> None:
    parser = alpa_bench.build_parser()
    runs = alpa_bench.check_args(parser, parser.parse_args([]))
    assert [r.name for r in runs] == list(SUITES["gpt3"])
    assert [r.cluster.num_devices for r in runs] == [1, 4, 8, 16, 32, 64]
    args = parser.parse_args(["--suite", "moe", "--models", "moe-1.3b,moe-380m"])
    assert [r.name for r in alpa_bench.check_args(parser, args)] == ["moe-1.3b", "moe-380m"]
    # an option repeated with the same value is no conflict
    args = parser.parse_args([*TINY, "--gpus", "2", "--layers", "2", "--gpus", "2"])
    (run,) = alpa_bench.check_args(parser, args)
    assert run.cluster.num_devices == 2 and run.layers == 2
    args = parser.parse_args(["--gpus", "512", "--micro-batches", "auto"])
    assert {r.cluster.num_devices for r in alpa_bench.check_args(parser, args)} == {512}


def test_p2_good_invocation(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(capsys, "alpa-p2", [*P2, "--top", "1", "--bytes", "1e6"])
    assert code == 0 and err == "" and "matrix [[4 1] [1 16]]" in out
    code, out, _ = _run(capsys, "alpa-p2", ["--help"])
    assert code == 0 and "gcp-a100-16x4" in out and "custom-AxB" in out and "(default: 0)" in out


def test_demo_help_and_device_flags(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "alpa-demo", ["--help"])
    assert code == 0 and "gpt-tiny" in out and "(default: 8)" in out
    flags = "--xla_cpu_enable_fast_math=false --xla_force_host_platform_device_count=8"
    assert demo.with_device_count(flags, 4) == (
        "--xla_cpu_enable_fast_math=false --xla_force_host_platform_device_count=4"
    )
    assert demo.with_device_count("", 2) == "--xla_force_host_platform_device_count=2"
    assert demo._use_devices(8) == ""  # JAX runs with 8 devices here: nothing to change
