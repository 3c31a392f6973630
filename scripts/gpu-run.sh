#!/usr/bin/env bash
# Runs the GPU workflow on a GPU machine from the folder scripts/gpu-bundle.sh made (no Rust
# toolchain needed there): adaptor info, the CUDA adaptor's GPU tests, and the all-reduce
# benchmark on the NCCL backend with one process per GPU. Multicast stays off everywhere.
set -uo pipefail
cd "$(dirname "$0")"
export NCCL_NVLS_ENABLE=0 FERROCX_MULTICAST=0
ngpu=$(nvidia-smi -L 2>/dev/null | wc -l)
echo "== GPUs: $ngpu"
nvidia-smi -L
status=0
echo "== ferrocx info"
./ferrocx info --config configs/nccl.toml || status=1
for t in tests/*; do
  echo "== $t"
  "$t" --test-threads=1 || status=1
done
if [ "$ngpu" -ge 2 ]; then
  echo "== ferrocx bench (nccl, $ngpu ranks)"
  ./ferrocx bench --config configs/nccl.toml -n "$ngpu" --op all_reduce -b 8 -e 256M -f 4 || status=1
fi
exit $status
