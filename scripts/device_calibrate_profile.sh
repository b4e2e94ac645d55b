#!/usr/bin/env bash
# One call on a lent GPU machine (no package registry): `sosim calibrate --profile NAME` end to end, then the
# DeepSpeed runs that check it on the same lease, through `sosim calibrate --check` (falls back to
# scripts/ds_run_all.py when the simulator cannot be imported there). A second call on the same warm machine
# (CAL=0) continues the job list where the first stopped (--skip-done), with the same lease id; results
# accumulate under /tmp/calprof and every call packs all of it into $OUT/results.tar.gz.
#
#   OUT=$OUT DEADLINE_S=570 PROFILE=h200-lease-a CAL=1 bash scripts/device_calibrate_profile.sh JOB...
#
# Environment: OUT, DEADLINE_S (whole script), PROFILE (name of the written profile), CAL (1: calibrate first),
# CAL_TIMEOUT_S (default 400), WHL_DIR (default .whl), DS_JOB_TIMEOUT_S (default 120).
# The lease id (column `lease` of every DeepSpeed row) is the kind, the UTC date and the machine's boot id:
# two calls on one warm machine share it; a fresh machine gets a new one.
set -u -o pipefail
OUT=${OUT:-/tmp/out}
DEADLINE_S=${DEADLINE_S:-570}
START_S=$(date +%s)
left_s() { echo $((DEADLINE_S - ($(date +%s) - START_S))); }
stamp() { echo "[device_calprof] $* at $(( $(date +%s) - START_S )) s"; }
REPO=$(pwd)
RES=/tmp/calprof
PROFILE=${PROFILE:-h200-lease}
mkdir -p "$OUT" "$RES/profiles" "$RES/logs"
WHL_DIR=${WHL_DIR:-.whl}
if ! PYTHONPATH=/tmp/site python3 -c "import deepspeed, simpy" 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    "$WHL_DIR"/*.whl || { echo "wheel install failed"; exit 1; }
fi
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0 TORCH_EXTENSIONS_DIR=/tmp/torch_ext
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
BOOT=$(cut -c1-8 /proc/sys/kernel/random/boot_id)
export SOSIM_LEASE="nvidia-h200-$(date -u +%Y-%m-%d)-${BOOT}"
CALL=$(ls "$RES/logs" | grep -c '^call' || true); CALL=$((CALL + 1))
LOG="$RES/logs/call${CALL}.log"
stamp "lease $SOSIM_LEASE, call $CALL" | tee -a "$LOG"
{
  date -u; echo "lease $SOSIM_LEASE"; nvidia-smi; nproc; free -g; lscpu | head -24; uname -a
  python3 -c "import torch, deepspeed, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, \
'deepspeed', deepspeed.__version__, 'transformers', transformers.__version__)"
} > "$RES/machine_call${CALL}.txt" 2>&1

if [ "${CAL:-1}" = "1" ]; then
  # Standalone harness (imports no simulator); it compiles CPUAdam in the background during the GPU sections.
  timeout -k 10 "${CAL_TIMEOUT_S:-400}" python3 sosim/calibrate/cli.py --quick --profile "$PROFILE" \
    --profiles "$RES/profiles" 2>&1 | tee -a "$LOG" | grep -E "^\[calibrate\]|Error"
  stamp "calibrate --profile exit ${PIPESTATUS[0]}" | tee -a "$LOG"
  cp "$RES/profiles/$PROFILE.yaml" "$OUT/" 2>/dev/null
fi

if [ "$#" -gt 0 ]; then
  BUDGET_S=$(( $(left_s) - 40 ))
  JOBS=$(IFS=,; echo "$*")
  stamp "DeepSpeed jobs with ${BUDGET_S} s" | tee -a "$LOG"
  if PYTHONPATH=$REPO:/tmp/site python3 -c "import sosim.cli, sosim.answers.validate_measured" 2>>"$LOG"; then
    PYTHONPATH=$REPO:/tmp/site timeout -k 10 $(( BUDGET_S + 30 )) python3 -m sosim calibrate --check \
      --profile "$PROFILE" --profiles "$RES/profiles" --check-jobs "$JOBS" --check-deadline-s "$BUDGET_S" \
      --check-bands 0 2>&1 | tee -a "$LOG"
  else
    stamp "simulator not importable here: DeepSpeed jobs only" | tee -a "$LOG"
    timeout -k 10 $(( BUDGET_S + 10 )) python3 scripts/ds_run_all.py --out "$RES/profiles/$PROFILE.calibration/check" \
      --deadline-s "$BUDGET_S" --job-timeout-s "${DS_JOB_TIMEOUT_S:-120}" --skip-done "$@" 2>&1 | tee -a "$LOG"
  fi
fi
cp "$RES/profiles/$PROFILE.calibration/check/deepspeed_steps.csv" "$OUT/" 2>/dev/null
tar czf "$OUT/results.tar.gz" -C "$RES" .
stamp "done" | tee -a "$LOG"
