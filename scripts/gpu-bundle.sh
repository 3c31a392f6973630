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
# Test executables of `cargo test --no-run "$@"`: cargo prints their paths as JSON; prints
# "<test name> <path>" for each.
test_executables() {
  cargo test --release -q --no-run --message-format=json "$@" 2>/dev/null | python3 -c '
import json, sys
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["kind"] == ["test"]:
        print(m["target"]["name"], m["executable"])
'
}
# The GPU-side crates' tests, named <crate>-<test> (e.g. cuda-gpu, nccl-gpu).
for crate in cuda nccl; do
  test_executables -p "ferrocx-adaptor-$crate" | while read -r name exe; do cp "$exe" "$out/tests/$crate-$name"; done
done
# The window collectives' GPU test (finds the plugins in ../plugins).
test_executables -p ferrocx-tests --test window_collectives_gpu | while read -r name exe; do cp "$exe" "$out/tests/$name"; done
# The drop-in plugins (loaded with dlopen by programs that do not link the adaptors) and the
# window example, which links only the host adaptor and finds CUDA and NCCL as plugins.
mkdir -p "$out/plugins"
cargo build --release -q -p ferrocx-adaptor-cuda-plugin -p ferrocx-adaptor-nccl-plugin
cp target/release/libferrocx_adaptor_cuda.so target/release/libferrocx_adaptor_nccl.so "$out/plugins/"
cargo build --release -q -p ferrocx-cli --example window
cp target/release/examples/window "$out/"
cp -r configs scripts/gpu-run.sh scripts/torch-allreduce.py "$out/"
strip "$out/ferrocx" "$out/window" "$out"/tests/* "$out"/plugins/* 2>/dev/null || true
du -sh "$out"
