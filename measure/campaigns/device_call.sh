#!/usr/bin/env bash
# One device call of a campaign round (measure.campaigns.h200 --only IDS) on a lent machine, run from
# the repository root with the megatron-core wheel carried in .whl/ (docs/measure.md):
#   bash measure/campaigns/device_call.sh GPUS BUDGET_S HARD_S TIMEOUT_S ID[,ID...]
# Packs what came back into $OUT: bundles.tar.gz (bundles without raw/), raw-ID.tar.gz (raw traces kept by
# --keep-raw), campaign.json, logs.tar.gz, gpu.txt.
set -uo pipefail
gpus=$1 budget=$2 hard=$3 timeout=$4 ids=$5
source measure/carry.sh && carry_install || exit 1
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total,power.limit --format=csv > "$OUT/gpu.txt" 2>&1
lscpu | grep -E "Model name|^CPU\(s\)" >> "$OUT/gpu.txt"
nvidia-smi topo -m >> "$OUT/gpu.txt" 2>&1
work=/tmp/campaign
rm -rf "$work" /tmp/raw  # a warm machine keeps the last call's: it must not travel back again
python3 -m measure.campaigns.h200 --gpus "$gpus" --budget "$budget" --hard "$hard" --timeout "$timeout" \
    --only "$ids" --out "$work"
mkdir -p /tmp/raw
for d in "$work"/*/raw; do [ -d "$d" ] && mv "$d" "/tmp/raw/$(basename "$(dirname "$d")")"; done
cp "$work/campaign.json" "$OUT/" 2>/dev/null
tar -C "$work" -czf "$OUT/logs.tar.gz" logs
tar -C "$work" -czf "$OUT/bundles.tar.gz" --exclude=logs --exclude=campaign.json .
for r in /tmp/raw/*; do [ -d "$r" ] && tar -C /tmp/raw -czf "$OUT/raw-$(basename "$r").tar.gz" "$(basename "$r")"; done
ls -la "$OUT"
