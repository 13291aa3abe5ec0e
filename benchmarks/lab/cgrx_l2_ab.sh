#!/usr/bin/env bash
# A/B of cgRX radix point lookups (issue 44's first target) between library trees, alternating rounds on one GPU:
# cgrx_bench.py at 2^26 keys / 2^27 lookups, radix backend, default configuration (B=16, layout auto), each run
# checked against the sorted array, with the project's hash table in the same process and the table-in-L2
# set-aside measured as the README recommends (--reserve-l2); then gather_floor.py once per tree. Prints a table
# last. Meant for one device call (<= 9 minutes with both builds):
#
#   bash benchmarks/lab/cgrx_l2_ab.sh BEFORE_DIR [OTHER_DIR ...]
#
# BEFORE_DIR (and any OTHER_DIR, absolute or relative to the repository root): a library tree (torch_rtindex/ and
# csrc/, e.g. `git archive` of the branch point, unpacked); the working tree is the last one measured ("current").
# Each tree builds in its own folder under .build/ab/ (git-ignored), side by side; no `pip install`: RTINDEX_TREE
# picks the tree (benchmarks/_common.py). The bench scripts are the working tree's for every tree. ROUNDS
# (default 3) alternating rounds; BUDGET_S (default 470) stops starting rounds after that many seconds. Logs and
# JSON go under $OUT (the device call's folder) or /tmp/cgrx_l2_ab.
set -uo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
[ $# -ge 1 ] || { echo "usage: bash benchmarks/lab/cgrx_l2_ab.sh BEFORE_DIR [OTHER_DIR ...]" >&2; exit 2; }
rounds=${ROUNDS:-3} budget=${BUDGET_S:-470}
out=${OUT:-/tmp/cgrx_l2_ab}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
names=() paths=()
i=0
for d in "$@"; do
  d=$(cd "$d" && pwd) || exit 2
  [ -f "$d/torch_rtindex/__init__.py" ] && [ -d "$d/csrc" ] || { echo "$d: no torch_rtindex/ and csrc/ there" >&2; exit 2; }
  if [ $i -eq 0 ]; then names+=(before); else names+=("tree$i"); fi
  paths+=("$d")
  i=$((i + 1))
done
names+=(current) paths+=("$root")

nvidia-smi -L
# The builds side by side. The benchmarks' baselines (hash table, gather floor) are the same for every tree: one
# folder, linked into each tree's build folder, so the first tree builds them and the others reuse them (its lock).
mkdir -p "$root/.build/ab/baselines"
for t in "${!names[@]}"; do
  mkdir -p "$root/.build/ab/${names[$t]}" && ln -sfn "$root/.build/ab/baselines" "$root/.build/ab/${names[$t]}/baselines"
done
for t in "${!names[@]}"; do
  (TORCH_RTINDEX_BUILD_DIR=$root/.build/ab/${names[$t]} RTINDEX_TREE=${paths[$t]} PYTHONPATH=${paths[$t]}:$root/benchmarks python3 -c "
import time; t0 = time.time()
import torch, torch_rtindex
from pathlib import Path
from baselines import load_baseline
from baselines.hash_table import HashTable
HashTable(torch.arange(1024, device='cuda'))
load_baseline('rtindex_gather_floor', Path('$root/benchmarks/baselines/gather_floor.cu'))
print('${names[$t]}: built in %.0f s from' % (time.time() - t0), torch_rtindex.__file__)
" > "$out/build_${names[$t]}.log" 2>&1; tail -1 "$out/build_${names[$t]}.log") &
done
wait
echo "builds done at ${SECONDS} s"

bench() {  # tree index, round
  local t=$1 r=$2
  TORCH_RTINDEX_BUILD_DIR=$root/.build/ab/${names[$t]} RTINDEX_TREE=${paths[$t]} PYTHONPATH=${paths[$t]} RTINDEX_COMMIT=${names[$t]} \
    timeout 240 python3 benchmarks/cgrx_bench.py --log-keys 26 --log-lookups 27 --backends radix --bucket-sizes 16 \
    --hash-table --reserve-l2 --range-hits "" --repeats 7 --out "$out/json_${names[$t]}_r$r" > "$out/bench_${names[$t]}_r$r.log" 2>&1
  echo "round $r ${names[$t]} (rc $?): $(grep -E '^(cgRX radix|  table in L2|hash table)' "$out/bench_${names[$t]}_r$r.log" | awk '{printf "%s | ", $0}')"
}
for r in $(seq "$rounds"); do
  if [ "$SECONDS" -gt "$budget" ]; then echo "budget reached: stopping before round $r"; break; fi
  if [ $((r % 2)) -eq 1 ]; then order=$(seq 0 $((${#names[@]} - 1))); else order=$(seq $((${#names[@]} - 1)) -1 0); fi
  for t in $order; do bench "$t" "$r"; done
done
for t in "${!names[@]}"; do
  if [ "$SECONDS" -gt $((budget + 20)) ]; then echo "budget reached: no gather floor for ${names[$t]}"; continue; fi
  TORCH_RTINDEX_BUILD_DIR=$root/.build/ab/${names[$t]} RTINDEX_TREE=${paths[$t]} PYTHONPATH=${paths[$t]} RTINDEX_COMMIT=${names[$t]} \
    timeout 120 python3 benchmarks/gather_floor.py --out "$out/json_${names[$t]}_floor" > "$out/floor_${names[$t]}.log" 2>&1
  echo "gather floor ${names[$t]} (rc $?)"; grep -E " ms " "$out/floor_${names[$t]}.log"
done

python3 - "$out" "${names[@]}" <<'PY'
import json, statistics, sys
from pathlib import Path
out, names = Path(sys.argv[1]), sys.argv[2:]
def runs(name):
    rows = []
    for f in sorted(out.glob(f"json_{name}_r*/*.json")):
        d = json.loads(f.read_text())
        run = d["runs"][0]
        rows.append((run["lookup_ms"], run.get("l2_reserved", {}).get("lookup_ms"), d.get("hash_table", {}).get("lookup_ms"),
                     sum(run["memory"].values())))
    return rows
print("\ncgRX radix point lookups, 2^26 keys, 2^27 lookups, B=16 default (ms per round; min / median)")
print(f"{'tree':10s} {'default':>22s} {'table in L2 set-aside':>24s} {'hash table':>20s} {'x hash':>7s} {'GB':>6s}")
base = None
for n in names:
    rs = runs(n)
    if not rs:
        print(f"{n:10s} no runs"); continue
    col = lambda i: [r[i] for r in rs if r[i] is not None]
    fmt = lambda v: f"{min(v):.2f} / {statistics.median(v):.2f}" if v else "-"
    d, l2, ht = col(0), col(1), col(2)
    ratio = f"{statistics.median(ht) / statistics.median(d):.2f}x" if ht else "-"
    print(f"{n:10s} {fmt(d):>22s} {fmt(l2):>24s} {fmt(ht):>20s} {ratio:>7s} {rs[0][3] / 1e9:6.3f}")
    if base is None:
        base = statistics.median(d)
    else:
        print(f"{'':10s} default median {statistics.median(d) / base:.3f}x the before tree's")
PY
