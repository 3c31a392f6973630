#!/usr/bin/env bash
# The host backend against MPI on this machine, in one script: all-reduce (float sum, out of
# place) from 8 B to 64 MiB, and broadcast and barrier at 8 B, on 2 and 4 ranks. Every round
# runs MPI and then ferrocx for each rank count, so the two alternate and share the machine's
# state; each figure is the median over the rounds.
#
# Prints the README's table ("Host backend against MPI": ranks, size, times, bus bandwidths and
# their ratios ferrocx / MPI) and then the full table of every size.
#
# MPI:
#   MPI=openmpi (default): Debian's Open MPI (`apt-get install openmpi-bin libopenmpi-dev`),
#                          shared memory through `vader`.
#   MPI=mpich:             MPICH from its PyPI wheel (`pip install mpich`): mpicc and mpiexec
#                          from $FERROCX_VENV/bin, else .venv/bin.
# Ranks are bound to cores, for MPI as for ferrocx (the host CCL binds its threads by default,
# see FERROCX_HOST_BIND), when there are at least as many cores as ranks. With more ranks than
# cores MPI runs unbound and the host CCL binds rank r's small-collective thread to core
# r mod cores (its default).
#
# ferrocx: built here (cargo build --release), or the binary named by FERROCX (a machine
# without a Rust toolchain: the GPU bundle's ./ferrocx).
#
# Usage: [MPI=openmpi|mpich] [ROUNDS=3] [FERROCX=path] scripts/bench-vs-mpi.sh [RANKS...]
#        (default ranks: 2 4)
set -euo pipefail
cd "$(dirname "$0")/.."
ranks=("$@")
[ $# -gt 0 ] || ranks=(2 4)
rounds=${ROUNDS:-3}
mpi=${MPI:-openmpi}
max=$((64 << 20))
cores=$(nproc)
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

case "$mpi" in
  openmpi)
    mpicc=mpicc
    command -v mpicc >/dev/null || { echo "mpicc not found: apt-get install openmpi-bin libopenmpi-dev" >&2; exit 2; }
    mpicc --showme:version 2>&1 | grep -qi "open mpi" || { echo "mpicc is not Open MPI's (MPI=mpich for MPICH)" >&2; exit 2; }
    mpi_name="Open MPI $(mpirun --version 2>/dev/null | head -1 | grep -o '[0-9][0-9.]*' | head -1)"
    mpi_run() { # ranks, args...
      local n=$1; shift
      local bind=none; [ "$n" -le "$cores" ] && bind=core
      mpirun --allow-run-as-root --oversubscribe --bind-to "$bind" -np "$n" --mca btl self,vader "$@"
    }
    ;;
  mpich)
    venv=${FERROCX_VENV:-.venv}
    mpicc="$venv/bin/mpicc"
    [ -x "$mpicc" ] && [ -x "$venv/bin/mpiexec" ] || { echo "no mpicc/mpiexec in $venv/bin: pip install mpich there (or set FERROCX_VENV)" >&2; exit 2; }
    mpi_name="MPICH $("$venv/bin/mpichversion" 2>/dev/null | grep -i 'version:' | head -1 | grep -o '[0-9][0-9.a-z]*' | head -1)"
    mpi_run() {
      local n=$1; shift
      local bind=(); [ "$n" -le "$cores" ] && bind=(-bind-to core)
      "$venv/bin/mpiexec" "${bind[@]}" -np "$n" "$@"
    }
    ;;
  *) echo "MPI=$mpi: expected openmpi or mpich" >&2; exit 2 ;;
esac

if [ -n "${FERROCX:-}" ]; then
  fxbin=$FERROCX
else
  cargo build --release -q -p ferrocx-cli
  fxbin=./target/release/ferrocx
fi
"$mpicc" -O2 -o "$out/mpi_bench" scripts/mpi_allreduce_bench.c -Wl,-rpath,"$(dirname "$(command -v "$mpicc")")/../lib"

fx() { # ranks, op, args...
  local n=$1 op=$2; shift 2
  "$fxbin" bench --config configs/local.toml -n "$n" --op "$op" --json "$@"
}

for r in $(seq "$rounds"); do
  for n in "${ranks[@]}"; do
    echo "round $r/$rounds, $n ranks" >&2
    mpi_run "$n" "$out/mpi_bench" 8 "$max" allreduce > "$out/mpi-ar-$n-$r.txt"
    mpi_run "$n" "$out/mpi_bench" 8 8 bcast > "$out/mpi-bc-$n-$r.txt"
    mpi_run "$n" "$out/mpi_bench" 8 8 barrier > "$out/mpi-ba-$n-$r.txt"
    # Many iterations where a call takes microseconds, fewer where it takes milliseconds (the
    # MPI program does the same).
    fx "$n" all_reduce -b 8 -e 64K -f 2 --iters 5000 --warmup 2000 > "$out/fx-small-$n-$r.json"
    fx "$n" all_reduce -b 128K -e 64M -f 2 --iters 20 --warmup 5 > "$out/fx-large-$n-$r.json"
    fx "$n" broadcast -b 8 -e 8 --iters 5000 --warmup 2000 > "$out/fx-bc-$n-$r.json"
    # A barrier is a one-word (4 B) all-reduce on the host CCL.
    fx "$n" all_reduce -b 4 -e 4 --iters 5000 --warmup 2000 > "$out/fx-ba-$n-$r.json"
  done
