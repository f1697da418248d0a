#!/usr/bin/env bash
# Usage: bash benchmarks/gpu/prepare.sh DIR
#
# On any machine that reaches PyPI: puts into DIR the wheels the GPU machine lacks for dtwork (CPython
# 3.12, manylinux x86-64; what its image already holds, benchmarks/gpu/image.txt, is not fetched) and
# dtwork's own wheel, then checks the set is complete and small enough to travel with one device call.
# DIR may hold an earlier set: what is still wanted stays, dtwork's wheel is built afresh.
set -euo pipefail
if [ $# -ne 1 ] || [ "${1#-}" != "$1" ]; then
  echo "usage: bash benchmarks/gpu/prepare.sh DIR   (DIR: a folder inside the checkout, e.g. .gpu-wheels)" >&2
  exit 2
fi
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
HERE="$ROOT/benchmarks/gpu"
DIR="$1"
PY="${PYTHON:-python3}"
LIMIT_MIB="${DTWORK_WHEELS_LIMIT_MIB:-60}"  # a device call carries 64 MiB, the checkout (~3 MiB) included
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
mkdir -p "$DIR"
t0=$(date +%s)

# dtwork itself: pure Python, so one wheel fits every interpreter.
rm -f "$DIR"/dtwork-*.whl
"$PY" -m pip wheel -q --no-deps --no-build-isolation -w "$DIR" "$ROOT" \
  || "$PY" -m pip wheel -q --no-deps -w "$DIR" "$ROOT"

# The target's tags: pip matches a manylinux_2_N tag only for the N named, so every N up to the image's.
platforms=(--platform manylinux1_x86_64 --platform manylinux2010_x86_64 --platform manylinux2014_x86_64)
for n in $(seq 5 39); do platforms+=(--platform "manylinux_2_${n}_x86_64"); done
target=(--only-binary=:all: --python-version 3.12 --implementation cp --abi cp312 --abi abi3 --abi none)

# Fetch what the wheels ask for and neither DIR nor the image holds, until nothing more is asked.
for round in $(seq 1 25); do
  mapfile -t need < <("$PY" "$HERE/complete.py" "$DIR" --missing)
  [ "${#need[@]}" -eq 0 ] && break
  echo "prepare.sh: round $round: fetching ${need[*]}"
  "$PY" -m pip download -q --no-deps "${target[@]}" "${platforms[@]}" -d "$DIR" "${need[@]}"
done

"$PY" "$HERE/complete.py" "$DIR"
bytes=$(find "$DIR" -maxdepth 1 -name '*.whl' -printf '%s\n' | awk '{s += $1} END {print s + 0}')
mib=$(awk -v b="$bytes" 'BEGIN {printf "%.1f", b / 1048576}')
n=$(find "$DIR" -maxdepth 1 -name '*.whl' | wc -l)
if [ "$bytes" -gt $((LIMIT_MIB * 1048576)) ]; then
  echo "prepare.sh: $n wheels, $mib MiB: over the $LIMIT_MIB MiB a device call can carry beside the checkout;" \
    "drop a dependency or split the set" >&2
  find "$DIR" -maxdepth 1 -name '*.whl' -printf '%s %f\n' | sort -rn | head -5 >&2
  exit 1
fi
echo "prepare.sh: $n wheels, $mib MiB (limit $LIMIT_MIB MiB), complete, in $(($(date +%s) - t0)) s: $DIR"
