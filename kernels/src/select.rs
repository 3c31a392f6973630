//! The thresholds of each backend, from measurements (the cluster's `window_one_shot_max` /
//! `window_two_shot_max` override them, `small_message` overrides `window_faster`).

use ferrocx::window::collectives::{Measured, Thresholds};

/// Bytes of a chunk slot on the host device: a ring round carries `world` of them, and a
/// one-shot or two-shot call at most that much.
pub const HOST_CHUNK: usize = 1 << 20;
/// Bytes of a chunk slot on CUDA devices: large, so that a ring round (`world` slots) keeps
/// every block busy between its signals.
pub const CUDA_CHUNK: usize = 8 << 20;

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

/// CUDA devices at `world` ranks, measured on 4x H200 (NVLink, all pairs) with
/// `ferrocx bench --direct`, eager and CUDA graph (see the crate README). One-shot (LL lines up
/// to 256 KiB, pushed slots above) beats two-shot up to 2 MiB on 2 GPUs and up to about 1 MiB
/// on 4; against NCCL the window is faster at every size up to 2 MiB on 2 GPUs and up to
/// 256 KiB on 4 (at 512 KiB it ties in eager mode), so those are the thresholds and `auto`
/// takes the window there. 3 GPUs take the 4-GPU thresholds but keep NCCL (not measured);
/// more than 4 keep the earlier published crossovers and NCCL.
pub fn cuda(world: usize) -> Measured {
    let (one_shot_max, two_shot_max, window_faster) = match world {
        0..=2 => (2 << 20, 2 << 20, true),
        3 => (256 << 10, 256 << 10, false),
        4 => (256 << 10, 256 << 10, true),
        _ => (64 << 10, 512 << 10, false),
    };
    Measured {
        thresholds: Thresholds {
            one_shot_max,
            two_shot_max,
        },
        window_faster,
    }
}
