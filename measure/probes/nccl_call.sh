#!/usr/bin/env bash
# One device call of a plain-torch NCCL probe (measure.probes.<PROBE>) on every GPU of a lent H200 machine, run from
# the repository root:
#   bash measure/probes/nccl_call.sh PROBE        (a2a_context, a2a_stagger)
# Runs only where nvidia-smi names an H200 (exit 3 otherwise); packs the probe's JSON, its log and the machine's
# description into $OUT/<probe, dashed>.tar.xz. Needs no megatron-core.
set -uo pipefail
probe=$1
nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 || { nvidia-smi -L; exit 3; }
export PYTHONPATH=. PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
work=/tmp/${probe//_/-}
rm -rf "$work" && mkdir -p "$work"
{ nvidia-smi --query-gpu=name,driver_version,memory.total,power.limit --format=csv; nvidia-smi topo -m; } \
  > "$work/machine.txt" 2>&1
gpus=$(nvidia-smi -L | wc -l)
timeout 300 torchrun --standalone --nproc-per-node "$gpus" -m "measure.probes.$probe" --out "$work" \
  > "$work/log.txt" 2>&1
rc=$?
tail -5 "$work/log.txt"
tar -C "$work" -cJf "$OUT/${probe//_/-}.tar.xz" .
exit $rc
