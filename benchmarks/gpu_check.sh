#!/usr/bin/env bash
# GPU check: build from source on the GPU machine, run the GPU tests, then the GPU benchmarks,
# writing results into the folder given as $1 (within 8 minutes on one H200):
#   env.txt (GPU, toolkit, versions, kernel resource usage), gpu_check.log, gpu_tests.xml,
#   bench_gpu_step.json, gpu_decode_check.json, bench_gpu_dream.json (+ .png), ops_tests.xml; then the opt-in kernels
#   ("candidates", python/blockbatch/settings.py): candidate_tests_*.xml, bench_gpu_candidates.json,
#   gpu_decode_candidates.json; the batching scheduler on CUDA (BLOCKBATCH_CUDA_BATCHING=graphs, the default / 1):
#   cuda_batching_tests.xml, bench_batch_{toy_fp32,toy_bf16,toy_fp32_eager,toy_bf16_invariant}.json, then
#   (batching8b) bench_batch_{llada8b,llada8b_eager,llada8b_invariant}.json (+ .png); (paged) paged_tests.xml and
#   bench_paged_gpu.json: the paged-KV kernels against the dense ones (ALGORITHMS.md 12); a short table ends the log.
#   bash benchmarks/gpu_check.sh "$OUT" [PARTS]
# PARTS: a comma-separated subset of tests,batching,batching8b,bench,decode,dream,ops,paged,candidates (default: all of
# them, in that order; the build always runs), e.g. "tests,batching" when a session's time is short.
# Every stage has its own time limit and writes as it goes, so a stage that fails or runs long
# costs only itself. The candidates run last, each stage in its own process: a faulting kernel
# poisons its process's CUDA context, and a hung one only uses up its stage's limit.
set -uo pipefail
OUT="${1:?usage: gpu_check.sh OUT_DIR [PARTS]}"
PARTS=",${2:-tests,batching,batching8b,bench,decode,dream,ops,paged,candidates},"
for part in ${2:+${2//,/ }}; do
  case "$part" in tests|batching|batching8b|bench|decode|dream|ops|paged|candidates) ;;
    *) echo "gpu_check.sh: unknown part '$part' (tests, batching, batching8b, bench, decode, dream, ops, paged, candidates)" >&2; exit 2;;
  esac
done
want() { [[ "$PARTS" == *",$1,"* ]]; }
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
# CUDA_HOME: the toolkit root (holding include/cuda_runtime.h): as given, else /usr/local/cuda,
# else the one above the nvcc on PATH, else the one torch finds.
if [ -z "${CUDA_HOME:-}" ] || [ ! -f "$CUDA_HOME/include/cuda_runtime.h" ]; then
  for c in /usr/local/cuda "$(dirname "$(dirname "$(command -v nvcc 2>/dev/null || echo /x/x)")")" \
           "$($PY -c 'from torch.utils.cpp_extension import CUDA_HOME; print(CUDA_HOME or "")' 2>/dev/null)"; do
    if [ -n "$c" ] && [ -f "$c/include/cuda_runtime.h" ]; then CUDA_HOME="$c"; break; fi
  done
