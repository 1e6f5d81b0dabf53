#!/usr/bin/env bash
# Regenerate the five committed simulator reports (issue 14) from the repository root:
#   TRACES=DIR bash bench/sim_reports.sh   # all five, one after another, 5 seeds per policy (the day about 20 minutes)
# Traces: the Azure LLM inference traces 2023 in $TRACES (README, Attribution: not in the repository), and the
# SYNTHETIC day built from them by bench/make_day_trace.py (bench/traces/day_synthetic.csv).
set -euo pipefail
TS=${TIDESERVE:-.venv/bin/tideserve}
TRACES=${TRACES:?set TRACES to the folder holding azure_llm_2023_code.csv and azure_llm_2023_conv.csv (README, Attribution)}
CPU=(bench/scenarios/cpu-cluster.yaml --profile bench/profiles/cpu-2core-tiny-en.json --spot-interruption-rate-per-h 0.5)
GPU=(bench/scenarios/gpu-large-v3.yaml --profile bench/profiles/derived-large-v3-a10g-l40s.json --model-bytes 3.1e9
     --spot-interruption-rate-per-h 0.05)
common=(--seed 1 --seeds 5 --slo-s 15 --start-warm)
"$TS" simulate "${CPU[@]}" --trace $TRACES/azure_llm_2023_code.csv --thin 0.03 "${common[@]}" --out bench/reports/sim-azure-code
"$TS" simulate "${CPU[@]}" --trace $TRACES/azure_llm_2023_conv.csv --thin 0.1 "${common[@]}" --out bench/reports/sim-azure-conv
"$TS" simulate "${GPU[@]}" --trace $TRACES/azure_llm_2023_code.csv --thin 0.3 "${common[@]}" --out bench/reports/sim-azure-code-gpu
"$TS" simulate "${GPU[@]}" --trace $TRACES/azure_llm_2023_conv.csv --thin 0.1 "${common[@]}" --out bench/reports/sim-azure-conv-gpu
"$TS" simulate "${GPU[@]}" --trace bench/traces/day_synthetic.csv "${common[@]}" --out bench/reports/sim-day-gpu
