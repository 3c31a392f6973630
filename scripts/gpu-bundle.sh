#!/usr/bin/env bash
# Builds, on a machine without a GPU, what the GPU workflow runs: the `ferrocx` CLI with the CUDA
# and NCCL adaptors built in, the GPU test executables, the drop-in plugins, the window example
# and the example configs, into
# ./gpu-bundle (stripped; well under 64 MiB). Run it there with scripts/gpu-run.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
out=gpu-bundle
rm -rf "$out" && mkdir -p "$out/tests"
cargo build --release -q -p ferrocx-cli --features cuda
cp target/release/ferrocx "$out/"
# Executables of `cargo test|bench --no-run "$@"` (first argument: test or bench): cargo prints
# their paths as JSON; prints "<target name> <path>" for each.
executables() {
  local kind=$1
  shift
  local release=--release
  [ "$kind" = bench ] && release= # `cargo bench` builds with the release profile anyway
  cargo "$kind" $release -q --no-run --message-format=json "$@" 2>/dev/null | KIND=$kind python3 -c '
import json, os, sys
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["kind"] == [os.environ["KIND"]]:
        print(m["target"]["name"], m["executable"])
'
}
test_executables() { executables test "$@"; }
# The GPU-side crates' tests, named <crate>-<test> (e.g. cuda-gpu, nccl-gpu).
for crate in cuda nccl; do
  test_executables -p "ferrocx-adaptor-$crate" | while read -r name exe; do cp "$exe" "$out/tests/$crate-$name"; done
done
# The window collectives' GPU test (finds the plugins in ../plugins).
test_executables -p ferrocx-tests --test window_collectives_gpu | while read -r name exe; do cp "$exe" "$out/tests/$name"; done
# The NCCL adaptor's host-cost benchmark (one GPU).
mkdir -p "$out/benches"
executables bench -p ferrocx-adaptor-nccl --bench hot_path | while read -r name exe; do cp "$exe" "$out/benches/nccl-$name"; done
# The drop-in plugins (loaded with dlopen by programs that do not link the adaptors) and the
# window example, which links only the host adaptor and finds CUDA and NCCL as plugins.
mkdir -p "$out/plugins"
cargo build --release -q -p ferrocx-adaptor-cuda-plugin -p ferrocx-adaptor-nccl-plugin
cp target/release/libferrocx_adaptor_cuda.so target/release/libferrocx_adaptor_nccl.so "$out/plugins/"
cargo build --release -q -p ferrocx-cli --example window
cp target/release/examples/window "$out/"
# The pipelined all-gather + matmul example (links the host adaptor; CUDA and NCCL as plugins).
cargo build --release -q -p ferrocx-cli --example allgather_matmul
cp target/release/examples/allgather_matmul "$out/"
cp -r configs scripts/gpu-run.sh scripts/torch-allreduce.py scripts/gloo-allreduce.py "$out/"
# The CPU benchmarks against MPI (run there with FERROCX=./ferrocx and an MPI carried as a wheel).
mkdir -p "$out/scripts"
cp scripts/bench-vs-mpi.sh scripts/bench-mpi-ccl.sh scripts/mpi_allreduce_bench.c "$out/scripts/"
# The Python package as one abi3 wheel (every CPython >= 3.9; CUDA and NCCL built in, loaded at
# run time), its GPU scripts and the DDP worker they share with the CPU tests.
maturin=${MATURIN:-$(command -v maturin || echo .venv/bin/maturin)}
"$maturin" build --release -q -m python/Cargo.toml -o "$out/wheels"
mkdir -p "$out/python/tests"
cp -r python/gpu "$out/python/"
cp -r python/tests/workers "$out/python/tests/"
# The CLI has the adaptors built in and the window example finds them through
# FERROCX_PLUGIN_PATH: the bundle's configs name no plugin directory (../target/release does not
# exist there).
sed -i 's|^plugin_dirs = .*|plugin_dirs = []|' "$out"/configs/*.toml
strip "$out/ferrocx" "$out/window" "$out/allgather_matmul" "$out"/tests/* "$out"/benches/* "$out"/plugins/* 2>/dev/null || true
du -sh "$out"
