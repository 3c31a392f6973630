//! Threads that share a bridge step's copies and reductions, so that one rank's step is not
//! bound to one core's copy rate: a rank alone in its cluster carries its cluster's whole share
//! of the traffic across the bridge.
//!
//! One pool per process, made at the first communicator that spans clusters, with
//! `FERROCX_BRIDGE_THREADS` threads, or by default the cores this process may run on divided
//! by the ranks of the job (every rank of a bridge is on this host), at most 8. With one
//! thread (a machine with fewer cores than ranks) the steps run on the stream's own thread.

use std::sync::OnceLock;

/// Work below this many bytes per part is not split.
pub const PART_BYTES: usize = 64 << 10;

/// The process's pool (`None`: one thread, run inline).
static POOL: OnceLock<Option<rayon::ThreadPool>> = OnceLock::new();

/// Threads a step may use, for a job of `ranks` ranks on this host.
pub fn threads_for(ranks: usize) -> usize {
    if let Some(n) = std::env::var("FERROCX_BRIDGE_THREADS")
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok())
    {
        return n.clamp(1, 64);
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    (cores / ranks.max(1)).clamp(1, 8)
}

/// Makes the pool (once per process) for a job of `ranks` ranks on this host.
pub fn init(ranks: usize) {
    POOL.get_or_init(|| {
        let n = threads_for(ranks);
        if n <= 1 {
            return None;
        }
        match rayon::ThreadPoolBuilder::new()
            .num_threads(n)
            .thread_name(|i| format!("ferrocx-bridge-{i}"))
            .build()
        {
            Ok(p) => Some(p),
            Err(e) => {
                tracing::debug!("bridge threads not started ({e}): steps run on one thread");
                None
            }
        }
    });
}

/// Threads of the pool (1 without one).
pub fn threads() -> usize {
    POOL.get()
        .and_then(|p| p.as_ref())
        .map_or(1, |p| p.current_num_threads())
}

/// Runs `f(i)` for every `i < parts`, on the pool's threads when there is one and `parts > 1`,
/// and returns when all have run.
pub fn run(parts: usize, f: &(dyn Fn(usize) + Sync)) {
    match POOL.get().and_then(|p| p.as_ref()) {
        Some(pool) if parts > 1 => pool.scope(|s| {
            for i in 0..parts {
                s.spawn(move |_| f(i));
            }
        }),
        _ => (0..parts).for_each(f),
    }
}

/// Cuts `bytes` of work into parts of whole `unit`s for the pool: `(parts, units per part)`.
pub fn cut(bytes: usize, unit: usize) -> (usize, usize) {
    let unit = unit.max(1);
    let units = bytes / unit;
    let parts = (bytes / PART_BYTES).clamp(1, threads());
    if parts <= 1 || units == 0 {
        return (1, units);
    }
    (parts, units.div_ceil(parts))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cut_covers_every_unit_once() {
        for (bytes, unit) in [
            (0, 4),
            (3, 4),
            (4 << 20, 4),
            ((4 << 20) + 12, 2),
            (999_999, 8),
        ] {
            let (parts, per) = cut(bytes, unit);
            let units = bytes / unit;
            assert!(parts >= 1);
            assert!(parts * per >= units, "{bytes} {unit}");
            assert!(parts == 1 || (parts - 1) * per < units, "{bytes} {unit}");
        }
    }

    #[test]
    fn run_calls_every_part_once() {
        init(1);
        let hits: Vec<std::sync::atomic::AtomicUsize> =
            (0..17).map(|_| Default::default()).collect();
        run(17, &|i| {
            hits[i].fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        });
        assert!(hits
            .iter()
            .all(|h| h.load(std::sync::atomic::Ordering::Relaxed) == 1));
    }
}
