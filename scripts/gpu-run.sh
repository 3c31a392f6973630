#!/usr/bin/env bash
# Runs the GPU workflow on a GPU machine from the folder scripts/gpu-bundle.sh made (no Rust
# toolchain needed there): adaptor info, the adaptors' GPU tests, the conformance kit on the CUDA
# and NCCL adaptors, and the all-reduce benchmark on the NCCL backend against NCCL called
# directly and against PyTorch, back-to-back and as CUDA graphs, one process per GPU.
# Multicast stays off everywhere (shared hosts: a multicast object can take every GPU out).
#
#   ./gpu-run.sh [stage...]      stages: info tests kit windows bench wbench torch hetero overlap
#                                (default: all)
#
# Each stage's full output also goes to $OUT/<stage>.log when OUT is set. COUNTS="2 4" names
# the rank counts of the multi-rank stages (default: 2 and every GPU).
set -uo pipefail
cd "$(dirname "$0")"
export NCCL_NVLS_ENABLE=0 FERROCX_MULTICAST=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
ngpu=$(nvidia-smi -L 2>/dev/null | wc -l)
stages=("$@")
[ ${#stages[@]} -eq 0 ] && stages=(info tests kit windows bench wbench torch hetero overlap)
# Rank counts the bench and PyTorch run: 2 and every GPU, one rank per GPU (NCCL refuses two
# ranks on one GPU: "Duplicate GPU detected"), so none on a machine with one GPU.
counts=$(printf '%s\n' ${COUNTS:-2 $ngpu} | sort -un | awk -v n="$ngpu" '$1 >= 2 && $1 <= n')
bench_args=(--op all_reduce -b 8 -e 256M -f 4)
log_dir=${OUT:-}
status=0

# Runs "$@" as one step of stage $stage, teeing into the stage's log; a failure marks the run.
step() {
  echo "== $*"
  if [ -n "$log_dir" ]; then
    { echo "== $*"; "$@"; } 2>&1 | tee -a "$log_dir/$stage.log"
    rc=${PIPESTATUS[0]}
  else
    "$@"
    rc=$?
  fi
  if [ "$rc" -ne 0 ]; then
    echo "!! failed (exit $rc): $*"
    status=1
  fi
}

# Says (and logs) that the multi-rank steps of the stage are left out: too few GPUs.
skip() {
  local line="SKIP: $stage: $* (needs 2 GPUs; this machine has $ngpu)"
  echo "$line"
  if [ -n "$log_dir" ]; then echo "$line" >>"$log_dir/$stage.log"; fi
}

for stage in "${stages[@]}"; do
  case $stage in
    info)
      step nvidia-smi -L
      step nvidia-smi topo -m
      step ./ferrocx info --config configs/nccl.toml
      ;;
    tests)
      for t in tests/*; do
        case $t in
          *fake_runtime | *no_nccl) ;; # a stand-in libcuda; the .so beside the binary: no-GPU checks
          *) step "$t" --test-threads=1 ;;
        esac
      done
      ;;
    kit)
      step ./ferrocx conformance --adaptor cuda --ranks 1
      if [ "$ngpu" -ge 2 ]; then
        step ./ferrocx conformance --adaptor nccl --device cuda --ranks "$ngpu"
      else
        skip "the NCCL conformance run"
      fi
      ;;
    windows)
      # The window example through each backing: the symmetric heap over CUDA VMM, NCCL's own
      # window registration, and per-peer IPC. It links only the host adaptor and loads CUDA
      # and NCCL from plugins/ with dlopen.
      if [ "$ngpu" -ge 2 ]; then
        for mode in symheap vendor ipc; do
          sed "s/^fallback = .*/&\nwindow = \"$mode\"/" configs/nccl.toml >"configs/window-$mode.toml"
          step env FERROCX_CONFIG="configs/window-$mode.toml" FERROCX_PLUGIN_PATH="$PWD/plugins" \
            ./ferrocx launch -n "$ngpu" -- ./window
        done
        # Ordinary device memory (no VMM export): the window goes through CUDA IPC handles.
        step env FERROCX_CONFIG=configs/window-symheap.toml FERROCX_PLUGIN_PATH="$PWD/plugins" \
          ./ferrocx launch -n "$ngpu" -- ./window --plain
      else
        skip "the window example on every GPU"
      fi
      ;;
    bench)
      # What the adaptor adds to the host side of a small collective, and the watchdog's
      # driver calls, on one GPU.
      for b in benches/*; do
        [ -x "$b" ] && step "$b"
      done
      [ -n "$counts" ] || skip "the multi-rank benchmarks"
      for n in $counts; do
        step ./ferrocx bench --config configs/nccl.toml -n "$n" --direct --repeats 9 "${bench_args[@]}"
        step ./ferrocx bench --config configs/nccl.toml -n "$n" --direct --repeats 9 --graph "${bench_args[@]}"
        # The watchdog's share of the small-message cost: the same run without it.
        step env FERROCX_NCCL_WATCHDOG=0 ./ferrocx bench --config configs/nccl.toml -n "$n" --direct --repeats 9 --op all_reduce -b 8 -e 64K -f 8
      done
      ;;
    wbench)
      # The window all-reduce (one-shot / two-shot / ring by size) against NCCL called directly.
      [ -n "$counts" ] || skip "the window all-reduce benchmarks"
      for n in $counts; do
        step ./ferrocx bench --config configs/nccl.toml -n "$n" --direct --algo window --op all_reduce -b 8 -e 64M -f 2
        step ./ferrocx bench --config configs/nccl.toml -n "$n" --direct --algo window --graph --op all_reduce -b 8 -e 64M -f 2
        # NCCL at its fastest: the buffers from ncclMemAlloc, registered as symmetric windows
        # on NCCL's communicator, where NCCL (2.27+) runs its symmetric kernels.
        step ./ferrocx bench --config configs/nccl.toml -n "$n" --direct --direct-symmetric --algo window --op all_reduce -b 8 -e 64M -f 2
        step ./ferrocx bench --config configs/nccl.toml -n "$n" --direct --direct-symmetric --algo window --graph --op all_reduce -b 8 -e 64M -f 2
        # The ring at 4 to 64 MiB both ways (push is the default; FERROCX_WINDOW_RING=pull reads
        # the partials from the left neighbour instead), and two-shot over the sizes it can take.
        step ./ferrocx bench --config configs/nccl.toml -n "$n" --direct --repeats 5 --algo ring --op all_reduce -b 4M -e 64M -f 4
        step env FERROCX_WINDOW_RING=pull ./ferrocx bench --config configs/nccl.toml -n "$n" --direct --repeats 5 --algo ring --op all_reduce -b 4M -e 64M -f 4
        step ./ferrocx bench --config configs/nccl.toml -n "$n" --direct --repeats 5 --algo two-shot --op all_reduce -b 256K -e 16M -f 2
        step ./ferrocx bench --config configs/nccl.toml -n "$n" --direct --repeats 5 --algo two-shot --graph --op all_reduce -b 256K -e 16M -f 2
        # One-shot as it is (LL lines to 256 KiB, pushed slots above) and as LL128 lines only
        # (opt-in: NVLink machines), in graphs, where the 4- and 8-GPU crossovers lie.
        step ./ferrocx bench --config configs/nccl.toml -n "$n" --direct --repeats 5 --algo one-shot --graph --op all_reduce -b 32K -e 2M -f 2
        step env FERROCX_WINDOW_LL_MAX=0 FERROCX_WINDOW_LL128_MAX=2M ./ferrocx bench --config configs/nccl.toml -n "$n" --direct --repeats 5 --algo one-shot --graph --op all_reduce -b 32K -e 2M -f 2
      done
      ;;
    torch)
      if python3 -c 'import torch' 2>/dev/null; then
        [ -n "$counts" ] || skip "the PyTorch all-reduce runs"
        for n in $counts; do
          step python3 -m torch.distributed.run --standalone --nproc-per-node "$n" torch-allreduce.py -b 8 -e 256M -f 4
          step python3 -m torch.distributed.run --standalone --nproc-per-node "$n" torch-allreduce.py -b 8 -e 256M -f 4 --graph
          # PyTorch's SymmetricMemory one-shot all-reduce (P2P loads; multicast off).
          step python3 -m torch.distributed.run --standalone --nproc-per-node "$n" torch-allreduce.py --symm-mem -b 8 -e 2M -f 2
          step python3 -m torch.distributed.run --standalone --nproc-per-node "$n" torch-allreduce.py --symm-mem -b 8 -e 2M -f 2 --graph
        done
      fi
      ;;
    hetero)
      # Every GPU on CUDA + NCCL beside 4 CPU ranks on the host backend, one job: every
      # collective checked, the all-reduce against gloo on the same ranks and against the CPU
      # cluster alone.
      if [ "$ngpu" -ge 2 ]; then
        nr=$((ngpu + 4))
        cfg=configs/hetero-${ngpu}gpu.toml
        printf '[runtime]\ntimeout_ms = 60000\n\n[[cluster]]\nname = "gpu"\nranks = "0-%d"\ndevice = "cuda"\nccl = "nccl"\n\n[[cluster]]\nname = "cpu"\nranks = "%d-%d"\ndevice = "host"\nccl = "host"\n\n[bridge]\nccl = "host"\n' \
          $((ngpu - 1)) "$ngpu" $((nr - 1)) >"$cfg"
        step ./ferrocx config check "$cfg" --world "$nr"
        step ./ferrocx bench --config "$cfg" -n "$nr" --op all -b 16 -e 4M -f 16
        step ./ferrocx bench --config "$cfg" -n "$nr" --repeats 3 --op all_reduce -b 16 -e 64M -f 4
        step ./ferrocx bench --config configs/local.toml -n 4 --repeats 3 --op all_reduce -b 16 -e 64M -f 4
        if python3 -c 'import torch' 2>/dev/null; then
          step python3 -m torch.distributed.run --standalone --nproc-per-node "$nr" gloo-allreduce.py \
            --cuda-ranks "$(seq -s, 0 $((ngpu - 1)))" -b 16 -e 64M -f 4
        fi
      else
        skip "the job across a GPU cluster and a CPU cluster"
      fi
      ;;
    overlap)
      # The point-to-point all-gather against NCCL's all_gather, on NCCL's send/recv (the
      # router's route) and on the copy engines (window-copies, opt-in: FERROCX_P2P_COPIES=1),
      # and the all-gather pipelined with a matmul of its slices (overlap ratio: NCCL's
      # all_gather + the matmul over the pipelined time), on each route.
      if [ "$ngpu" -ge 2 ]; then
        for n in $counts; do
          step ./ferrocx bench --config configs/nccl.toml -n "$n" --direct --repeats 5 --op all_gather --algo p2p -b 1M -e 256M -f 4
          for s in 2 "$n"; do
            step ./ferrocx bench --config configs/nccl.toml -n "$n" --direct --repeats 5 --op all_gather --algo window-copies --streams "$s" -b 1M -e 256M -f 4
          done
          for kn in 32 48 64 128; do
            step ./ferrocx bench --config configs/nccl.toml -n "$n" --op all_gather --overlap -b 64M -e 64M --matmul-k "$kn" --matmul-n "$kn"
            for s in 2 "$n"; do
              step env FERROCX_P2P_COPIES=1 ./ferrocx bench --config configs/nccl.toml -n "$n" --op all_gather --overlap --streams "$s" -b 64M -e 64M --matmul-k "$kn" --matmul-n "$kn"
            done
          done
          for route in ccl window-copies; do
            step env FERROCX_CONFIG=configs/nccl.toml FERROCX_PLUGIN_PATH="$PWD/plugins" ./ferrocx launch -n "$n" -- ./allgather_matmul --route "$route"
          done
          # The tensor-parallel layout: X_full in a window, gathered in place, pushed into.
          step ./ferrocx bench --config configs/nccl.toml -n "$n" --op all_gather --overlap -b 64M -e 64M --matmul-k 64 --matmul-n 16 --algo p2p --output-window --in-place --own-rows input --pieces 2
          step env FERROCX_CONFIG=configs/nccl.toml FERROCX_PLUGIN_PATH="$PWD/plugins" ./ferrocx launch -n "$n" -- ./allgather_matmul --m 131072 --k 64 --n 16 --in-window --pieces 2
        done
      else
        skip "the point-to-point all-gather"
      fi
      ;;
    *)
      echo "unknown stage $stage (info tests kit windows bench wbench torch hetero overlap)"
      status=2
      ;;
  esac
done
exit $status
