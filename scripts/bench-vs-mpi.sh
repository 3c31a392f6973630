#!/usr/bin/env bash
# All-reduce on the host backend against Open MPI's MPI_Allreduce (shared-memory transport), on
# this machine, in one script: 2 and 4 ranks, 8 B to 64 MiB, float sum, out of place.
# Prints a markdown table of time and bus bandwidth ratios (ferrocx / Open MPI).
#
# Needs Debian's openmpi-bin and libopenmpi-dev (`apt-get install openmpi-bin libopenmpi-dev`).
# Usage: scripts/bench-vs-mpi.sh [RANKS...]   (default: 2 4)
set -euo pipefail
cd "$(dirname "$0")/.."
ranks=("${@:-2 4}")
[ $# -gt 0 ] || ranks=(2 4)
max=$((64 << 20))
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

command -v mpicc >/dev/null || { echo "mpicc not found: apt-get install openmpi-bin libopenmpi-dev" >&2; exit 2; }
cargo build --release -q -p ferrocx-cli
mpicc -O2 -o "$out/mpi_bench" scripts/mpi_allreduce_bench.c

for n in "${ranks[@]}"; do
  # Open MPI 4 on Debian: --oversubscribe when ranks exceed cores; shared memory through vader.
  mpirun --allow-run-as-root --oversubscribe -np "$n" --mca btl self,vader \
    "$out/mpi_bench" 8 "$max" > "$out/mpi-$n.txt"
  # Many iterations where a call takes microseconds, fewer where it takes milliseconds (the
  # MPI program does the same).
  ./target/release/ferrocx bench --config configs/local.toml -n "$n" --op all_reduce \
    -b 8 -e 64K -f 2 --iters 2000 --warmup 2000 --json > "$out/ferrocx-small-$n.json"
  ./target/release/ferrocx bench --config configs/local.toml -n "$n" --op all_reduce \
    -b 128K -e 64M -f 2 --iters 20 --warmup 5 --json > "$out/ferrocx-large-$n.json"
done

python3 - "$out" "${ranks[@]}" <<'PY'
import json, sys, os
out, ranks = sys.argv[1], sys.argv[2:]
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
print(f"Machine: {cpu}, {os.cpu_count()} cores. All-reduce, float sum, out of place; "
      "time is the maximum over ranks of the mean per call.\n")
for n in ranks:
    mpi = {}
    for line in open(f"{out}/mpi-{n}.txt"):
        if line.startswith("#"):
            continue
        b, t, alg, bus, wrong = line.split()
        mpi[int(b)] = (float(t), float(bus), int(wrong))
    rows = []
    for part in ("small", "large"):
        rows += json.load(open(f"{out}/ferrocx-{part}-{n}.json"))["results"][0]["rows"]
    print(f"### {n} ranks\n")
    print("| size | ferrocx time (us) | Open MPI time (us) | time ratio | ferrocx busbw (GB/s) | Open MPI busbw (GB/s) | busbw ratio | #wrong |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        size = r["size"]
        if size not in mpi:
            continue
        g = r["out_of_place"]
        mt, mb, mw = mpi[size]
        ratio_t = g["time_us"] / mt if mt else float("nan")
        ratio_b = g["busbw_gbps"] / mb if mb else float("nan")
        print(f"| {size} | {g['time_us']:.2f} | {mt:.2f} | {ratio_t:.2f} | {g['busbw_gbps']:.3f} | {mb:.3f} | {ratio_b:.2f} | {g['wrong']}+{mw} |")
    print()
PY
