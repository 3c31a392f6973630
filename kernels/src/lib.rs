//! ferrocx's window collectives: all-reduce over a scratch window, the algorithms the
//! symmetric-heap fallback runs when a cluster's CCL has no all-reduce, and the fast path for
//! small messages where they beat the CCL.
//!
//! - **One-shot**: every rank publishes its input in its scratch window and reduces every
//!   rank's, read directly through the window.
//! - **Two-shot**: reduce-scatter then all-gather through the window.
//! - **Ring**: a ring reduce-scatter over the window's chunk slots (each rank reads its left
//!   neighbour's partial sum directly from the neighbour's slot), then every rank reads the
//!   reduced pieces from their owners.
//!
//! f32, bf16 and f16 (accumulated in f32) and i32; sum, min and max. The scratch window's
//! layout and the signal scheme are in [`layout`]; the host device runs the algorithms in Rust
//! (see [Backends](#backends)), CUDA devices as kernels compiled by NVRTC at first use and
//! cached on disk ([`cuda`]).
//!
//! # Use
//!
//! Link the crate and call [`link`] once; then `Communicator::all_reduce` routes by the
//! cluster's configuration (`small_message`, `window_one_shot_max`, `window_two_shot_max`,
//! `fallback`), and `Communicator::all_reduce_window` runs a window algorithm on demand:
//!
//! ```no_run
//! use ferrocx::abi::{DataType, MemKind, ReduceOp};
//! use ferrocx::adaptor::DeviceBuffer;
//! use ferrocx::comm::Communicator;
//! use ferrocx::window::collectives::WindowAlgo;
//!
//! ferrocx_kernels::link();
//! let comm = Communicator::from_env()?;
//! let buf = DeviceBuffer::new(comm.device(), 1024 * 4, MemKind::DEVICE)?;
//! // SAFETY: `buf` holds 1024 f32 and drops after the synchronize.
//! unsafe {
//!     comm.all_reduce_window(buf.ptr(), buf.ptr(), 1024, DataType::F32, ReduceOp::SUM, Some(WindowAlgo::OneShot))?
//! };
//! comm.synchronize()?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Backends
//!
//! A communicator's first window call makes its backend: it allocates a scratch window
//! ([`layout::Layout::scratch_bytes`]) with `alloc_symmetric`, zeroes it and registers it on
//! every rank (a collective step), then
//!
//! - on a device whose memory is the process's (the host device), enqueues each call as a host
//!   function on the communicator's stream (`launch_host_func`): the algorithm runs in stream
//!   order on the stream's worker, waiting on peers with spin, yield, then (on Linux) a sleep
//!   on a futex in the signal slot awaited, which the peer's signal wakes (elsewhere: short
//!   sleeps);
//! - on ferrocx's `cuda` device adaptor, launches the kernels (see [`cuda`] for how they reach
//!   CUDA).
//!
//! Every wait on a peer has the communicator's timeout and names the peer when it passes; a
//! failure makes every later window call of the communicator fail with it (its rounds are out
//! of step with its peers'), and `Communicator::synchronize` reports it.

pub mod cuda;
pub mod element;
mod engine;
pub(crate) mod host;
pub mod layout;
pub mod matmul;
pub mod select;

/// Keeps this crate's provider in the program: call it once (anywhere) in a program that
/// depends on the crate only for the window collectives, which it registers with `inventory`
/// (a linker may drop a crate nothing references).
pub fn link() {
    std::hint::black_box(engine::kind_of as fn(_) -> _);
}
