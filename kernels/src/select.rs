//! The thresholds of each backend, from measurements (the cluster's `window_one_shot_max` /
//! `window_two_shot_max` override them, `small_message` overrides `window_faster`).

use ferrocx::window::collectives::{Measured, Thresholds};

/// Bytes of a chunk slot on the host device: a ring round carries `world` of them, and a
/// one-shot or two-shot call at most that much.
pub const HOST_CHUNK: usize = 1 << 20;
/// Bytes of a chunk slot on CUDA devices.
pub const CUDA_CHUNK: usize = 2 << 20;

/// The host device at `world` ranks. Measured on a 2-core VM against the host CCL
/// (`cargo bench -p ferrocx-kernels --bench window_vs_ccl`, see the crate README): one-shot is
/// the fastest window algorithm up to about 1-2 KiB, two-shot above; against the CCL the window
/// is 0.7-0.95x on 2 ranks and within the run-to-run spread (±30 %) on 4 oversubscribed
/// ranks, so `auto` keeps the CCL.
pub fn host(world: usize) -> Measured {
    let _ = world;
    Measured {
        thresholds: Thresholds {
            one_shot_max: 2 << 10,
            two_shot_max: 1 << 20,
        },
        window_faster: false,
    }
}

/// CUDA devices at `world` ranks. The thresholds are the crossovers published for symmetric
/// memory one-shot / two-shot all-reduce on NVLink machines; `auto` keeps NCCL until
/// `ferrocx bench --algo window` figures on GPUs say the window is faster
/// (`small_message = "window"` opts in).
pub fn cuda(world: usize) -> Measured {
    let one_shot_max = if world <= 4 { 128 << 10 } else { 64 << 10 };
    Measured {
        thresholds: Thresholds {
            one_shot_max,
            two_shot_max: 512 << 10,
        },
        window_faster: false,
    }
}
