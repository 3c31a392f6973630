#!/usr/bin/env bash
# The Python package's GPU runs, from the folder scripts/gpu-bundle.sh made (no Rust toolchain
# needed): unpacks the bundle's abi3 wheel into ./pylib (beside the machine's PyTorch, touching
# nothing else; no pip or network needed), builds the torch backend's native side (a C++
# compiler and ninja, as torch's extension builder needs), then
#
#   world1    world 1 on CUDA tensors (configs/nccl.toml): every operation, dtype and reduce op,
#             torch's current stream, no host synchronization, bad input
#   hetero    DDP across 1 GPU rank (CUDA + NCCL) and 3 CPU ranks (host + host CCL), bridged
#             (configs/hetero-1gpu.toml), against gloo
#   overhead  Python's per-call overhead at 8 bytes over the Rust call (world 1 on CUDA)
#   ddp       a DDP training step on the ferrocx backend against torch's nccl, on 2 GPUs and on
#             every GPU (python/gpu/ddp_step.py; machines with 2 GPUs or more)
#   allgather all_gather_into_tensor on the ferrocx backend against torch's nccl, 256 KiB to
#             16 MiB, on 2 GPUs (python/gpu/all_gather.py; machines with 2 GPUs or more)
#
#   ./python/gpu/run.sh [stage...]    (default: all; each stage's output also goes to
#                                      $OUT/py-<stage>.log when OUT is set)
set -uo pipefail
cd "$(dirname "$0")/../.."
export NCCL_NVLS_ENABLE=0 FERROCX_MULTICAST=0 OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1
py=${PYTHON:-python3}
rm -rf pylib && "$py" -m zipfile -e wheels/ferrocx-*-abi3-*.whl pylib || exit 1
export PYTHONPATH=$PWD/pylib${PYTHONPATH:+:$PYTHONPATH}
"$py" -c 'import sys, torch, ferrocx; print("python", sys.version.split()[0], "torch", torch.__version__, "ferrocx", ferrocx.__version__)'
# The torch backend's native side, built here against this machine's torch before any job (the
# ranks of a job would otherwise build it on their first process group, inside its timeout).
# A failed build is not fatal: the jobs then run on the Python process group, and say so.
export FERROCX_CACHE_DIR=${FERROCX_CACHE_DIR:-$PWD/.fxcache}
"$py" -m ferrocx._native || echo "WARNING: the native torch backend did not build; the Python process group takes every call"
stages=("$@")
[ ${#stages[@]} -eq 0 ] && stages=(world1 hetero overhead ddp allgather)
ngpu=$(nvidia-smi -L 2>/dev/null | wc -l)
status=0
run() {
  local stage=$1
  shift
  echo "== $stage: $*"
  if [ -n "${OUT:-}" ]; then
    "$@" 2>&1 | tee "$OUT/py-$stage.log"
    rc=${PIPESTATUS[0]}
  else
    "$@"
    rc=$?
  fi
  [ "$rc" -eq 0 ] || { echo "!! $stage failed (exit $rc)"; status=1; }
}
torchrun=("$py" -m torch.distributed.run --master-addr 127.0.0.1)
for stage in "${stages[@]}"; do
  case $stage in
    world1) FERROCX_CONFIG=configs/nccl.toml run world1 "${torchrun[@]}" --nproc-per-node 1 python/gpu/world1_cuda.py ;;
    hetero) FERROCX_CONFIG=configs/hetero-1gpu.toml run hetero "${torchrun[@]}" --nproc-per-node 4 python/tests/workers/ddp.py ;;
    overhead) FERROCX_CONFIG=configs/nccl.toml run overhead "${torchrun[@]}" --nproc-per-node 1 python/gpu/overhead.py 20000 ;;
    ddp)
      [ "$ngpu" -ge 2 ] || { echo "SKIP: ddp needs 2 GPUs; this machine has $ngpu"; continue; }
      for n in $(printf '%s\n' 2 "$ngpu" | sort -un); do
        FERROCX_CONFIG=configs/nccl.toml run "ddp-$n" "${torchrun[@]}" --nproc-per-node "$n" python/gpu/ddp_step.py
      done
      ;;
    allgather)
      [ "$ngpu" -ge 2 ] || { echo "SKIP: allgather needs 2 GPUs; this machine has $ngpu"; continue; }
      FERROCX_CONFIG=configs/nccl.toml run allgather "${torchrun[@]}" --nproc-per-node 2 python/gpu/all_gather.py
      ;;
    *) echo "unknown stage $stage"; status=1 ;;
  esac
done
exit $status
