#!/usr/bin/env bash
# The GPU machine's checks, a stage per call so that each fits one device command (at most 10 minutes):
#
#   bash benchmarks/gpu_check.sh suite      # build, then the GPU test suite (all but the process-group tests)
#   bash benchmarks/gpu_check.sh memcheck   # compute-sanitizer memcheck over the lookup, build, range count,
#                                           # partition and out-of-core (zero-copy, in-place, node chunk) tests and the
#                                           # one-GPU sharded test
#   bash benchmarks/gpu_check.sh small      # small-batch bench (2^24 keys) and its breakdown
#   bash benchmarks/gpu_check.sh cgrx       # 2^26 keys, 2^27 lookups: the radix and binary-search backends at the
#                                           # default bucket size, the hash table, the sorted array, range lookups
#                                           # and range counts of 4 / 64 / 1024 hits (a few minutes)
#   bash benchmarks/gpu_check.sh skew       # the cgRX grid's radix and binary-search rows over clustered keys (a dense
#                                           # run plus a sparse tail: one wide slice of the radix table)
#   bash benchmarks/gpu_check.sh floor      # the random-read floor of a point lookup (1 / 2 / 4 sectors) next to
#                                           # cgRX radix (also with its table in the L2 set-aside) and the hash
#                                           # table, 2^24 and 2^26 keys, 2^27 lookups
#   bash benchmarks/gpu_check.sh chunked    # out of core: 2^30 keys, every serving mode
#   bash benchmarks/gpu_check.sh chunked31  # out of core on an H200: 2^31 keys (its host holds them, the in-core
#                                           # index fits its GPU for the comparison), uniform and Zipf 1.2
#   bash benchmarks/gpu_check.sh chunked_hot  # out of core, 2^30 keys, Zipf batches: a tier of 2^26 keys learned
#                                           # against the same tier given the law's hottest keys (warm)
#   bash benchmarks/gpu_check.sh uniform27  # out of core, 2^30 keys, the chunked stage's configuration: six uniform 2^27
#                                           # batches, the hybrid against the GPU alone on the same batches and the
#                                           # in-core index (issue 44's copy-floor target; ~4 min)
#   bash benchmarks/gpu_check.sh updates    # out-of-core updates: node vs read-only chunks
#   bash benchmarks/gpu_check.sh sharded    # two GPUs: the NCCL tests, memcheck over the sharded bench's forms at
#                                           # small sizes, and the bench (NCCL at high priority, 8 chunks, traced)
#   bash benchmarks/gpu_check.sh scaling    # 2+ GPUs: the bench on two GPUs and on all (weak and strong)
#   bash benchmarks/gpu_check.sh sharded_embedding  # 2+ GPUs: 2^10 / 2^14 / 2^17 IDs per rank per call (2^24 keys per
#                                           # rank), eager and CUDA-graph replay, against two plain all-to-alls
#
# Logs and JSON go to $OUT (the device tool's folder) or benchmarks/results/<GPU>/ otherwise, named by commit.
# The build lands in .build (TORCH_RTINDEX_BUILD_DIR), so a warm machine reuses it across stages.
set -uo pipefail
cd "$(dirname "$0")/.."
export TORCH_RTINDEX_BUILD_DIR="${TORCH_RTINDEX_BUILD_DIR:-$PWD/.build}" PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
# NVLink multicast stays off on the multi-GPU machines, also in every process started from here.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
# Unbuffered, so that a stage cut by a `timeout` still leaves the lines it printed in its log.
export PYTHONUNBUFFERED=1
# The benchmarks' own JIT extensions (hash table, gather floor) build in the build folder too (baselines/), so a
# warm machine reuses them, under a build lock: a build killed by a `timeout` blocks no later one.
# "-dirty": the tree is not that commit (the device machine's copy can carry a stale .git: pass RTINDEX_COMMIT).
commit="${RTINDEX_COMMIT:-$(git describe --always --dirty --abbrev=7 2>/dev/null || echo unknown)}"
export RTINDEX_COMMIT="$commit"
gpu="$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tr ' ' '_')"
out="${OUT:-benchmarks/results/$gpu}"
mkdir -p "$out"
log() { tee -a "$out/$1"; }
header() { echo "# $(date -u +%FT%TZ) commit $commit, $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1), $*"; }

