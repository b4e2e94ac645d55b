#!/usr/bin/env bash
# One call on a lent GPU machine (no package registry): install the carried wheels, JIT-build DeepSpeed's
# CPUAdam in the background while the sections that barely use the CPU run, then the CPU-sensitive harness
# sections one process each (each under its own timeout, appending to one measurements.csv), then the
# DeepSpeed step jobs (scripts/ds_run_all.py syntax) in what time is left, and pack everything under $OUT.
#
#   cd .devstage && OUT=$OUT DEADLINE_S=540 PRE_SECTIONS=quantize,disk \
#     POST_SECTIONS=ds_refresh,so_worker,layer_z3,ds_step_fixed bash scripts/device_run_ds.sh JOB...
#
# Environment: OUT (results), DEADLINE_S (whole script), WHL_DIR (default ../.whl, else .whl), CAL_ARGS
# (default --quick), PRE_SECTIONS (run while CPUAdam builds), POST_SECTIONS (after the build),
# SECTION_TIMEOUT_S (default 200, per section), DS_MIN_S (time kept for the DeepSpeed jobs: a section that
# would eat into it is skipped), DS_JOB_TIMEOUT_S (default 150), TAIL_SECTIONS (after the jobs, if time is
# left), SKIP_BUILD=1 (CPUAdam already built in /tmp/torch_ext on a warm machine).
set -u -o pipefail
OUT=${OUT:-/tmp/out}
DEADLINE_S=${DEADLINE_S:-540}
START_S=$(date +%s)
left_s() { echo $((DEADLINE_S - ($(date +%s) - START_S))); }
stamp() { echo "[device_run] $* at $(( $(date +%s) - START_S )) s"; }
REPO=$(pwd)
RES=/tmp/results_$START_S
mkdir -p "$OUT" "$RES/cal" "$RES/ds"
WHL_DIR=${WHL_DIR:-../.whl}
[ -d "$WHL_DIR" ] || WHL_DIR=.whl

if [ "${SKIP_INSTALL:-0}" != "1" ] && ! python3 -c "import sys; sys.path.insert(0, '/tmp/site'); import deepspeed" 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    "$WHL_DIR"/*.whl || { echo "wheel install failed"; exit 1; }
fi
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0 TORCH_EXTENSIONS_DIR=/tmp/torch_ext
# Keep NVLink multicast off everywhere (the lending workplace requires it on every machine).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export SOSIM_DISK_DIR=${SOSIM_DISK_DIR:-/var/tmp}

{
  date -u; nvidia-smi; echo; echo "== nvidia-smi topo -m"; nvidia-smi topo -m; echo; nproc; free -g
  lscpu | head -24; echo "== disk"; df -h / /tmp /var/tmp; mount | grep -E " / | /tmp | /var/tmp " | head
  lsblk -d -o NAME,ROTA,SIZE,MODEL 2>/dev/null | head
  python3 -c "import torch, deepspeed, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, \
'deepspeed', deepspeed.__version__, 'transformers', transformers.__version__, 'gpus', torch.cuda.device_count())"
} > "$RES/machine.txt" 2>&1
head -c 1500 "$RES/machine.txt"; grep -A6 "topo -m" "$RES/machine.txt"

BUILD_PID=""
if [ "${SKIP_BUILD:-0}" != "1" ]; then
  timeout 300 python3 -c "from deepspeed.ops.op_builder import CPUAdamBuilder; CPUAdamBuilder().load(); \
print('cpu_adam built')" > "$RES/cpuadam_build.log" 2>&1 &
  BUILD_PID=$!
fi

mkdir -p /tmp/calpkg/sosim && rm -rf /tmp/calpkg/sosim/calibrate && cp -r sosim/calibrate /tmp/calpkg/sosim/ \
  && : > /tmp/calpkg/sosim/__init__.py
section() {
  local name=$1 limit=${SECTION_TIMEOUT_S:-200} keep=${2:-${DS_MIN_S:-0}}
  local left; left=$(left_s)
  if [ $((left - keep)) -lt 40 ]; then stamp "skip section $name (left ${left} s)"; echo "$name" >> "$RES/skipped_sections.txt"; return; fi
  [ "$limit" -gt $((left - keep)) ] && limit=$((left - keep))
  (cd /tmp && PYTHONPATH=/tmp/calpkg:/tmp/site timeout -k 10 "$limit" \
    python3 -m sosim.calibrate.cli ${CAL_ARGS---quick} --append --out "$RES/cal" --only "$name") 2>&1 \
    | tee -a "$RES/calibrate.log" | grep -E "^\[calibrate\]|Error:|error:"
  stamp "section $name exit ${PIPESTATUS[0]}"
  cp "$RES/cal/measurements.csv" "$OUT/" 2>/dev/null
}
for s in ${PRE_SECTIONS:+${PRE_SECTIONS//,/ }}; do section "$s"; done
if [ -n "$BUILD_PID" ]; then wait "$BUILD_PID"; stamp "cpu_adam build exit $?: $(tail -1 "$RES/cpuadam_build.log")"; fi
for s in ${POST_SECTIONS:+${POST_SECTIONS//,/ }}; do section "$s"; done

if [ "$#" -gt 0 ]; then
  BUDGET_S=$(( $(left_s) - 15 - ${TAIL_KEEP_S:-0} ))
  stamp "DeepSpeed jobs with ${BUDGET_S} s"
  timeout -k 10 $(( BUDGET_S + 10 )) python3 "$REPO/scripts/ds_run_all.py" --out "$RES/ds" --deadline-s "$BUDGET_S" \
    --job-timeout-s "${DS_JOB_TIMEOUT_S:-150}" --min-start-s "${DS_MIN_START_S:-35}" "$@" 2>&1 | tee "$RES/ds_run_all.log"
fi
for s in ${TAIL_SECTIONS:+${TAIL_SECTIONS//,/ }}; do section "$s" 0; done

[ -f "$RES/cal/affinities.json" ] && cp "$RES/cal/affinities.json" "$OUT/"
cp "$RES/cal/measurements.csv" "$RES/cal/calibration_meta.json" "$RES/ds/deepspeed_steps.csv" "$RES/machine.txt" \
  "$OUT/" 2>/dev/null
tar czf "$OUT/results.tar.gz" -C "$RES" .
stamp "done"
