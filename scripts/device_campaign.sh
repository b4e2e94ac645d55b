#!/usr/bin/env bash
# One device campaign (issues 21-23 and 22's MoE steps) in back-to-back calls on one warm lent H200 (no package
# registry, no network). Run from the repository root; the carried .whl/ holds deepspeed 0.19.8 and its deps
# (plus simpy) and .whl/ds0188/deepspeed-0.18.8-py3-none-any.whl.
#
#   OUT=$OUT CALL=1 DEADLINE_S=560 bash scripts/device_campaign.sh   # install both versions, calibrate --quick
#                                                                     # (isolated + in-step), then jobs
#   OUT=$OUT CALL=2 DEADLINE_S=560 bash scripts/device_campaign.sh   # the job list, continued (--skip-done)
#   OUT=$OUT CALL=3 DEADLINE_S=560 bash scripts/device_campaign.sh   # the job list, then the FSDP2 commands
#
# State lives in /tmp/campaign on the warm machine; every call packs all of it into $OUT/results.tar.gz and
# copies the main CSVs to $OUT. A call on a fresh machine (the warm one was lost) installs again and continues
# with what that machine has (nothing): the lease id changes with the boot id.
# Environment: OUT, CALL (1, 2, 3), DEADLINE_S (whole call, default 560), WHL_DIR (default .whl), PROFILE
# (default h200-lease-<UTC date>), CAL_TIMEOUT_S (calibrate's limit, default 540), JOBS_FILE (default
# scripts/campaign_jobs.txt), DS_JOB_TIMEOUT_S (default 130), FSDP_S (call 3: time kept for FSDP2, default 240).
set -u -o pipefail
OUT=${OUT:-/tmp/out}
CALL=${CALL:-1}
DEADLINE_S=${DEADLINE_S:-560}
START_S=$(date +%s)
left_s() { echo $((DEADLINE_S - ($(date +%s) - START_S))); }
stamp() { echo "[campaign] call $CALL: $* at $(( $(date +%s) - START_S )) s"; }
RES=${CAMPAIGN_DIR:-/tmp/campaign}
mkdir -p "$OUT" "$RES/logs" "$RES/ds" "$RES/profiles"
exec > >(tee -a "$RES/logs/call${CALL}.log") 2>&1
WHL_DIR=${WHL_DIR:-.whl}
PROFILE=${PROFILE:-h200-lease-$(date -u +%Y%m%d)}
JOBS_FILE=${JOBS_FILE:-scripts/campaign_jobs.txt}
SITE=/tmp/site
SITE188=/tmp/site-ds0.18.8

pack() {
  cp "$RES/ds/deepspeed_steps.csv" "$OUT/" 2>/dev/null
  cp "$RES/profiles/$PROFILE.yaml" "$RES/profiles/$PROFILE.calibration/instep.csv" "$OUT/" 2>/dev/null
  cp "$RES/profiles/$PROFILE.calibration/measurements.csv" "$OUT/" 2>/dev/null
  tar czf "$OUT/results.tar.gz" -C "$RES" . && stamp "packed $(du -h "$OUT/results.tar.gz" | cut -f1)"
}
trap pack EXIT

