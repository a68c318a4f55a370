#!/usr/bin/env bash
# The GPU checks in one command, run from the repository root on a machine with a GPU:
#   wheels the machine lacks in .whl, if any (`../shared/device/wheels.sh pymetis==2025.2.2
#   pytest-xdist==3.8.0 execnet==2.1.1 pytest-timeout==2.4.0`: pydantic and pymetis; xdist
#   spreads the suite over the cores), the real matrices where VBATCH_MATRICES says (default:
#   ../shared/data/matrices, as the tests);
#   every kernel compiled ahead (NVRTC, in parallel); the test suite PASSES times in a row
#   (default 2; the GPU tests only with GPU_ONLY=1; WORKERS pytest-xdist workers, default 8);
#   compute-sanitizer memcheck and racecheck over tests/gpu_sanitize.py, beside the suite.
# Logs go to $OUT or ./gpu-check. Exit status: the first failure's.
#   [PASSES=2] [GPU_ONLY=1] [WORKERS=8] bash benchmarks/gpu_check.sh [pytest args...]
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
export PYTHONUNBUFFERED=1 VBATCH_MATRICES=${VBATCH_MATRICES:-$PWD/../shared/data/matrices}
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
args=(-q -ra -p no:cacheprovider)
python3 -c "import xdist" 2>/dev/null && args+=(-n "${WORKERS:-8}")
[ "${GPU_ONLY:-0}" = 1 ] && args+=(-m gpu)
rc=0
for pass in $(seq "${PASSES:-2}"); do
  python3 -m pytest "${args[@]}" "$@" 2>&1 | tee "$out/pytest-$pass.log" | tail -8
  r1=${PIPESTATUS[0]}
  echo "pytest pass $pass: exit $r1; $(( $(date +%s) - t0 )) s"
  [ "$rc" = 0 ] && rc=$r1
done
wait $m $r
echo "total $(( $(date +%s) - t0 )) s"
for t in memcheck racecheck; do tail -4 "$out/$t.log"; done
exit "$rc"
