#!/usr/bin/env bash
# scout.attach on CUDA: the example GPT under torchrun on this host's GPU(s) -- NCCL with one GPU
# per rank, gloo when 2 ranks share one GPU -- with an SDC injected on rank 1 and on_sdc=restart.
# Checks that replay on the GPU attributes it, the job restarts from a recovery-verified
# checkpoint older than the corruption, and finishes. Called by run_gpu_tests.sh; bounded.
# Usage: tests/gpu/attach_gpu.sh OUT_DIR
set -euo pipefail
cd "$(dirname "$0")/../.."
out="${1:?usage: attach_gpu.sh OUT_DIR}"
python="${PYTHON:-python}"
gpus="$(nvidia-smi -L | grep -c '^GPU ' || true)"
ranks=$(( gpus >= 2 ? gpus : 2 ))
rm -rf "$out/attach"
mkdir -p "$out/attach"
echo "attach_gpu.sh: $ranks rank(s) on $gpus GPU(s)"
TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 SCOUT_ON_SDC=restart CUBLAS_WORKSPACE_CONFIG=:4096:8 OMP_NUM_THREADS=1 \
    timeout 300 "$python" -m torch.distributed.run --standalone --nproc-per-node="$ranks" --max-restarts 1 \
    examples/train_gpt.py --device cuda --steps 100 --run-dir "$out/attach/run" \
    --checkpoint-dir "$out/attach/ckpt" --fault sdc:1:57
"$python" - "$out/attach/run" <<'PY'
import sys
from scout import reports
records = reports.read_records(sys.argv[1] + "/reports.jsonl")
sdc = [r for r in records if r["kind"] == "sdc"]
restored = [r for r in records if r["kind"] == "restart" and r["reason"] == "restored"]
finished = [r for r in records if r["kind"] == "finished"]
ok = (len(sdc) == 1 and sdc[0]["ranks"] == [1] and len(restored) == 1 and restored[0]["step"] < 57
      and restored[0]["evidence"]["choice"] == "verified" and finished and finished[-1]["step"] == 100)
print("attach_gpu: sdc", [(r["ranks"], r["step"]) for r in sdc], "restored", [r["step"] for r in restored],
      "ok" if ok else "FAILED")
sys.exit(0 if ok else 1)
PY