# ---- install (idempotent: a warm machine keeps /tmp)
if ! PYTHONPATH=$SITE python3 -c "import deepspeed, simpy" 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $SITE \
    "$WHL_DIR"/*.whl || { echo "wheel install failed"; exit 1; }
fi
if ! PYTHONPATH=$SITE188:$SITE python3 -c "import deepspeed, sys; sys.exit(deepspeed.__version__ != '0.18.8')" \
    2>/dev/null; then
  # --no-deps: its dependencies (pydantic, hjson, ...) come from $SITE, which follows it on PYTHONPATH.
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $SITE188 \
    "$WHL_DIR"/ds0188/deepspeed-0.18.8-py3-none-any.whl || echo "0.18.8 wheel install failed: its jobs will fail"
fi
export PYTHONPATH=$SITE PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0 TORCH_EXTENSIONS_DIR=/tmp/torch_ext
# NVLink multicast off everywhere (the lending workplace requires it).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
BOOT=$(cut -c1-8 /proc/sys/kernel/random/boot_id)
export SOSIM_LEASE="nvidia-h200-$(date -u +%Y-%m-%d)-${BOOT}"
stamp "lease $SOSIM_LEASE, profile $PROFILE"
{
  date -u; echo "lease $SOSIM_LEASE"; nvidia-smi; nproc; free -g; lscpu | head -24; uname -a
  python3 -c "import torch, deepspeed, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, \
'deepspeed', deepspeed.__version__, 'transformers', transformers.__version__)"
  PYTHONPATH=$SITE188:$SITE python3 -c "import deepspeed; print('second deepspeed', deepspeed.__version__, deepspeed.__file__)"
} > "$RES/machine_call${CALL}.txt" 2>&1
head -3 "$RES/machine_call${CALL}.txt"; tail -2 "$RES/machine_call${CALL}.txt"

build_188() {  # CPUAdam of 0.18.8 into its own extensions folder (never reuse one built from other sources)
  [ -f $RES/cpuadam188.ok ] && return 0
  local start; start=$(date +%s)
  PYTHONPATH=$SITE188:$SITE TORCH_EXTENSIONS_DIR=/tmp/torch_ext-ds0.18.8 timeout -k 5 "${1:-300}" python3 -c \
    "import deepspeed; from deepspeed.ops.op_builder import CPUAdamBuilder; CPUAdamBuilder().load(); \
print('cpu_adam built for', deepspeed.__version__)" > "$RES/cpuadam188_build.log" 2>&1
  local code=$?
  [ "$code" = 0 ] && touch $RES/cpuadam188.ok
  stamp "0.18.8 CPUAdam build (started at $(( start - START_S )) s) exit $code in $(( $(date +%s) - start )) s: $(tail -1 "$RES/cpuadam188_build.log")"
}

# ---- call 1: calibrate --quick (isolated sections + the instep section), timed as a user on a fresh lease sees it
# 0.18.8's CPUAdam builds beside calibrate's own 0.19.8 build, while calibrate runs its GPU sections (calibrate's
# host sections wait for its own build only: the two build logs' end times, stamped, say whether they overlapped).
if [ "$CALL" = "1" ] && [ ! -f "$RES/profiles/$PROFILE.yaml" ]; then
  build_188 300 &
  BUILD188_PID=$!
  CAL_START=$(date +%s)
  timeout -k 10 "${CAL_TIMEOUT_S:-540}" python3 sosim/calibrate/cli.py --quick --profile "$PROFILE" \
    --profiles "$RES/profiles" 2>&1 | tee "$RES/logs/calibrate.log" | grep -E "^\[calibrate\]|Error"
  CODE=${PIPESTATUS[0]}
  echo "calibrate --quick exit $CODE wall $(( $(date +%s) - CAL_START )) s (CPUAdam build included)" \
    | tee "$RES/calibrate_wall.txt"
  wait "$BUILD188_PID"
fi

# ---- a later call: the calibration's sections that call 1's limit cut off (the profile names the table, so the
# rows added here are used as soon as they are written)
CAL_DIR="$RES/profiles/$PROFILE.calibration"
if [ "$CALL" != "1" ] && [ -f "$CAL_DIR/calibration_meta.json" ]; then
  MISSING=$(python3 -c "
import json, sys
sys.path.insert(0, 'sosim/calibrate')
import platform_detect as p
plan = p.plan_for(p.detect(gpu_name='NVIDIA H200'), True, True).sections
meta = json.load(open('$CAL_DIR/calibration_meta.json'))
done = set(meta.get('sections', [])) - set(meta.get('failed_sections', []))
print(','.join(s for s in plan if s not in done and s not in meta.get('sections', [])))" 2>/dev/null)
  if [ -n "$MISSING" ] && [ "$(left_s)" -gt 300 ]; then
    stamp "calibrate sections cut off in call 1: $MISSING"
    timeout -k 10 200 python3 sosim/calibrate/cli.py --quick --append --out "$CAL_DIR" --only "$MISSING" 2>&1 \
      | tee -a "$RES/logs/calibrate.log" | grep -E "^\[calibrate\]|Error"
    stamp "calibrate --append exit ${PIPESTATUS[0]}"
  fi
fi

# ---- the job list (0.18.8's CPUAdam built first, in the foreground: a build beside a job skews its host timings)
mapfile -t JOBS < <(sed -e 's/#.*//' -e 's/[[:space:]]//g' "$JOBS_FILE" | grep -v '^$')
KEEP_S=20
[ "$CALL" = "3" ] && KEEP_S=$(( ${FSDP_S:-240} + 20 ))
if [ "$(left_s)" -gt $(( KEEP_S + 100 )) ]; then build_188 $(( $(left_s) - KEEP_S - 60 )); fi
BUDGET_S=$(( $(left_s) - KEEP_S ))
if [ "$BUDGET_S" -gt 45 ]; then
  stamp "DeepSpeed jobs with ${BUDGET_S} s (${#JOBS[@]} in the list)"
  timeout -k 10 $(( BUDGET_S + 10 )) python3 scripts/ds_run_all.py --out "$RES/ds" --deadline-s "$BUDGET_S" \
    --job-timeout-s "${DS_JOB_TIMEOUT_S:-130}" --min-start-s 40 --skip-done "${JOBS[@]}" 2>&1 \
    | tee -a "$RES/logs/ds_run_all.log" | grep -E "^\[run_all\]|^    \[ds\]"
fi
DONE=$(cat "$RES/ds/done_jobs.txt" 2>/dev/null | wc -l)
stamp "jobs done so far: $DONE of ${#JOBS[@]}"

# ---- call 3: the fsdp helper's FSDP2 steps and torch CPU Adam (its own self-limiting script)
if [ "$CALL" = "3" ]; then
  if [ -f scripts/fsdp2_device_run.sh ]; then
    FS=$(( $(left_s) - 15 )); [ "$FS" -gt 300 ] && FS=300
    stamp "FSDP2 commands with ${FS} s"
    OUT=$RES DEADLINE_S=$FS timeout -k 10 $(( FS + 10 )) bash scripts/fsdp2_device_run.sh 2>&1 | tail -30
    stamp "FSDP2 exit ${PIPESTATUS[0]}"
  else
    stamp "scripts/fsdp2_device_run.sh not in this checkout: FSDP2 skipped"
  fi
fi
stamp "done, $(left_s) s left"