fi
export CUDA_HOME TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-9.0a}" MAX_JOBS="${MAX_JOBS:-16}"
export PYTHONUNBUFFERED=1
{
  echo "CUDA_HOME=${CUDA_HOME:-not found} TORCH_CUDA_ARCH_LIST=$TORCH_CUDA_ARCH_LIST"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv
  "$PY" -c "import sys, torch; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda)"
  cmake --version | head -1
  "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc" --version | tail -1
} > "$OUT/env.txt" 2>&1
{
  echo "== build ($(date +%T))"
  if ! timeout 240 "$PY" -m pip install --no-build-isolation --no-deps -e .; then
    echo "pip install failed: building in place instead"
    timeout 240 "$PY" setup.py build_ext || { echo "BUILD FAILED"; exit 1; }
    cp "$(ls -t build/cmake-*-cuda/out/_C.so | head -1)" python/blockbatch/_C.so || exit 1
    export PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}"
  fi
  "$PY" -c "import torch, blockbatch.native; assert torch._C._dispatch_has_kernel_for_dispatch_key('blockbatch::packed_attention', 'CUDA'), 'the build has no CUDA kernels (CUDA_HOME=$CUDA_HOME)'; print('CUDA kernels registered')" || exit 1
  so="$(ls build/cmake-*-cuda/out/_C.so 2>/dev/null | head -1)"
  if [ -n "$so" ] && command -v cuobjdump > /dev/null; then
    { echo "== SASS of $so: tensor-core (HMMA) and local-memory (LDL/STL) instructions"
      cuobjdump --dump-sass "$so" | grep -oE "\b(HMMA|HGMMA|LDL|STL)\b" | sort | uniq -c
      echo "== resource usage"; cuobjdump --dump-resource-usage "$so" | grep -E "Function|REG" | head -200; } >> "$OUT/env.txt" 2>&1
  fi
  if want tests; then
    echo "== GPU tests ($(date +%T))"
    timeout 150 "$PY" -m pytest -q --tb=short tests/cuda/test_cuda.py -m "not candidate" --junitxml="$OUT/gpu_tests.xml"
  fi
  if want batching; then
    # The scheduler on CUDA (=graphs the default, =1 eager steps): its tests, then throughput and agreement vs one
    # by one (bench_batch.py sets BLOCKBATCH_CUDA_BATCHING from --cuda-batching): the toy in float32 and bf16, and
    # LLaDA-8B's shape in bf16 (the issue's GPU target: 6x one by one for dual at batch 16,
    # BlockBatch-auto within 10% of dual).
    echo "== the batching scheduler on CUDA: tests ($(date +%T))"
    timeout 120 "$PY" -m pytest -q -s --tb=short tests/cuda/test_cuda_batching.py \
      --junitxml="$OUT/cuda_batching_tests.xml"
    echo "== the batching scheduler on CUDA: toy, float32 and bf16 ($(date +%T))"
    timeout 60 "$PY" benchmarks/bench_batch.py --device cuda --repeats 1 --model toy --dtype float32 --n 32 --batches 1,16 \
      --policies dual,blockbatch --out "$OUT/bench_batch_toy_fp32.json"
    timeout 60 "$PY" benchmarks/bench_batch.py --device cuda --repeats 1 --model toy --dtype bfloat16 --n 32 --batches 1,16 \
      --policies dual,blockbatch --out "$OUT/bench_batch_toy_bf16.json"
    timeout 60 "$PY" benchmarks/bench_batch.py --device cuda --repeats 1 --model toy --dtype float32 --n 32 --batches 1,16 \
      --policies dual,blockbatch --cuda-batching 1 --out "$OUT/bench_batch_toy_fp32_eager.json"
    BLOCKBATCH_BATCH_INVARIANT=1 timeout 60 "$PY" benchmarks/bench_batch.py --device cuda --repeats 1 --model toy --dtype bfloat16 \
      --n 32 --batches 1,16 --policies dual,blockbatch --out "$OUT/bench_batch_toy_bf16_invariant.json"
  fi
  if want batching8b; then
    echo "== the batching scheduler on CUDA: LLaDA-8B shape, bf16 ($(date +%T))"
    timeout 200 "$PY" benchmarks/bench_batch.py --device cuda --repeats 1 --model llada-8b --n 16 --batches 1,4,16 \
      --policies dual,blockbatch,blockbatch-auto --gen-length 64 --out "$OUT/bench_batch_llada8b.json"
    timeout 150 "$PY" benchmarks/bench_batch.py --device cuda --repeats 1 --model llada-8b --n 16 --batches 1,16 \
      --policies dual,blockbatch-auto --gen-length 64 --cuda-batching 1 --out "$OUT/bench_batch_llada8b_eager.json"
    BLOCKBATCH_BATCH_INVARIANT=1 timeout 120 "$PY" benchmarks/bench_batch.py --device cuda --repeats 1 --model llada-8b --n 16 \
      --batches 16 --policies dual --gen-length 64 --out "$OUT/bench_batch_llada8b_invariant.json"
  fi
  if want bench; then
    echo "== GPU benchmarks ($(date +%T))"
    timeout 180 "$PY" benchmarks/bench_gpu_step.py --out "$OUT"
  fi
  if want decode; then
    echo "== GPU decode check ($(date +%T))"
    timeout 100 "$PY" benchmarks/gpu_decode_check.py --out "$OUT" --n 50
  fi
  if want dream; then
    echo "== Dream-7B vs LLaDA-8B shape: steps and Dream decodes, bf16 ($(date +%T))"
    timeout 150 "$PY" benchmarks/bench_gpu_dream.py --out "$OUT"
  fi
  if want ops; then
    echo "== op checks with the CUDA build ($(date +%T))"
    timeout 90 "$PY" -m pytest -q --tb=short -p no:logging tests/ops/test_ops.py --junitxml="$OUT/ops_tests.xml"
  fi
  if want paged; then
    echo "== paged KV: the kernels through page tables against the dense ones ($(date +%T))"
    timeout 90 "$PY" -m pytest -q --tb=short -p no:logging tests/cuda/test_cuda.py -k paged --junitxml="$OUT/paged_tests.xml"
    timeout 90 "$PY" benchmarks/bench_paged.py --parts pages --device cuda --repeats 40 --out "$OUT/bench_paged_gpu.json"
  fi
  if ! want candidates; then
    echo "== done ($(date +%T))"
    exit 0
  fi
  # One process per candidate: a kernel that faults ends its process's CUDA context, and would
  # otherwise fail every candidate test after it.
  # The groups (name:pytest -k expression) come from the settings table (python/blockbatch/settings.py).
  hung=0
  others=""
  mapfile -t groups < <("$PY" python/blockbatch/settings.py test-groups)
  for group in ${groups[@]+"${groups[@]}"}; do
    name="${group%%:*}" expr="${group#*:}"
    others="${others:+$others or }$expr"
    echo "== candidates: GPU tests of $name ($(date +%T))"
    timeout 60 "$PY" -m pytest -q --tb=short tests/cuda/test_cuda.py -m candidate -k "$expr" \
      --junitxml="$OUT/candidate_tests_$name.xml"
    [ $? -eq 124 ] && hung=1
  done
  echo "== candidates: any other GPU tests ($(date +%T))"
  timeout 60 "$PY" -m pytest -q --tb=short tests/cuda/test_cuda.py -m candidate -k "not (${others:-nothing_else})" \
    --junitxml="$OUT/candidate_tests_others.xml"
  [ $? -eq 124 ] && hung=1
  if [ $hung -eq 1 ]; then  # a candidate kernel hangs: its benchmarks would only hang again
    echo "candidate tests timed out: the candidate benchmarks are skipped"
  else
    echo "== candidates: step benchmarks and GEMM sweep ($(date +%T))"
    timeout 150 "$PY" benchmarks/bench_gpu_step.py --out "$OUT" --part candidates
    echo "== candidates: decode check ($(date +%T))"
    timeout 60 "$PY" benchmarks/gpu_decode_check.py --out "$OUT" --n 50 --candidates
  fi
  echo "== done ($(date +%T))"
} 2>&1 | tee "$OUT/gpu_check.log"
echo "== summary" | tee -a "$OUT/gpu_check.log"
"$PY" benchmarks/gpu_summary.py "$OUT" 2>&1 | tee -a "$OUT/gpu_check.log"
