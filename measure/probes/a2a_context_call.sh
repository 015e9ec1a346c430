#!/usr/bin/env bash
# Round 42's device call of measure.probes.a2a_context on a lent 4 x H200 machine (measure/probes/nccl_call.sh).
exec bash measure/probes/nccl_call.sh a2a_context
