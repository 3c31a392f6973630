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
        // The host CCL's all-gather (reading in place) beat the window's on the VM: 2 MiB of
        // output on 2 ranks 139 against 206 µs, in place 36 against 145.
        all_gather_below: 0,
    }
}

/// CUDA devices at `world` ranks, measured with `ferrocx bench --direct`, eager and CUDA graph
/// (see the crate README and `docs/perf.md`).
///
/// - **2 GPUs** (2 H200, NVLink): one-shot (LL lines up to 256 KiB, pushed slots above) is the
///   fastest window algorithm up to 2 MiB; from there two-shot and the ring are level (within
///   4 %), and two-shot beats NCCL up to 16 MiB, the most it can take on 2 ranks (a parity):
///   1.16-1.19x at 16 MiB, 1.25-1.32x at 8 MiB, in both modes. The ring still wins at 32 MiB
///   (1.07-1.09x) and loses at 64 MiB (0.96-0.98x), but `auto` never routes to the ring.
///   So the window takes everything up to 16 MiB.
/// - **4 GPUs** (4 H200, NVLink all pairs): one-shot beats two-shot up to about 1 MiB, and the
///   window beats NCCL up to 256 KiB (at 512 KiB it ties in eager mode, through the ring).
///   On 4 H100 (NVLink, NCCL 2.28, CUDA graphs) one-shot at 512 KiB (pushed slots) took
///   12.7 µs against NCCL's 13.8 and two-shot 16.6: the window takes 512 KiB too, by one-shot;
///   at 1 MiB NCCL is level or ahead (0.93x).
/// - 3 GPUs take the 4-GPU thresholds but keep NCCL (not measured); more than 4 keep the
///   earlier published crossovers and NCCL.
///
/// The window all-gather (each rank's input pushed into every peer's chunk slot, one launch),
/// against NCCL's all_gather (`ferrocx bench --op all_gather --algo auto --direct`):
/// - **2 GPUs** (2 H200, NVLink): 1.5-2.1x from 256 KiB to 16 MiB of output, every size it
///   takes (a rank's input fills at most a chunk slot, 8 MiB): the router takes it for all;
/// - **4 GPUs** (4 H200, NVLink between every pair): 1.17-1.86x from 256 KiB to 8 MiB, 0.92-0.99x
///   at 16 MiB and 0.95 at 32 MiB: the router takes it below 12 MiB (between the two);
/// - 3 and more than 4 GPUs were not measured and keep NCCL.
///
/// The window kernels take up to [`crate::layout::MAX_BLOCKS`] (128) thread blocks, more SMs
/// than NCCL's channels: a job that overlaps its all-reduces with compute may prefer
/// `small_message = "ccl"` or a lower `window_two_shot_max` for its mid-size messages.
pub fn cuda(world: usize) -> Measured {
    let (one_shot_max, two_shot_max, window_faster) = match world {
        0..=2 => (2 << 20, 16 << 20, true),
        3 => (256 << 10, 256 << 10, false),
        4 => (512 << 10, 512 << 10, true),
        _ => (64 << 10, 512 << 10, false),
    };
    Measured {
        thresholds: Thresholds {
            one_shot_max,
            two_shot_max,
        },
        window_faster,
        all_gather_below: match world {
            0..=2 => usize::MAX,
            4 => 12 << 20,
            _ => 0,
        },
    }
}
