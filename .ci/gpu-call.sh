#!/bin/bash
# One device call of the GPU pass (README, "The GPU pass"), from the repository root on the GPU
# machine, with .whl/ carried (make gpu-wheels):
#
#   bash .ci/gpu-call.sh [1|2]                    command 1 or 2 of the planned pass (default 1)
#   bash .ci/gpu-call.sh custom SECONDS STEP...   only these steps, within SECONDS (a rerun)
#
# The plan is `python -m trainfast.gpu_pass --plan --budget $GPU_PASS_BUDGET` (default 900 s of
# device time): command 1 executes every page and runs every GPU test module, 8 at a time;
# command 2 runs the speedrun's GPU log, then the stale records, then the other benchmarks as
# far as the time goes. Run command 2 right after command 1 returns: the machine stays warm for
# 30 s, and a fresh one costs a minute or two of the same device time.
#
# It prints what the machine is (probe.txt), installs the wheels into $SITE once, exports
# TRAINFAST_COMMIT from .whl/COMMIT (the copy there has no .git; records store it), runs the
# command into $PASS_OUT with --resume, and returns in $OUT (at most 8 files, 16 MiB each): the
# summary, the records (book/records' GPU records, the pass record among them), the logs with
# the GPU tests' JUnit XML, and the executed notebooks (split into parts of 15 MiB where larger).
# DEVICE=cpu is the dry run of the same plan; GPU_CALL_EXTRA=--list lists a command's steps.
set -u
command=${1:-1}
case $command in
  1 | 2) ;;
  custom)
    seconds=${2:-}
    case $seconds in
      '' | *[!0-9]*) echo "usage: bash .ci/gpu-call.sh custom SECONDS STEP... (got SECONDS='$seconds')" >&2; exit 2 ;;
    esac
    shift 2
    if [ $# -eq 0 ]; then
      echo "usage: bash .ci/gpu-call.sh custom SECONDS STEP... (no STEP given)" >&2
      exit 2
    fi
    ;;
  *)
    echo "usage: bash .ci/gpu-call.sh [1|2] or custom SECONDS STEP... (got '$command')" >&2
    exit 2
    ;;
esac
OUT=${OUT:-/tmp/out}
PYTHON=${PYTHON:-python3}
SITE=${SITE:-/tmp/site}
PASS_OUT=${PASS_OUT:-gpu-pass}
DEVICE=${DEVICE:-cuda}
BUDGET=${GPU_PASS_BUDGET:-900}
mkdir -p "$OUT"

{
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>&1
  "$PYTHON" -c "import sys, numpy, torch
print('python', sys.version.split()[0], 'torch', torch.__version__, 'numpy', numpy.__version__)
try:
    import triton; print('triton', triton.__version__)
except ImportError as error: print('triton:', error)
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    print(torch.cuda.get_device_name(), 'SMs', p.multi_processor_count, 'L2', p.L2_cache_size, 'memory', p.total_memory)" 2>&1
} | tee "$OUT/probe.txt"
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
echo "gpu-call: commit ${TRAINFAST_COMMIT:-unknown}, command $command, device $DEVICE"

pass=("$PYTHON" -m trainfast.gpu_pass --out "$PASS_OUT" --device "$DEVICE" --resume)
if [ "$command" = custom ]; then
  "${pass[@]}" --budget "$seconds" --only "$@" ${GPU_CALL_EXTRA:-}
else
  "${pass[@]}" --command "$command" --budget "$BUDGET" ${GPU_CALL_EXTRA:-}
fi
status=$?
echo "gpu-call: command $command exited $status"

# what comes back: each part its own file, none over the tool's 16 MiB
cp "$PASS_OUT/summary.md" "$OUT/summary.md" 2>/dev/null
tar czf "$OUT/records.tgz" book/records/*--cuda--*.json "$PASS_OUT"/records 2>/dev/null
tar czf "$OUT/logs.tgz" "$PASS_OUT"/summary.json "$PASS_OUT"/logs "$PASS_OUT"/pytest-gpu 2>/dev/null
if [ -d "$PASS_OUT/notebooks" ]; then
  tar czf "$OUT/notebooks.tgz" "$PASS_OUT/notebooks" 2>/dev/null
  if [ "$(stat -c %s "$OUT/notebooks.tgz")" -gt $((15 << 20)) ]; then
    split -b 15M -d -a 1 "$OUT/notebooks.tgz" "$OUT/notebooks.tgz." && rm "$OUT/notebooks.tgz"
  fi
fi
cut -c1-220 "$PASS_OUT/summary.md" 2>/dev/null | head -80
exit $status
