#!/usr/bin/env bash
# The torch binding on real GPUs: NCCL for tensors, torchrun's agent store for evidence.
# Runs tests/gpu/gpu_worker.py under torchrun, one rank per GPU, then checks every case.
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
out="${1:-$(mktemp -d -t scout-gpu-XXXXXX)}"
mkdir -p "$out"
python="${PYTHON:-python}"
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
