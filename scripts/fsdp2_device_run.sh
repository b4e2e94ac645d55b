#!/usr/bin/env bash
# FSDP2 CPU-offload measurements on one lent GPU (torch only, no wheels): the torch CPU AdamW bench
# (with the pinned/pageable copy cells) first, then real FSDP2 steps, two model sizes x AdamW foreach/fused,
# then the pin_memory=False run if time is left. Each command under its own timeout; rows append under
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
timeout -k 5 100 python3 scripts/torch_cpu_adam_bench.py --out "$RES" --device cuda --budget-s 80 \
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
step 60 --size 2.0b --adam fused
step 60 --size 2.0b --adam foreach
step 45 --size 1.1b --adam fused --no-pin-memory
grep -h "^\[fsdp2\]\|Error" "$RES/steps.log" | tail -20
