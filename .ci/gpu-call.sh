#!/bin/bash
# One device call of the GPU pass (README, "The GPU pass"), from the repository root on the GPU
# machine, with .whl/ carried (make gpu-wheels):
#
#   bash .ci/gpu-call.sh SECONDS [PART...]
#
# SECONDS is the wall time this call may use; PARTs (default all, in this order) are
#   compile-report  the live compile report
#   pytest-gpu      pytest -m gpu, one step per test module
#   measure         the benchmarks: PRIORITY first, then the others in pass order
#   measure-new     the PRIORITY benchmarks alone
#   chapter         every chapter executed as a notebook
# or one step (`chapter:profiling`, `pytest-gpu:test_profiling`, `measure:roofline`); several
# calls with their own PASS_OUT and OUT can run side by side where timings do not matter.
# each one `python -m trainfast.gpu_pass --resume --budget <what is left>` into gpu-pass/.
# After each, gpu-pass/ and book/records are tarred into $OUT/gp.tgz, so a call cut short still
# returns what it finished. Extra arguments for every invocation: GPU_CALL_EXTRA (--list checks
# the plan without running it).
set -u
total=${1:-}
case $total in
  '' | *[!0-9]*) echo "usage: bash .ci/gpu-call.sh SECONDS [PART...] (got SECONDS='$total')" >&2; exit 2 ;;
esac
shift
parts=${*:-compile-report pytest-gpu measure chapter}
for part in $parts; do
  case $part in
    compile-report | pytest-gpu | measure | measure-new | chapter) ;;
    chapter:* | pytest-gpu:* | measure:*) ;;
    *)
      echo "gpu-call: unknown part '$part' (compile-report pytest-gpu measure measure-new" \
        "chapter, or one step such as chapter:profiling)" >&2
      exit 2
      ;;
  esac
done
end=$((SECONDS + total))
OUT=${OUT:-/tmp/out}
PYTHON=${PYTHON:-python3}
SITE=${SITE:-/tmp/site}
PASS_OUT=${PASS_OUT:-gpu-pass}
mkdir -p "$OUT"

# the benchmarks to measure first (2026-11-26): profiling-case-study again (its record's loader
# with workers trained on other batches than the baseline's, since fixed), then speedrun, which
# has no GPU record (killed at 240 s, its target unreachable, since lowered; it now writes each
# entry as it finishes), then timing-pitfalls (its record's warm and cold sums timed launches,
# not the cache: cold_and_warm now hides them); the process-group benchmarks (measure.PROCESS_GROUPS) report "not
# available" on one GPU
PRIORITY="profiling-case-study speedrun timing-pitfalls"
# limits in seconds. The H100 (2026-11-26) took 16 s for the compile report, 4-98 s per
# benchmark (profiling-case-study 75, scaling-study 98), and the GPU tests 8 s
# (test_mixed_precision), 35 s (test_profiling), 194 s (test_memory_hierarchy); the chapters that
# ran to the end 52-67 s (four side by side). The speedrun's baseline: 0.17 s a step (2 x 800 at most)
LIMITS=(--timeout compile-report=60 --timeout pytest-gpu=90
  --timeout pytest-gpu:test_memory_hierarchy=240 --timeout measure=90
  --timeout measure:speedrun=420 --timeout measure:scaling-study=150
  --timeout measure:profiling-case-study=120 --timeout chapter=200)

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1 | tee "$OUT/nvsmi.txt"
if [ ! -d "$SITE" ]; then
  "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" \
    .whl/*.whl 2>&1 | tail -3
fi
# PYTHONDONTWRITEBYTECODE would make every step compile every module it imports again
unset PYTHONDONTWRITEBYTECODE
export PYTHONPATH=$SITE:$PWD/code PYTHONUNBUFFERED=1 WANDB_MODE=offline WANDB_SILENT=true
export PYTEST_ADDOPTS="--durations=20"
if [ -s .whl/COMMIT ]; then
  export TRAINFAST_COMMIT=$(cat .whl/COMMIT)
else
  echo "gpu-call: no .whl/COMMIT (make gpu-wheels writes it): records get no source_commit" >&2
fi
echo "gpu-call: commit ${TRAINFAST_COMMIT:-unknown}, parts: $parts, $total s"

left() { echo $((end - SECONDS - 20)); } # 20 s for the last tar and the summary
for part in $parts; do
  only=("$part")
  [ "$part" = measure ] && only=($(printf 'measure:%s ' $PRIORITY) measure)
  [ "$part" = measure-new ] && only=($(printf 'measure:%s ' $PRIORITY))
  budget=$(left)
  if [ "$budget" -le 0 ]; then
    echo "gpu-call: $part: no time left"
    continue
  fi
  "$PYTHON" -m trainfast.gpu_pass --out "$PASS_OUT" --device cuda --resume --budget "$budget" \
    "${LIMITS[@]}" --only "${only[@]}" ${GPU_CALL_EXTRA:-}
  echo "gpu-call: $part exited $? with $(left) s left"
  tar czf "$OUT/gp.tgz" "$PASS_OUT" book/records 2>/dev/null
done
cut -c1-220 "$PASS_OUT/summary.md" 2>/dev/null | head -80
