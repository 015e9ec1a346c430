#!/usr/bin/env bash
# One device call of measure.probes.host_pace on a lent one-GPU machine, run from the repository root with the
# megatron-core wheel carried in .whl/ (docs/measure.md):
#   bash measure/probes/host_pace_call.sh GPU_NAME PROBE_ARGS...
# Runs only where nvidia-smi names GPU_NAME (exit 3 otherwise: a call given another GPU spends nothing);
# packs the probe's JSON, logs and the machine's description into $OUT/host-pace.tar.xz.
set -uo pipefail
want=$1; shift
nvidia-smi --query-gpu=name --format=csv,noheader | grep -q "$want" || { nvidia-smi -L; exit 3; }
source measure/carry.sh && carry_install || exit 1
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
work=/tmp/host-pace
rm -rf "$work" && mkdir -p "$work"
{ nvidia-smi --query-gpu=name,driver_version,memory.total,power.limit --format=csv; lscpu; nvidia-smi topo -m;
  grep MHz /proc/cpuinfo; } > "$work/machine.txt" 2>&1
python3 -m measure.probes.host_pace --out "$work" "$@"
grep MHz /proc/cpuinfo > "$work/mhz-after.txt"
tar -C "$work" -cJf "$OUT/host-pace.tar.xz" .
