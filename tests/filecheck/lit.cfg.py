"""lit configuration: run the ``*.mlir`` tests with ``alpa-opt`` and ``filecheck``.

Both tools come from the Python environment that runs lit (the project's
venv); ``lit --param tools_dir=DIR`` puts another build's tools first. The
fixture plugins (tests/plugins_fixture) are importable, so RUN lines can use
``--load-plugin=alpa_testing_passes``. JAX sees 8 CPU devices, as in pytest.
"""

import os
import sys
from pathlib import Path

import lit.formats

# `config` and `lit_config` are provided by lit when it executes this file.
config.name = "alpa_ir"  # noqa: F821
config.test_format = lit.formats.ShTest(execute_external=False)  # noqa: F821
config.suffixes = [".mlir"]  # noqa: F821
config.excludes = ["lit.cfg.py"]  # noqa: F821

_here = Path(__file__).resolve().parent
_repo = _here.parents[1]
config.test_source_root = str(_here)  # noqa: F821
config.test_exec_root = str(_repo / ".lit_output")  # noqa: F821

_tools = lit_config.params.get("tools_dir")  # noqa: F821
_path = [_tools] if _tools else []
_path += [str(Path(sys.executable).parent), os.environ.get("PATH", "")]
config.environment["PATH"] = os.pathsep.join(_path)  # noqa: F821

_pythonpath = [str(_repo / "tests" / "plugins_fixture")]
if os.environ.get("PYTHONPATH"):
    _pythonpath.append(os.environ["PYTHONPATH"])
config.environment["PYTHONPATH"] = os.pathsep.join(_pythonpath)  # noqa: F821
# lit's internal shell overwrites PYTHONPATH in the shared environment once it
# runs one of its Python builtins (cat, diff, ...), so each alpa-opt command
# gets its own copy through `env`.
config.substitutions.append(  # noqa: F821
    (r"(?<![\w/.%-])alpa-opt(?![\w.-])", f"env PYTHONPATH={os.pathsep.join(_pythonpath)} alpa-opt")
)
config.environment["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"  # noqa: F821
config.environment["JAX_PLATFORMS"] = "cpu"  # noqa: F821
config.environment["COLUMNS"] = "100"  # noqa: F821 (stable argparse/usage wrapping)
