//! Dispatch cost: a call through a loaded plugin's table against a direct call of the same
//! function, in one process.
//!
//! The plugin is the real `libferrocx_adaptor_testrust.so`, opened with `dlopen` by the
//! registry. The direct call is the same adaptor method, linked into this benchmark. Three
//! ways are measured:
//! - `direct`: `TestDevice::instance().device_count()` (the Rust method; the baseline);
//! - `vtable_raw`: the `device_count` entry of the loaded table, called through its pointer
//!   (trampoline + panic guard + out-pointer write);
//! - `vtable_safe`: `ferrocx::adaptor::Device::device_count()` over the loaded table (what the
//!   core calls: absent-entry check, status check).
//!
//! After criterion's report, a summary prints the overhead per call in nanoseconds against the
//! 5 ns budget.

use std::hint::black_box;
use std::time::Instant;

use criterion::{criterion_group, Criterion};
use ferrocx::registry::Registry;
use ferrocx_adaptor_testrust::TestDevice;
use ferrocx_plugin_sdk::DeviceAdaptor;

fn loaded_device() -> ferrocx::adaptor::Device {
    let mut r = Registry::empty();
    let path = ferrocx_tests::rust_plugin();
    r.add_plugin(&path)
        .unwrap_or_else(|e| panic!("load {}: {e}", path.display()))
        .device()
        .expect("device table")
}

fn direct() -> i32 {
    black_box(TestDevice::instance())
        .device_count()
        .expect("device_count")
}

fn bench(c: &mut Criterion) {
    let dev = loaded_device();
    let raw = dev.tables().root.get().device_count.expect("entry");
    let mut g = c.benchmark_group("device_count");
    g.bench_function("direct", |b| b.iter(direct));
    g.bench_function("vtable_raw", |b| {
        b.iter(|| {
            let mut n = 0;
            // SAFETY: a valid out-pointer, as the entry requires.
            let s = unsafe { black_box(raw)(&mut n) };
            assert!(s.is_success());
            n
        })
    });
    g.bench_function("vtable_safe", |b| {
        b.iter(|| black_box(&dev).device_count().expect("device_count"))
    });
    g.finish();
}

/// Median of `runs` timings of `iters` calls, in nanoseconds per call.
fn per_call(runs: usize, iters: u64, mut f: impl FnMut() -> i32) -> f64 {
    let mut t: Vec<f64> = (0..runs)
        .map(|_| {
            let start = Instant::now();
            let mut acc = 0i64;
            for _ in 0..iters {
                acc += i64::from(f());
            }
            black_box(acc);
            start.elapsed().as_nanos() as f64 / iters as f64
        })
        .collect();
    t.sort_by(f64::total_cmp);
    t[runs / 2]
}

fn summary() {
    let dev = loaded_device();
    let (runs, iters) = (11, 2_000_000);
    // Interleave the two so drift on a shared machine hits both alike.
    let mut direct_ns = Vec::new();
    let mut safe_ns = Vec::new();
    for _ in 0..3 {
        direct_ns.push(per_call(runs, iters, direct));
        safe_ns.push(per_call(runs, iters, || {
            dev.device_count().expect("device_count")
        }));
    }
    direct_ns.sort_by(f64::total_cmp);
    safe_ns.sort_by(f64::total_cmp);
    let (d, s) = (direct_ns[1], safe_ns[1]);
    println!("\ndispatch summary (median of medians, {iters} calls x {runs} runs x 3 rounds):");
    println!("  direct call          {d:7.2} ns/call");
    println!("  through plugin table {s:7.2} ns/call");
    println!(
        "  overhead             {:7.2} ns/call (budget 5 ns: {})",
        s - d,
        if s - d <= 5.0 { "within" } else { "OVER" }
    );
}

criterion_group!(benches, bench);

fn main() {
    benches();
    Criterion::default().configure_from_args().final_summary();
    summary();
}
