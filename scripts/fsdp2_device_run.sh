#!/usr/bin/env bash
# FSDP2 CPU-offload measurements on one lent GPU (torch only, no wheels): the torch CPU AdamW bench
# (with the pinned/pageable copy cells) first, then real FSDP2 steps, two model sizes x AdamW foreach/fused,
# then activation offload (save_on_cpu) and pin_memory=False if time is left. Each command under its own timeout; rows append under
# $OUT/fsdp2/ (torch_cpu_adam.csv, fsdp2_steps.csv, runs/*.json).
#   OUT=$OUT DEADLINE_S=300 bash scripts/fsdp2_device_run.sh
set -u -o pipefail
OUT=${OUT:-/tmp/out}
DEADLINE_S=${DEADLINE_S:-300}
START_S=$(date +%s)
left_s() { echo $((DEADLINE_S - ($(date +%s) - START_S))); }
RES="$OUT/fsdp2"
mkdir -p "$RES"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
{ date -u; nproc; free -g; lscpu | head -20; nvidia-smi --query-gpu=name,memory.total --format=csv
  python3 -c "import torch; print('torch', torch.__version__, 'threads', torch.get_num_threads())"; } \
  > "$RES/machine.txt" 2>&1
# The bench gets what the four main step jobs (~180 s with margin) leave, 40-70 s.
BENCH_S=$(( DEADLINE_S - 180 )); [ "$BENCH_S" -gt 70 ] && BENCH_S=70; [ "$BENCH_S" -lt 40 ] && BENCH_S=40
timeout -k 5 $(( BENCH_S + 15 )) python3 scripts/torch_cpu_adam_bench.py --out "$RES" --device cuda --budget-s "$BENCH_S" \
  > "$RES/adam_bench.log" 2>&1
echo "[fsdp2] adam bench rc=$? at $(( $(date +%s) - START_S )) s"
step() {  # step <timeout> <args...>: run one FSDP2 job if it fits in what is left
  local limit=$1; shift
  if [ "$(left_s)" -lt "$limit" ]; then echo "[fsdp2] skip $* (left $(left_s) s)"; return; fi
  timeout -k 5 "$limit" python3 scripts/fsdp2_train_step.py "$@" --warmup 1 --steps 4 --phased-steps 2 \
    --out "$RES" >> "$RES/steps.log" 2>&1
  echo "[fsdp2] $* rc=$? at $(( $(date +%s) - START_S )) s"
}
step 45 --size 1.1b --adam fused
step 45 --size 1.1b --adam foreach
step 55 --size 2.0b --adam fused
step 55 --size 2.0b --adam foreach
step 40 --size 1.1b --adam fused --no-ckpt --activation-offload
step 40 --size 1.1b --adam fused --no-pin-memory
# Megatron-Core's HybridDeviceOptimizer step reproduced with torch (scripts/hybrid_optimizer_step.py), if time is left.
hdo() {
  if [ "$(left_s)" -lt 35 ]; then echo "[fsdp2] skip hdo $* (left $(left_s) s)"; return; fi
  timeout -k 5 35 python3 scripts/hybrid_optimizer_step.py "$@" --out "$RES" >> "$RES/steps.log" 2>&1
  echo "[fsdp2] hdo $* rc=$? at $(( $(date +%s) - START_S )) s"
}
hdo --size 1.1b --fraction 1.0 --overlap
hdo --size 1.1b --fraction 0.5
grep -h "^\[fsdp2\]\|Error" "$RES/steps.log" | tail -20
