#!/usr/bin/env bash
# Usage: bash benchmarks/gpu/run.sh DIR      on the GPU machine, DIR made by benchmarks/gpu/prepare.sh
#        bash benchmarks/gpu/run.sh --dry-run  anywhere: no install, one CPU rank, the GPU checks skipped
#
# Installs dtwork from DIR with no package index, then runs benchmarks/gpu/drive.py within 8 minutes,
# writing $OUT/gpu.json (the numbers, check by check) and $OUT/gpu.log (everything printed).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-$PWD/benchmarks/results/gpu}"
PY="${PYTHON:-python3}"
export PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
mkdir -p "$OUT"
log="$OUT/gpu.log"
if [ $# -lt 1 ]; then
  echo "usage: bash benchmarks/gpu/run.sh DIR|--dry-run [--ranks G]   (G: the GPUs, 1 by default)" >&2
  exit 2
fi
where="$1"
shift  # the rest goes to the driver (--ranks G)
t0=$(date +%s)
if [ "$where" = "--dry-run" ]; then
  drive=(--dry-run --budget "${DTWORK_GPU_BUDGET:-420}")
  : >"$log"
else
  if ! ls "$where"/dtwork-*.whl >/dev/null 2>&1; then
    echo "run.sh: no dtwork wheel in $where: run 'bash benchmarks/gpu/prepare.sh $where' on a machine with PyPI first" >&2
    exit 2
  fi
  drive=(--budget "${DTWORK_GPU_BUDGET:-400}")
  {
    echo "== $(date -u +%FT%TZ) install from $where"
    nvidia-smi -L
    "$PY" -m pip install --no-index --find-links "$where" --force-reinstall --no-deps "$where"/dtwork-*.whl &&
      "$PY" -m pip install --no-index --find-links "$where" dtwork
  } >"$log" 2>&1
  rc=$?
  tail -3 "$log"
  if [ $rc -ne 0 ]; then
    echo "{\"install\": {\"ok\": false, \"exit\": $rc, \"log\": \"gpu.log\"}}" >"$OUT/gpu.json"
    echo "run.sh: the install failed (exit $rc): see $log" >&2
    exit 1
  fi
  echo "== installed in $(($(date +%s) - t0)) s" >>"$log"
fi
# The whole drive stops at 8 minutes from the start; its checks have budgets inside that.
left=$((480 - ($(date +%s) - t0)))
timeout --signal=TERM --kill-after=20 "$left" "$PY" -m benchmarks.gpu.drive --out "$OUT" "${drive[@]}" "$@" 2>&1 | tee -a "$log"
rc=${PIPESTATUS[0]}
echo "run.sh: exit $rc after $(($(date +%s) - t0)) s; $OUT/gpu.json, $OUT/gpu.log" | tee -a "$log"
exit "$rc"
