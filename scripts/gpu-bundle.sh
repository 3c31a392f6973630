#!/usr/bin/env bash
# Builds, on a machine without a GPU, what the GPU workflow runs: the `ferrocx` CLI with the CUDA
# and NCCL adaptors built in, the adaptors' GPU test executables, and the example configs, into
# ./gpu-bundle (stripped; well under 64 MiB). Run it there with scripts/gpu-run.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
out=gpu-bundle
rm -rf "$out" && mkdir -p "$out/tests"
cargo build --release -q -p ferrocx-cli --features cuda
cp target/release/ferrocx "$out/"
# Test executables: cargo prints their paths as JSON; keep the GPU ones.
cargo test --release -q -p ferrocx-adaptor-cuda --no-run --message-format=json 2>/dev/null \
  | python3 -c '
import json, sys
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["kind"] == ["test"]:
        print(m["target"]["name"], m["executable"])
' | while read -r name exe; do cp "$exe" "$out/tests/$name"; done
cp -r configs scripts/gpu-run.sh "$out/"
strip "$out/ferrocx" "$out"/tests/* 2>/dev/null || true
du -sh "$out"
