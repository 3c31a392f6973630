//! Host time per all-reduce: how long the calling thread spends enqueuing one call, beside the
//! call's time on the streams, for a few sizes. For a job across clusters the host time should
//! not grow with the size (the enqueuer thread enqueues a large call's stages).
//!
//! ```text
//! cargo build --release -p ferrocx-cli --bin ferrocx --example host_time
//! FERROCX_CONFIG=configs/hetero-1gpu.toml ./target/release/ferrocx launch -n 4 -- \
//!     ./target/release/examples/host_time 8 1M 64M
//! ```
//!
//! Arguments: sizes in bytes (K, M, G suffixes in powers of 2; default 8 1M 64M). Each size:
//! 3 untimed calls, then 20 calls timed from the first call to the return of the last
//! (host), and to the end of the synchronize after it (total). Every rank prints its line.

use std::time::Instant;

use ferrocx::abi::{DataType, MemKind, ReduceOp};
use ferrocx::adaptor::DeviceBuffer;
use ferrocx::comm::Communicator;

fn size(text: &str) -> Result<usize, String> {
    let t = text.trim().to_ascii_uppercase();
    let (digits, shift) = match t.chars().last() {
        Some('K') => (&t[..t.len() - 1], 10),
        Some('M') => (&t[..t.len() - 1], 20),
        Some('G') => (&t[..t.len() - 1], 30),
        _ => (&t[..], 0),
    };
    digits
        .parse::<usize>()
        .map(|n| n << shift)
        .map_err(|_| format!("not a size: {text:?}"))
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    ferrocx_adaptor_host::link();
    ferrocx_kernels::link();
    let mut sizes: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| size(&a))
        .collect::<Result<_, _>>()?;
    if sizes.is_empty() {
        sizes = vec![8, 1 << 20, 64 << 20];
    }
    let comm = Communicator::from_env()?;
    let (rank, dev) = (comm.rank(), comm.device());
    const ITERS: u32 = 20;
    for bytes in sizes {
        let count = (bytes / 4).max(1);
        let send = DeviceBuffer::new(dev, count * 4, MemKind::DEVICE)?;
        let recv = DeviceBuffer::new(dev, count * 4, MemKind::DEVICE)?;
        let call = || {
            // SAFETY: both buffers hold `count` f32 and drop after the synchronize below.
            unsafe { comm.all_reduce(send.ptr(), recv.ptr(), count, DataType::F32, ReduceOp::SUM) }
        };
        for _ in 0..3 {
            call()?;
        }
        comm.synchronize()?;
        let start = Instant::now();
        for _ in 0..ITERS {
            call()?;
        }
        let host = start.elapsed();
        comm.synchronize()?;
        let total = start.elapsed();
        println!(
            "rank {rank} ({}): {} bytes: host {:.1} us per call, total {:.1} us per call",
            comm.cluster(),
            count * 4,
            host.as_secs_f64() * 1e6 / f64::from(ITERS),
            total.as_secs_f64() * 1e6 / f64::from(ITERS)
        );
    }
    Ok(())
}
