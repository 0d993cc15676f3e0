#!/usr/bin/env bash
# The GPU checks in one script of at most 10 minutes (each step has its own bound):
#  1. the torch binding on real GPUs (NCCL for tensors, torchrun's agent store for evidence):
#     tests/gpu/gpu_worker.py under torchrun, one rank per GPU, then every case checked;
#  2. NCCL replay of an SDC bit flip (tests/gpu/replay_worker.py);
#  3. the GPU tensor signature (bench/signature_gpu.py): equal to the CPU signature of the same
#     bytes, every single-bit flip seen, and its bandwidth against a device-to-device copy
#     (goal >= 50 %), written to OUT_DIR/signature_gpu.json;
#  4. scout.attach on the example GPT with CUDA, an SDC on rank 1 and a restart
#     (tests/gpu/attach_gpu.sh).
# A failed check fails the script; a missed speed goal is printed and fails it too (exit 3)
# unless SCOUT_GPU_GOALS=report.
# Usage: tests/gpu/run_gpu_tests.sh [OUT_DIR]     (SCOUT_GPUS=<n> to use fewer GPUs)
#        SCOUT_TORCHRUN_DEVICE=cpu SCOUT_GPUS=4 tests/gpu/run_gpu_tests.sh   (gloo on CPU, no GPU)
set -euo pipefail
cd "$(dirname "$0")/../.."
if [ "${SCOUT_TORCHRUN_DEVICE:-cuda}" = cpu ]; then
    gpus="${SCOUT_GPUS:-4}"
else
    command -v nvidia-smi >/dev/null || { echo "run_gpu_tests.sh: no nvidia-smi: this host has no CUDA GPU (SCOUT_TORCHRUN_DEVICE=cpu runs gloo instead)" >&2; exit 2; }
    gpus="${SCOUT_GPUS:-$(nvidia-smi -L | grep -c '^GPU ' || true)}"
    [ "$gpus" -ge 1 ] || { echo "run_gpu_tests.sh: nvidia-smi lists no CUDA GPU" >&2; exit 2; }
fi
python="${PYTHON:-python}"
# scout's own dependencies must import (a CUDA image usually lacks transitions: carry its wheel
# and pip install --no-deps it, see requirements-dev.txt for the pinned version).
"$python" -c "import attrs, numpy, torch, transitions" || {
    echo "run_gpu_tests.sh: $python cannot import scout's dependencies (attrs, numpy, torch, transitions); install them first" >&2; exit 2; }
out="${1:-$(mktemp -d -t scout-gpu-XXXXXX)}"
mkdir -p "$out"
export OMP_NUM_THREADS=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
echo "run_gpu_tests.sh: $gpus rank(s), results in $out"
# Every wait inside is bounded; the outer timeout only guards against a broken install.
timeout 600 "$python" -m torch.distributed.run --standalone --nproc-per-node="$gpus" \
    -m tests.gpu.gpu_worker "$out"
"$python" -m tests.gpu.gpu_worker --check "$out" "$gpus"
# The replay SDC case (tests/gpu/replay_worker.py), unless SCOUT_CASES leaves it out.
case ",${SCOUT_CASES:-replay_sdc_bit_flip}," in *,replay_sdc_bit_flip,*)
    timeout 600 "$python" -m torch.distributed.run --standalone --nproc-per-node="$gpus" \
        -m tests.gpu.replay_worker "$out"
    "$python" -m tests.gpu.replay_worker --check "$out" "$gpus" ;;
esac
# The GPU signature: checks and benchmark (one GPU), unless SCOUT_CASES leaves it out.
case ",${SCOUT_CASES:-signature}," in *,signature,*)
    if [ "${SCOUT_TORCHRUN_DEVICE:-cuda}" = cpu ]; then
        echo "run_gpu_tests.sh: signature benchmark skipped (SCOUT_TORCHRUN_DEVICE=cpu)"
    else
        status=0
        timeout 240 "$python" bench/signature_gpu.py --output "$out/signature_gpu.json" || status=$?
        if [ "$status" -eq 3 ] && [ "${SCOUT_GPU_GOALS:-fail}" = report ]; then status=0; fi
        [ "$status" -eq 0 ] || { echo "run_gpu_tests.sh: signature_gpu.py exited $status" >&2; exit "$status"; }
    fi ;;
esac
# scout.attach on the example GPT with CUDA (tests/gpu/attach_gpu.sh), unless SCOUT_CASES leaves it out.
case ",${SCOUT_CASES:-attach}," in *,attach,*)
    if [ "${SCOUT_TORCHRUN_DEVICE:-cuda}" = cpu ]; then
        echo "run_gpu_tests.sh: attach case skipped (SCOUT_TORCHRUN_DEVICE=cpu)"
    else
        PYTHON="$python" tests/gpu/attach_gpu.sh "$out"
    fi ;;
esac
