"""``alpa-demo``: the main job. Trains the tiny GPT of the model zoo on the 8
local CPU devices with a plan the compiler made, printing the plan and the loss.

Runs on any machine: it asks XLA for 8 host CPU devices before JAX starts.
"""

from __future__ import annotations

import argparse
import os
import sys
import time


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="alpa-demo", description=__doc__)
    parser.add_argument("--model", default="gpt-tiny", help="zoo model (default gpt-tiny)")
    parser.add_argument("--steps", type=int, default=5, help="training steps (default 5)")
    parser.add_argument("--devices", type=int, default=8, help="local CPU devices (default 8)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    os.environ.setdefault("XLA_FLAGS", f"--xla_force_host_platform_device_count={args.devices}")
    import jax

    import alpa_ir
    from alpa_ir.device_mesh import LogicalDeviceMesh
    from alpa_ir.dialects.sharding import ShardingSpec
    from alpa_ir.errors import AlpaError
    from alpa_ir.models import make_train_step
    from alpa_ir.pass_manager import PassManager
    from alpa_ir.plugins.registry import default_registry
    from alpa_ir.sharding_annotation import annotate_shardings

    try:
        step, (state, batch) = make_train_step(args.model)
        module = alpa_ir.import_jax(step, state, batch)
        ops_before = sum(1 for _ in module.walk())
        PassManager(default_registry(), "builtin.module(merge-trivial-ops)").run(module)
        n = len(jax.devices())

        def data_parallel(name: str, shape: tuple[int, ...]) -> ShardingSpec | None:
            if name.startswith("batch") and shape and shape[0] % n == 0:
                return ShardingSpec(((0,),) + ((),) * (len(shape) - 1))
            return None

        annotate_shardings(module, LogicalDeviceMesh((n,)), data_parallel)
        print(f"model {args.model}: {ops_before} ops, plan: data parallel on {n} devices")
        executable = alpa_ir.compile_module(module)
        for k in range(args.steps):
            start = time.perf_counter()
            state, loss = executable(state, batch)
            print(f"step {k}: loss {float(loss):.4f} ({time.perf_counter() - start:.2f} s)")
    except AlpaError as err:
        print(f"alpa-demo: error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
