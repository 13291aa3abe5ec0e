#!/usr/bin/env bash
# Issue 42's before/after grid: the restructured tree against the tree before it (and any other trees), stage by
# stage on one GPU machine, the trees alternating within each stage, answers checked by every bench:
#
#   STAGES="build cgrx small" bash benchmarks/lab/grid_ab.sh BEFORE_DIR [OTHER_DIR ...]
#
# Stages (run in the order given; BUDGET_S, default 540, stops starting stages and rounds after that many seconds):
#   build       each tree's CUDA extension, side by side (each in .build/ab/<its name>, the working tree
#               in .build, the folder gpu_check.sh uses), and the benches' baselines
#   cgrx        cgrx_bench.py, 2^26 keys, 2^27 lookups, radix B=16 (default configuration), point lookups, the
#               project's hash table; ROUNDS (default 2) rounds, the order reversed every other round
#   small       small_batch_bench.py, 2^24 keys, 2^4 .. 2^24 queries, eager and CUDA-graph replay
#   uniform27   chunked_bench.py, 2^30 keys, budget a quarter, six fresh uniform 2^27 batches after two training,
#               served by the hybrid and by the GPU alone
#               (the tree before this phase printed no batch within 200 s after its 44 s build on two H200s: up
#               to UNIFORM_LIMIT_S, default 420 s, a tree; a call of its own)
#   sharded     sharded_bench.py on every GPU under torchrun, weak scaling, pipelined (8 chunks), 3 repeats
#   sharded_embedding  sharded_embedding_bench.py on every GPU under torchrun: 2^10, 2^14, 2^17 IDs per rank, eager
#               and CUDA-graph forms against two plain all-to-alls; ROUNDS rounds, the order reversed every other
#   first_call  first_call.py per tree (fresh processes: import, first and second build and lookup)
#
# Trees: BEFORE_DIR and OTHER_DIRs hold torch_rtindex/ and csrc/ (a `git archive` of a commit, unpacked); the
# working tree is "current", measured last in odd rounds; the others are named by their folders' names. cgrx, small and first_call run the working tree's
# scripts (public API only) over each tree (RTINDEX_TREE); uniform27, sharded and sharded_embedding run each tree's own
# benchmarks/ scripts where it has them (their library options changed), else the working tree's. Logs go to
# $OUT or /tmp/grid_ab. A device call brings back at most 8 files: there, point OUT at a scratch folder and send
# this script's stdout (every run's summary lines) into the call's own $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
[ $# -ge 1 ] || { echo "usage: STAGES='build cgrx ...' bash benchmarks/lab/grid_ab.sh BEFORE_DIR [OTHER_DIR ...]" >&2; exit 2; }
budget=${BUDGET_S:-540} rounds=${ROUNDS:-2}
out=${OUT:-/tmp/grid_ab}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
names=() paths=()
i=0
for d in "$@"; do
  d=$(cd "$d" && pwd) || exit 2
  [ -f "$d/torch_rtindex/__init__.py" ] && [ -d "$d/csrc" ] || { echo "$d: no torch_rtindex/ and csrc/ there" >&2; exit 2; }
  n=$(basename "$d"); [ "$n" = current ] && n=current_$i  # a tree is named by its folder (.ab/before: "before")
  names+=("$n")
  paths+=("$d")
  i=$((i + 1))
done
names+=(current) paths+=("$root")
ngpu=$(nvidia-smi -L | wc -l)

build_dir() { if [ "${names[$1]}" = current ]; then echo "$root/.build"; else echo "$root/.build/ab/${names[$1]}"; fi; }
script() {  # tree index, script name: the tree's own copy where it has one
  if [ -f "${paths[$1]}/benchmarks/$2" ]; then echo "${paths[$1]}/benchmarks/$2"; else echo "$root/benchmarks/$2"; fi
}
in_tree() {  # tree index, command...: the command with that tree's library and build folder
  local t=$1; shift
  TORCH_RTINDEX_BUILD_DIR=$(build_dir "$t") RTINDEX_TREE=${paths[$t]} PYTHONPATH=${paths[$t]} \
    RTINDEX_COMMIT=${names[$t]} "$@"
}
order() {  # round: the trees' indices, reversed in even rounds
  if [ $(($1 % 2)) -eq 1 ]; then seq 0 $((${#names[@]} - 1)); else seq $((${#names[@]} - 1)) -1 0; fi
}
over() { [ "$SECONDS" -gt "$budget" ] && { echo "budget reached ($SECONDS s): skipping $*"; return 0; }; return 1; }

nvidia-smi -L
for t in "${!names[@]}"; do echo "tree ${names[$t]}: ${paths[$t]}, build $(build_dir "$t")"; done
for stage in ${STAGES:-build cgrx small}; do
  echo "=== stage $stage at ${SECONDS} s"
  case $stage in
    build)
      mkdir -p "$root/.build/ab/baselines"
      for t in "${!names[@]}"; do
        b=$(build_dir "$t"); mkdir -p "$b"
        [ -e "$b/baselines" ] || ln -sfn "$root/.build/ab/baselines" "$b/baselines"
        (in_tree "$t" python3 -P -c "
import time; t0 = time.time()
import sys; sys.path.insert(0, '$root/benchmarks')
import torch, torch_rtindex
from pathlib import Path
from baselines import load_baseline
from baselines.hash_table import HashTable
torch_rtindex.CgRXIndex(torch.arange(1024, device='cuda')).lookup(torch.arange(8, device='cuda'))
HashTable(torch.arange(1024, device='cuda'))
print('${names[$t]}: built in %.0f s from' % (time.time() - t0), torch_rtindex.__file__)
" > "$out/build_${names[$t]}.log" 2>&1; tail -1 "$out/build_${names[$t]}.log") &
      done
      wait
      ;;
    cgrx)
      for r in $(seq "$rounds"); do
        for t in $(order "$r"); do
          over "cgrx ${names[$t]} round $r" && continue
          in_tree "$t" timeout 200 python3 benchmarks/cgrx_bench.py --log-keys 26 --log-lookups 27 --backends radix \
            --bucket-sizes 16 --hash-table --range-hits "" --repeats 7 --out "$out/cgrx_${names[$t]}_r$r" \
            > "$out/cgrx_${names[$t]}_r$r.log" 2>&1
          echo "cgrx round $r ${names[$t]} (rc $?): $(grep -E '^(cgRX radix|hash table)' "$out/cgrx_${names[$t]}_r$r.log" | tr -s ' ' | paste -sd'|')"
        done
      done
      ;;
    small)
      for t in $(order 1); do
        over "small ${names[$t]}" && continue
        in_tree "$t" timeout 150 python3 benchmarks/small_batch_bench.py --no-compile --log-keys 24 \
          --log-queries 4 10 14 17 20 24 --out "$out/small_${names[$t]}" > "$out/small_${names[$t]}.log" 2>&1
        echo "small ${names[$t]} (rc $?)"; grep -vE "^torch_rtindex|^wrote" "$out/small_${names[$t]}.log" | tail -12
      done
      ;;
    uniform27)
      for t in $(order 1); do
        over "uniform27 ${names[$t]}" && continue
        in_tree "$t" timeout "${UNIFORM_LIMIT_S:-420}" python3 "$(script "$t" chunked_bench.py)" --log-keys 30 --log-lookups 27 --zipf "" \
          --repeats 6 --train-batches 2 --modes chunked,gpu_only --out "$out/uniform27_${names[$t]}" \
          > "$out/uniform27_${names[$t]}.log" 2>&1
        echo "uniform27 ${names[$t]} (rc $?)"; grep -E "batch [0-9]|^chunked|^gpu_only|^in_core" "$out/uniform27_${names[$t]}.log" \
          | sed -E 's/  (gpu|hot|rebuilds|gc) .*//'
      done
      ;;
    sharded)
      for t in $(order 1); do
        over "sharded ${names[$t]}" && continue
        in_tree "$t" timeout 200 torchrun --nproc-per-node="$ngpu" "$(script "$t" sharded_bench.py)" --modes weak \
          --range-hits "" --pipeline 8 --nccl-high-priority --repeats 3 --out-dir "$out/sharded_${names[$t]}" \
          > "$out/sharded_${names[$t]}.log" 2>&1
        echo "sharded ${names[$t]} (rc $?)"; grep -E "^weak|plain all-to-alls" "$out/sharded_${names[$t]}.log"
      done
      ;;
    sharded_embedding)
      for r in $(seq "$rounds"); do
        for t in $(order "$r"); do
          over "sharded_embedding ${names[$t]} round $r" && continue
          in_tree "$t" timeout 240 torchrun --nproc-per-node="$ngpu" "$(script "$t" sharded_embedding_bench.py)" \
            --log-ids 10,14,17 --out-dir "$out/sharded_embedding_${names[$t]}_r$r" \
            > "$out/sharded_embedding_${names[$t]}_r$r.log" 2>&1
          echo "sharded_embedding round $r ${names[$t]} (rc $?)"
          grep -E "^ +[0-9]+ (a2a|lookup)|its baseline|answers checked" "$out/sharded_embedding_${names[$t]}_r$r.log"
        done
      done
      ;;
    first_call)
      for t in $(order 1); do
        over "first_call ${names[$t]}" && continue
        in_tree "$t" timeout 240 python3 benchmarks/first_call.py --package-path "${paths[$t]}" --repeats 2 \
          --json "$out/first_call_${names[$t]}.json" > "$out/first_call_${names[$t]}.log" 2>&1
        echo "first_call ${names[$t]} (rc $?)"; cat "$out/first_call_${names[$t]}.log"
      done
      ;;
    *) echo "unknown stage $stage" >&2 ;;
  esac
done
echo "=== done at ${SECONDS} s"
