#!/usr/bin/env bash
# One call on a GPU machine that reaches no package registry: install the carried wheels (.whl/), build
# DeepSpeed's CPUAdam op (JIT), run `sosim calibrate --quick`, then the DeepSpeed step jobs given as
# arguments (scripts/ds_run_all.py syntax), and pack everything under $OUT.
#
#   OUT=/tmp/out DEADLINE_S=560 bash scripts/device_run.sh 1.1b:2048:4:floor 1.1b:2048:4:zero2 ...
#
# Environment: OUT (results folder), DEADLINE_S (whole-script budget), CAL_TIMEOUT_S (budget of each harness
# invocation), CAL_ARGS (default --quick; empty string for the full set), SKIP_CAL=1 (DeepSpeed jobs only),
# DS_JOB_TIMEOUT_S (limit of each DeepSpeed job, default 150).
set -u -o pipefail
OUT=${OUT:-/tmp/out}
DEADLINE_S=${DEADLINE_S:-560}
START_S=$(date +%s)
left_s() { echo $((DEADLINE_S - ($(date +%s) - START_S))); }
REPO=$(pwd)
RES=/tmp/results
mkdir -p "$OUT" "$RES"

python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
  .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0 TORCH_EXTENSIONS_DIR=/tmp/torch_ext
# Keep NVLink multicast off everywhere (the lending workplace asks for it on every machine).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1

{
  date -u; nvidia-smi; nproc; free -g; lscpu | head -20
  python3 -c "import torch, deepspeed; print('torch', torch.__version__, 'cuda', torch.version.cuda, \
'deepspeed', deepspeed.__version__)"
} > "$RES/machine.txt" 2>&1
head -c 3000 "$RES/machine.txt"

# Build CPUAdam while the GPU sections of the harness run (they barely use the CPU). The CPU sections
# (copies, casts, CPU Adam) wait for the build: a compiler on 2 of 16 cores skews 16-thread timings.
timeout 300 python3 -c "from deepspeed.ops.op_builder import CPUAdamBuilder; CPUAdamBuilder().load(); \
print('cpu_adam built')" > "$RES/cpuadam_build.log" 2>&1 &
BUILD_PID=$!

calibrate() {
  # A copy of the harness alone, so the rest of sosim (maybe mid-edit) is never imported.
  mkdir -p /tmp/calpkg/sosim && cp -r sosim/calibrate /tmp/calpkg/sosim/ && : > /tmp/calpkg/sosim/__init__.py
  (cd /tmp && PYTHONPATH=/tmp/calpkg:/tmp/site timeout "${CAL_TIMEOUT_S:-240}" \
    python3 -m sosim.calibrate.cli ${CAL_ARGS---quick} --out "$RES/cal" "$@") 2>&1 | tee -a "$RES/calibrate.log"
  echo "[device_run] calibrate $* exit ${PIPESTATUS[0]} at $(( $(date +%s) - START_S )) s"
}
[ "${SKIP_CAL:-0}" != "1" ] && calibrate --only gemm,attention,layer,gpu_cast
wait "$BUILD_PID"; echo "[device_run] cpu_adam build exit $? at $(( $(date +%s) - START_S )) s: $(tail -1 "$RES/cpuadam_build.log")"
[ "${SKIP_CAL:-0}" != "1" ] && calibrate --append --only copy,cpu_cast,cpu_adam

if [ "$#" -gt 0 ]; then
  BUDGET_S=$(( $(left_s) - 25 ))
  timeout $(( BUDGET_S + 10 )) python3 "$REPO/scripts/ds_run_all.py" --out "$RES/ds" --deadline-s "$BUDGET_S" \
    --job-timeout-s "${DS_JOB_TIMEOUT_S:-150}" "$@" \
    2>&1 | tee "$RES/ds_run_all.log"
fi

tar czf "$OUT/results.tar.gz" -C "$RES" .
cp "$RES/cal/measurements.csv" "$RES/cal/calibration_meta.json" "$RES/ds/deepspeed_steps.csv" "$OUT/" 2>/dev/null
echo "[device_run] done in $(( $(date +%s) - START_S )) s"
