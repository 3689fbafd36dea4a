"""``alpa-demo``: the main job. Trains the tiny GPT of the model zoo on the 8
local CPU devices with ``PipeshardParallel``: automatic layers
(``cluster-operators``), two pipeline stages on two submeshes of 4 devices,
each stage auto-sharded by the ILP, 1F1B over 2 micro-batches. Prints the plan
(stages, meshes, shardings) and the loss.

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
    parser.add_argument("--stages", type=int, default=2, help="pipeline stages (default 2)")
    parser.add_argument(
        "--micro-batches", type=int, default=2, help="micro-batches per step (default 2)"
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    os.environ.setdefault("XLA_FLAGS", f"--xla_force_host_platform_device_count={args.devices}")
    import alpa_ir
    from alpa_ir.errors import AlpaError
    from alpa_ir.models import make_train_step
    from alpa_ir.pipeshard import AutoLayerOption, PipeshardParallel, UniformStageOption

    try:
        step, (state, batch) = make_train_step(args.model)
        method = PipeshardParallel(
            num_micro_batches=args.micro_batches,
            layer_option=AutoLayerOption(layer_num=args.stages),
            stage_option=UniformStageOption(num_stages=args.stages),
        )
        parallel = alpa_ir.parallelize(step, method=method)
        start = time.perf_counter()
        executable = parallel.get_executable(state, batch)
        print(f"model {args.model}: compiled in {time.perf_counter() - start:.1f} s")
        print(executable.plan_text())
        for k in range(args.steps):
            start = time.perf_counter()
            state, loss = parallel(state, batch)
            print(f"step {k}: loss {float(loss):.4f} ({time.perf_counter() - start:.2f} s)")
    except AlpaError as err:
        print(f"alpa-demo: error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
