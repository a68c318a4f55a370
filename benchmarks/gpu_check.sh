#!/usr/bin/env bash
# The GPU machine's checks, in one command (device tool; run from the repository root):
#   wheels carried in .whl (`../shared/device/wheels.sh pymetis==2025.2.2`: the image lacks
#   pydantic and pymetis), real matrices in .dbg/matrices;
#   every kernel compiled ahead (NVRTC, in parallel); the whole test suite; compute-sanitizer
#   memcheck and racecheck over tests/gpu_sanitize.py, run beside the suite to fit the lease.
# Logs go to $OUT (the device tool's folder) or ./gpu-check. Exit status: the first failure's.
#   bash benchmarks/gpu_check.sh [pytest args...]
set -uo pipefail
out=${OUT:-gpu-check}
mkdir -p "$out"
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD
fi
# Without these the sparse tests, the multifrontal example and the sanitizer script stop at an
# import after minutes of device time: say so before spending any.
python3 -c 'import pydantic, pymetis' || {
  echo "gpu_check: carry the wheels of pydantic and pymetis in .whl (see the top of this file)" >&2
  exit 1
}
export PYTHONUNBUFFERED=1 VBATCH_MATRICES=${VBATCH_MATRICES:-$PWD/.dbg/matrices}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
t0=$(date +%s)
python3 -m vbatch compile --jobs "$(nproc)" 2>&1 | tail -1
echo "compile: $(( $(date +%s) - t0 )) s"

san() {  # tool
  compute-sanitizer --tool "$1" --error-exitcode 9 python3 tests/gpu_sanitize.py \
    >"$out/$1.log" 2>&1
  echo "$1: exit $? ($(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|sanitize batch' "$out/$1.log" \
    | tr '\n' ' '))"
}
san memcheck & m=$!
san racecheck & r=$!
python3 -m pytest -q -ra "$@" 2>&1 | tee "$out/pytest.log" | tail -25
rc=${PIPESTATUS[0]}
wait $m $r
echo "pytest: exit $rc; total $(( $(date +%s) - t0 )) s"
for t in memcheck racecheck; do tail -4 "$out/$t.log"; done
exit "$rc"
