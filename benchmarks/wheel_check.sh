#!/usr/bin/env bash
# On the GPU machine, in one call: build the CUDA wheel (TORCH_CUDA_ARCH_LIST, default: the data-center and
# consumer architectures this torch supports, setup.py), install it into a fresh --target folder, and show
# that the first import there compiles nothing: it runs with no compiler reachable (PATH holds python alone,
# CUDA_HOME points nowhere) and an empty build cache that must stay absent. Then the bug report
# (python -m torch_rtindex) and the first-call costs from the installed wheel (benchmarks/first_call.py).
#
#   bash benchmarks/wheel_check.sh
#
# SCRATCH: where the wheel and its install go (default .whl/wheel_check in the checkout, git-ignored, so a second
# call on the same machine finds them); MAX_JOBS bounds the build; TORCH_CUDA_ARCH_LIST narrows it (a build for
# all default architectures takes several times the one-GPU JIT build); FIRST_CALL=0 skips first_call.py,
# which can then run in a second call: python3 benchmarks/first_call.py --package-path $SCRATCH/site.
set -euo pipefail
cd "$(dirname "$0")/.."
checkout=$(pwd)
scratch=${SCRATCH:-$checkout/.whl/wheel_check}
mkdir -p "$scratch"
export MAX_JOBS=${MAX_JOBS:-$(nproc)}
now() { date +%s.%N; }
python3 -c 'import torch; print("torch", torch.__version__, "CUDA", torch.version.cuda, "GPU", torch.cuda.get_device_name() if torch.cuda.is_available() else None)'
python3 -m pip install -q setuptools ninja 2>/dev/null || true  # already there on a machine without network

t0=$(now)
rm -rf build "$scratch/wheel"  # setuptools' staging folder: stale files there would end up in the wheel
python3 -m pip wheel -q --no-build-isolation --no-deps -w "$scratch/wheel" .
t1=$(now)
wheel=$(ls "$scratch"/wheel/torch_rtindex-*.whl)
echo "wheel: $wheel ($(du -h "$wheel" | cut -f1)), built in $(python3 -c "print(round($t1 - $t0))") s with MAX_JOBS=$MAX_JOBS"
python3 - "$wheel" <<'EOF'
import json, sys, zipfile
z = zipfile.ZipFile(sys.argv[1])
for n in z.namelist():
    if n.endswith((".so", ".optixir", "_prebuilt.json")):
        print(f"  {n}  {z.getinfo(n).file_size} bytes")
print("  _prebuilt.json:", json.dumps(json.loads(z.read("torch_rtindex/_prebuilt.json")), indent=None)[:600])
EOF
rm -rf "$scratch/site" "$scratch/no_cache"
python3 -m pip install -q --no-deps --target "$scratch/site" "$wheel"

# No compiler reachable (PATH is python's own folder, CUDA_HOME points nowhere): a JIT build would fail loudly
# instead of passing unnoticed.
cd "$scratch"
t2=$(now)
env PATH="$(dirname "$(command -v python3)")" CUDA_HOME=/nonexistent PYTHONPATH="$scratch/site" TORCH_RTINDEX_BUILD_DIR="$scratch/no_cache" \
    python3 - <<'EOF'
import os, time
t = time.perf_counter(); import torch; t_torch = time.perf_counter() - t
t = time.perf_counter(); import torch_rtindex; t_pkg = time.perf_counter() - t
info = torch_rtindex._extension.load()
assert info["kind"] == "prebuilt" and info["backend"] == "cuda", info
assert info["path"].startswith(os.environ["PYTHONPATH"]), info
print(f"first import from the wheel: prebuilt {info['path']}")
print(f"  import torch {t_torch:.2f} s, import torch_rtindex {t_pkg:.2f} s on top")
keys = torch.randint(-2**63, 2**63 - 1, (1 << 20,), device="cuda")
for cls in (torch_rtindex.RXIndex, torch_rtindex.CgRXIndex, torch_rtindex.UpdatableCgRXIndex):
    t = time.perf_counter(); index = cls(keys); found = index.lookup(keys[:4096]); torch.cuda.synchronize()
    assert int(found.count.min()) >= 1
    print(f"  {cls.__name__} (backend {getattr(index, 'backend', 'optix')}): first build + lookup {1e3 * (time.perf_counter() - t):.0f} ms")
# The OptiX programs are chosen at the first OptiX index (the RXIndex above), for this machine's GPUs.
assert set(info["optix_programs"]) == {"rx", "cgrx"}, info["optix_programs"]
print(f"  OptiX programs chosen at the first OptiX index: {info['optix_programs']}")
built = [d for d in os.listdir(os.environ["TORCH_RTINDEX_BUILD_DIR"])] if os.path.exists(os.environ["TORCH_RTINDEX_BUILD_DIR"]) else []
assert not [d for d in built if d.startswith(("cuda-", "cpu-", "work-"))], built  # only optix_cache may be there
print("  nothing compiled; build cache holds:", built)
EOF
t3=$(now)
echo "first process with the wheel: $(python3 -c "print(round($t3 - $t2, 1))") s"
PYTHONPATH="$scratch/site" TORCH_RTINDEX_BUILD_DIR="$scratch/no_cache" python3 -m torch_rtindex
if [ "${FIRST_CALL:-1}" != 0 ]; then
    PYTHONPATH="$scratch/site" TORCH_RTINDEX_BUILD_DIR="$scratch/no_cache" \
        python3 "$checkout/benchmarks/first_call.py" --package-path "$scratch/site" --repeats 2
fi
