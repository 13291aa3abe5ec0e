#!/usr/bin/env bash
# The GPU machine's checks, a stage per call so that each fits one device command (at most 10 minutes):
#
#   bash benchmarks/gpu_check.sh suite      # build, then the GPU test suite (all but the two-GPU sharded tests)
#   bash benchmarks/gpu_check.sh memcheck   # compute-sanitizer memcheck over the lookup, build, partition and
#                                           # out-of-core (zero-copy, node chunk) tests and the one-GPU sharded test
#   bash benchmarks/gpu_check.sh small      # small-batch bench (2^24 keys) and its breakdown
#   bash benchmarks/gpu_check.sh sharded    # two GPUs: the NCCL tests and the sharded bench
#
# Logs and JSON go to $OUT (the device tool's folder) or benchmarks/results/<GPU>/ otherwise, named by commit.
# The build lands in .build (TORCH_RTINDEX_BUILD_DIR), so a warm machine reuses it across stages.
set -uo pipefail
cd "$(dirname "$0")/.."
export TORCH_RTINDEX_BUILD_DIR="${TORCH_RTINDEX_BUILD_DIR:-$PWD/.build}" PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
# NVLink multicast stays off on the multi-GPU machines, also in every process started from here.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
commit="${RTINDEX_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}"
export RTINDEX_COMMIT="$commit"
gpu="$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tr ' ' '_')"
out="${OUT:-benchmarks/results/$gpu}"
mkdir -p "$out"
log() { tee -a "$out/$1"; }
header() { echo "# $(date -u +%FT%TZ) commit $commit, $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1), $*"; }

case "${1:-}" in
  suite)
    { header "GPU suite"; python3 -c "import torch, torch_rtindex; print(torch.__version__, torch.cuda.get_device_name())"
      python3 -m pytest tests -q -x -p no:cacheprovider --ignore=tests/test_sharded.py; echo "rc=$?"; } 2>&1 | log "pytest_$commit.log"
    ;;
  memcheck)
    { header "memcheck"
      compute-sanitizer --tool memcheck --error-exitcode 3 python3 -m pytest -q -x -p no:cacheprovider \
        tests/test_opcheck.py tests/test_partition.py tests/test_chunked.py tests/test_errors.py \
        -k "cuda and (cgrx_build or cgrx_lookups or rx_lookup or lookup_rows or partition or pack or scatter or zero_copy or updatable or operators_check)"
      echo "rc=$?"
      # The sharded lookups through NCCL with one rank (its worker process is checked too).
      compute-sanitizer --tool memcheck --error-exitcode 3 --target-processes all \
        python3 -m pytest -q -x -p no:cacheprovider tests/test_sharded.py -k one_gpu
      echo "rc=$?"; } 2>&1 | log "memcheck_$commit.log"
    ;;
  small)
    { header "small batches"
      python3 benchmarks/small_batch_bench.py --log-keys 24 --log-queries 4 10 14 17 20 24 --out "$out"
      python3 benchmarks/small_batch_bench.py --breakdown --log-keys 24 --log-queries 4 14
      echo "rc=$?"; } 2>&1 | log "small_batch_$commit.log"
    ;;
  sharded)
    { header "sharded, $(nvidia-smi -L | wc -l) GPUs"
      RTINDEX_WORKER_TRACE=1 python3 -m pytest tests/test_sharded.py -q -x -p no:cacheprovider -k nccl_two_gpus
      torchrun --nproc-per-node="$(nvidia-smi -L | wc -l)" benchmarks/sharded_bench.py --modes weak,strong \
        --pipeline 4 --repeats 3 --out-dir "$out"
      echo "rc=$?"; } 2>&1 | log "sharded_$commit.log"
    ;;
  *)
    echo "usage: bash benchmarks/gpu_check.sh suite|memcheck|small|sharded" >&2
    exit 2
    ;;
esac