done

python3 - "$out" "$rounds" "$mpi_name" "${ranks[@]}" <<'PY'
import json, os, statistics, sys
out, rounds, mpi_name, ranks = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4:]
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")

def mpi_rows(path):
    rows = {}
    for line in open(path):
        if line.startswith("#"):
            continue
        b, t, alg, bus, wrong = line.split()
        rows[int(b)] = (float(t), float(bus), int(wrong))
    return rows

def fx_rows(*paths):
    rows = {}
    for p in paths:
        for r in json.load(open(p))["results"][0]["rows"]:
            g = r["out_of_place"]
            rows[r["size"]] = (g["time_us"], g["busbw_gbps"], g["wrong"])
    return rows

def median(runs, size, i):
    return statistics.median(r[size][i] for r in runs)

# table[(n, what)] = list over rounds of {size: (time, busbw, wrong)}
table = {}
for n in ranks:
    for r in range(1, rounds + 1):
        table.setdefault((n, "ar", "mpi"), []).append(mpi_rows(f"{out}/mpi-ar-{n}-{r}.txt"))
        table.setdefault((n, "bc", "mpi"), []).append(mpi_rows(f"{out}/mpi-bc-{n}-{r}.txt"))
        table.setdefault((n, "ba", "mpi"), []).append(mpi_rows(f"{out}/mpi-ba-{n}-{r}.txt"))
        table.setdefault((n, "ar", "fx"), []).append(
            fx_rows(f"{out}/fx-small-{n}-{r}.json", f"{out}/fx-large-{n}-{r}.json"))
        table.setdefault((n, "bc", "fx"), []).append(fx_rows(f"{out}/fx-bc-{n}-{r}.json"))
        # The 4 B all-reduce stands for the barrier (MPI's row is at 8 B).
        table.setdefault((n, "ba", "fx"), []).append(
            {8: v for v in fx_rows(f"{out}/fx-ba-{n}-{r}.json").values()})

def human(b):
    for unit, s in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= s and b % s == 0:
            return f"{b // s} {unit}"
    return f"{b} B"

def row(n, what, size, label, bold_time=False, bold_bw=False):
    f, m = table[(n, what, "fx")], table[(n, what, "mpi")]
    ft, mt = median(f, size, 0), median(m, size, 0)
    fb, mb = median(f, size, 1), median(m, size, 1)
    wrong = sum(r[size][2] for r in f) + sum(r[size][2] for r in m)
    rt = ft / mt if mt else float("nan")
    rb = fb / mb if mb else float("nan")
    rts = f"**{rt:.2f}**" if bold_time else f"{rt:.2f}"
    rbs = f"**{rb:.2f}**" if bold_bw else f"{rb:.2f}"
    return (f"| {n} | {label} | {ft:.2f} | {mt:.2f} | {rts} | {fb:.3f} | {mb:.3f} | {rbs} | {wrong} |")

# The host CCL's threads per rank for large copies and reductions (see its `cores` module):
# FERROCX_HOST_THREADS, else the rank's share of the cores, at most 4.
cores = len(os.sched_getaffinity(0))
setting = os.environ.get("FERROCX_HOST_THREADS", "auto").strip().lower()
threads = ", ".join(
    f"{n} ranks: {setting if setting not in ('', 'auto') else max(1, min(cores // int(n), 4))}"
    for n in ranks)
print(f"Machine: {cpu}, {os.cpu_count()} cores; {mpi_name}. Float sum, out of place; time is the "
      f"maximum over ranks of the mean per call, median of {rounds} alternated rounds; "
      f"ratios are ferrocx / MPI. ferrocx threads per rank ({threads}).\n")
print("| ranks | op, size | ferrocx time (us) | MPI time (us) | time ratio | ferrocx busbw (GB/s) | "
      "MPI busbw (GB/s) | busbw ratio | #wrong |")
print("|---:|---|---:|---:|---:|---:|---:|---:|---:|")
for n in ranks:
    for size in (8, 64, 1024, 2048, 64 << 10, 1 << 20, 32 << 20, 64 << 20):
        print(row(n, "ar", size, f"all_reduce {human(size)}", bold_time=size == 8,
                  bold_bw=size == 64 << 20))
    print(row(n, "bc", 8, "broadcast 8 B", bold_time=True))
    print(row(n, "ba", 8, "barrier", bold_time=True))
print()
for n in ranks:
    print(f"### all_reduce, {n} ranks, every size\n")
    print("| size | ferrocx time (us) | MPI time (us) | time ratio | ferrocx busbw (GB/s) | "
          "MPI busbw (GB/s) | busbw ratio | #wrong |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    f, m = table[(n, "ar", "fx")], table[(n, "ar", "mpi")]
    for size in sorted(set(f[0]) & set(m[0])):
        print(row(n, "ar", size, "x").replace(f"| {n} | x ", f"| {human(size)} ", 1))
    print()
PY
