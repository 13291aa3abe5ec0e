#!/usr/bin/env bash
# A/B of the sharded bench across library trees, alternating rounds on one machine (device/METHOD.md: compare
# only within one run). The device machine's copy of the repository may carry a stale .git, so the trees to
# compare are exported here first and carried:
#
#   bash benchmarks/sharded_ab.sh export b9e81d1 old     # here: .ab/old = the library at b9e81d1 (.ab is git-ignored
#                                                        # through .git/info/exclude; name it in the run's carry)
#   bash benchmarks/sharded_ab.sh run "old new" 2 2 --modes weak --range-hits ""   # there: 2 rounds, 2 GPUs
#
# "new" is the working tree. Each tree builds in its own folder; the bench script is the working tree's for all.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
case "${1:-}" in
  export)
    name="${3:-$2}"
    rm -rf ".ab/$name" && mkdir -p ".ab/$name"
    git archive "$2" torch_rtindex csrc setup.py | tar -x -C ".ab/$name"
    grep -qx "/.ab/" .git/info/exclude 2>/dev/null || echo "/.ab/" >> .git/info/exclude
    echo ".ab/$name = $(git rev-parse --short "$2")"
    ;;
  run)
    trees=$2 rounds=$3 world=$4; shift 4
    export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
    where() { if [ "$1" = new ]; then echo "$root $root/.build"; else echo "$root/.ab/$1 $root/.ab/build_$1"; fi; }
    for t in $trees; do  # the builds side by side
      read -r pp bd <<< "$(where "$t")"
      (TORCH_RTINDEX_BUILD_DIR=$bd PYTHONPATH=$pp python3 -c "import torch_rtindex" 2>&1 | tail -1) &
    done
    wait
    nvidia-smi -L
    for r in $(seq "$rounds"); do
      for t in $trees; do
        read -r pp bd <<< "$(where "$t")"
        echo "=== round $r, tree $t, world $world: $*"
        CUDA_VISIBLE_DEVICES="$(seq -s, 0 $((world - 1)))" TORCH_RTINDEX_BUILD_DIR=$bd PYTHONPATH=$pp RTINDEX_COMMIT=$t \
          timeout 300 torchrun --nproc-per-node="$world" benchmarks/sharded_bench.py --nccl-high-priority \
          --out-dir "${OUT:-/tmp}/ab_${t}_r$r" "$@" 2>&1 | grep -E "^(weak|strong|NVIDIA|model)|Error|package"
      done
    done
    ;;
  *)
    echo "usage: bash benchmarks/sharded_ab.sh export COMMIT [NAME] | run \"TREES\" ROUNDS WORLD [bench args]" >&2
    exit 2
    ;;
esac