case "${1:-}" in
  suite)
    { header "GPU suite"; python3 -c "import torch, torch_rtindex; print(torch.__version__, torch.cuda.get_device_name())"
      # The process-group tests run in the sharded stage; the CPU wheel's build runs in CI.
      python3 -m pytest tests -q --maxfail=5 -p no:cacheprovider --durations=5 --ignore=tests/test_sharded.py \
        --ignore=tests/test_sharded_updates.py --ignore=tests/test_sharded_contract.py \
        --ignore=tests/test_conformance_sharded.py --ignore=tests/test_dist_harness.py --ignore=tests/test_wheel.py
      echo "rc=$?"; } 2>&1 | log "pytest_$commit.log"
    ;;
  memcheck)
    # Under the sanitizer a test runs 10-50x slower, so the stage picks the CUDA tests of every kernel family
    # (lookups of each backend, range counts, node-chunk updates, zero-copy serving) and of the CPU's answers
    # crossing to the GPU, rather than the suite.
    { header "memcheck"
      compute-sanitizer --tool memcheck --error-exitcode 3 python3 -m pytest -q -p no:cacheprovider \
        tests/test_opcheck.py tests/test_cgrx.py tests/test_chunked.py tests/test_chunked_queues.py \
        tests/test_chunked_updates.py tests/test_partition.py tests/test_chunked_ship.py \
        -k "(cuda and (cgrx_build or cgrx_lookups or rx_lookup or cgrx_cuda_values or range_count_at_the_edges or updatable_random_sequences or read_in_place or partition or pack or scatter or global_rows or answered_in_groups or queues_operator)) or zero_copy_serving or chunked_ship"
      echo "rc=$?"
      # The sharded lookups through NCCL with one rank, one GPU (its worker process is checked too). NCCL's start-up asks
      # for kernel images of other architectures and handles the refusal: API errors are not reported here.
      CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0} compute-sanitizer --tool memcheck --error-exitcode 3 \
        --target-processes all --report-api-errors no \
        python3 -m pytest -q -p no:cacheprovider tests/test_sharded.py -k "nccl_key_set or nccl_case"
      echo "rc=$?"; } 2>&1 | log "memcheck_$commit.log"
    ;;
  small)
    { header "small batches"
      # Eager and graph replay at every size; the compiled columns (slow to compile) at two sizes.
      python3 benchmarks/small_batch_bench.py --no-compile --log-keys 24 --log-queries 4 10 14 17 20 24 --out "$out"
      python3 benchmarks/small_batch_bench.py --log-keys 24 --log-queries 4 14 --out "$out/compiled"
      python3 benchmarks/small_batch_bench.py --breakdown --log-keys 24 --log-queries 4 14
      echo "rc=$?"; } 2>&1 | log "small_batch_$commit.log"
    ;;
  cgrx)
    { header "cgRX grid"
      python3 benchmarks/cgrx_bench.py --hash-table --range-hits 4,64,1024 --backends radix,binary_search --bucket-sizes 16
      echo "rc=$?"; } 2>&1 | log "cgrx_bench_$commit.log"
    ;;
  skew)
    { header "cgRX grid, clustered keys"
      python3 benchmarks/cgrx_bench.py --dist clustered --hash-table --range-hits 4,64 --backends radix,binary_search --bucket-sizes 16
      echo "rc=$?"; } 2>&1 | log "cgrx_bench_clustered_$commit.log"
    ;;
  floor)
    { header "random-read floor"
      for k in 24 26; do python3 benchmarks/gather_floor.py --log-keys "$k" --out "$out"; done
      echo "rc=$?"; } 2>&1 | log "gather_floor_$commit.log"
    ;;
  chunked)
    # The out-of-core grid alone fills most of a call (about 6-7 minutes with the no_in_place rows).
    { header "out of core"
      timeout 560 python3 benchmarks/chunked_bench.py --log-keys 30 --log-lookups 20,24,27 --zipf 0.99,1.2 \
        --repeats 2 --train-batches 2 --cpu-max-log-lookups 20 --zero-copy-max-log-lookups 20 --out "$out"
      echo "rc=$?"; } 2>&1 | log "chunked_$commit.log"
    ;;
  chunked31)
    { header "out of core, 2^31 keys"
      timeout 560 python3 benchmarks/chunked_bench.py --log-keys 31 --log-lookups 20,24,27 --zipf 1.2 \
        --repeats 1 --train-batches 2 --cpu-max-log-lookups 20 --zero-copy-max-log-lookups 20 --out "$out"
      echo "rc=$?"; } 2>&1 | log "chunked31_$commit.log"
    ;;
  chunked_hot)
    { header "out of core, a hot tier given its keys"
      timeout 560 python3 benchmarks/chunked_bench.py --log-keys 30 --log-lookups 24,27 --zipf 0.99,1.2 \
        --hot-keys 67108864 --hot-given --modes chunked,hot_given --repeats 2 --train-batches 2 --out "$out"
      echo "rc=$?"; } 2>&1 | log "chunked_hot_$commit.log"
    ;;
  uniform27)
    { header "out of core, uniform 2^27"
      timeout 500 python3 benchmarks/chunked_bench.py --log-keys 30 --log-lookups 27 --zipf "" --repeats 6 \
        --train-batches 2 --modes chunked,gpu_only,in_core --out "$out/uniform27"  # its own folder: chunked_hot writes the same JSON name
      echo "rc=$?"; } 2>&1 | log "chunked_uniform27_$commit.log"
    ;;
  updates)
    { header "out-of-core updates"
      python3 benchmarks/chunked_update_bench.py --log-keys 26 --chunk-mib 64 --log-batch 16 --out "$out"
      echo "rc=$?"; } 2>&1 | log "chunked_update_$commit.log"
    ;;
  sharded)
    { header "sharded, $(nvidia-smi -L | wc -l) GPUs"
      # Every process-group test: gloo groups, and NCCL groups of one and two GPUs (the conformance suite's too).
      python3 -m pytest tests/test_sharded.py tests/test_sharded_updates.py tests/test_sharded_contract.py \
        tests/test_conformance_sharded.py tests/test_dist_harness.py -q -p no:cacheprovider -rfEs
      echo "rc=$?"
      # Every form of the bench at small sizes on every rank, under memcheck (NCCL's start-up probes are API
      # errors it handles itself, hence --report-api-errors no).
      compute-sanitizer --tool memcheck --error-exitcode 3 --target-processes all --report-api-errors no \
        torchrun --nproc-per-node="$(nvidia-smi -L | wc -l)" benchmarks/sharded_bench.py --log-keys 14 \
        --log-lookups 15 --min-chunk-queries 1 --repeats 1 --out-dir "$(mktemp -d)" 2>&1 \
        | grep -E "ERROR SUMMARY|Error|^weak|^strong"
      torchrun --nproc-per-node="$(nvidia-smi -L | wc -l)" benchmarks/sharded_bench.py --modes weak,strong \
        --pipeline 8 --nccl-high-priority --trace --repeats 3 --out-dir "$out"
      echo "rc=$?"; } 2>&1 | log "sharded_$commit.log"
    ;;
  scaling)
    # A machine of 2+ GPUs: the bench on the first two GPUs and on all of them (weak, then strong at the issues'
    # sizes: 2^(26 + W/2) keys and lookups in all). No L2 set-aside: it slowed the ranks' other kernels.
    n="$(nvidia-smi -L | wc -l)"
    { header "sharded scaling, $n GPUs"
      for w in $(printf "%s\n" 2 "$n" | sort -un); do
        devs="$(seq -s, 0 $((w - 1)))"
        CUDA_VISIBLE_DEVICES="$devs" torchrun --nproc-per-node="$w" benchmarks/sharded_bench.py --modes weak,strong \
          --strong-log-keys $((26 + w / 2)) --strong-log-lookups $((26 + w / 2)) --pipeline 8 --nccl-high-priority \
          --repeats 3 ${SCALING_ARGS:-} --out-dir "$out/w$w"
        echo "rc=$? (world $w)"
      done; } 2>&1 | log "sharded_scaling_$commit.log"
    ;;
  sharded_embedding)
    { header "sharded, embedding-sized calls, $(nvidia-smi -L | wc -l) GPUs"
      python3 -c "import torch_rtindex"  # builds the extension if needed, outside the timeout
      timeout 200 torchrun --nproc-per-node="$(nvidia-smi -L | wc -l)" benchmarks/sharded_embedding_bench.py --out-dir "$out"
      echo "rc=$?"; } 2>&1 | grep -vE "^W1|^\*|OMP_NUM_THREADS" | log "sharded_embedding_$commit.log"
    ;;
  *)
    echo "usage: bash benchmarks/gpu_check.sh suite|memcheck|small|cgrx|skew|floor|chunked|chunked31|chunked_hot|uniform27|updates|sharded|scaling|sharded_embedding" >&2
    exit 2
    ;;
esac
