#!/usr/bin/env bash
# alpa-calibrate on a lent GPU, then the check table (predicted vs measured step
# times) on the GPUs present, for issue #41. Prepared for a session that has a
# device machine (the `run` tool: an image with CUDA's JAX, flax, optax, rich,
# pluggy, scipy; no xdsl, mip or highspy; nothing can be fetched there).
#
# 1. Here, once (downloads the wheels the image lacks into .whl/, ignored by git):
#      bash tools/gpu_calibrate_check.sh --prepare
# 2. On the device machine, one call (about 3-6 minutes):
#      run(command="bash tools/gpu_calibrate_check.sh", carry=[".whl"], timeout_s=540)
#    It writes under $OUT: gpu_profile.json (the profile), calibrate.log (its
#    summary), check.log and check.json (the table), env.log (versions).
#
# The image's JAX is newer (0.11) than the project's tested range (0.10): the
# calibration uses public JAX only (shard_map, psum, ...); the check table
# imports jaxprs, so a failure there is printed per case and the profile still
# comes back. With one GPU the table runs every model on that device
# (--cases single); with 8, the whole CPU table (--cases all) at GPU sizes.
set -uo pipefail
cd "$(dirname "$0")/.."

if [[ "${1:-}" == "--prepare" ]]; then
    grep -qxF '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
    mkdir -p .whl
    python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \
        xdsl==0.74.0 immutabledict ordered-set mip==2.0.0 cbcbox cffi pycparser \
        'highspy>=1.7,<1.16'
    ls -la .whl
    exit 0
fi

OUT="${OUT:-/tmp/gpu_calibrate_out}"
mkdir -p "$OUT"
SITE=/tmp/alpa_site
mkdir -p "$SITE"
if compgen -G ".whl/*.whl" > /dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$SITE" .whl/*.whl || echo "wheels: install failed" >&2
fi
# the project itself, laid out as pyproject's package-dir maps it (its
# top-level folders under alpa_ir), without building a wheel
rm -rf "$SITE/alpa_ir"
cp -r alpa_ir "$SITE/alpa_ir"
for folder in passes backends runtime plugins tools; do
    cp -r "$folder" "$SITE/alpa_ir/$folder"
done
export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1

{
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
    python3 -c "import jax; print('jax', jax.__version__, jax.devices())"
} > "$OUT/env.log" 2>&1
cat "$OUT/env.log"

# no terminal there: no progress bar, the summary at the end
timeout 280 python3 -m alpa_ir.tools.alpa_calibrate --out "$OUT/gpu_profile.json" \
    2>&1 | tee "$OUT/calibrate.log"
[[ -s "$OUT/gpu_profile.json" ]] || { echo "no profile written" >&2; exit 1; }

GPUS=$(python3 -c "import jax; print(jax.device_count())")
CASES=single
[[ "$GPUS" -ge 8 ]] && CASES=all
timeout 200 python3 -m alpa_ir.tools.bench_local_clock --profile "$OUT/gpu_profile.json" \
    --cases "$CASES" --size gpu --steps 5 --warmup 2 --json "$OUT/check.json" \
    2>&1 | tee "$OUT/check.log"
exit 0
