//! All-reduce through `Communicator`: every rank sums `rank + 1 + i` over a few sizes, on the
//! route the communicator's router picks for each (printed by rank 0), checks every element,
//! then passes a token around the ring with grouped send/recv on a stream of its own.
//!
//! ```text
//! cargo build --release -p ferrocx-cli --bin ferrocx --example all_reduce
//! FERROCX_CONFIG=configs/local.toml ./target/release/ferrocx launch -n 4 -- ./target/release/examples/all_reduce
//! ```
//!
//! `FERROCX_LOG=ferrocx::route=debug` logs one `collective` span per call (op, bytes, dtype,
//! route).

use ferrocx::abi::{DataType, MemKind, ReduceOp};
use ferrocx::adaptor::DeviceBuffer;
use ferrocx::comm::Communicator;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    if let Ok(filter) = std::env::var("FERROCX_LOG") {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .with_span_events(tracing_subscriber::fmt::format::FmtSpan::NEW)
            .with_writer(std::io::stderr)
            .init();
    }
    ferrocx_adaptor_host::link();
    ferrocx_kernels::link();
    let comm = Communicator::from_env()?;
    let (rank, world) = (comm.rank(), comm.world());
    let dev = comm.device();

    for count in [1usize, 1000, 100_003, 1 << 20] {
        let mine: Vec<u8> = (0..count)
            .flat_map(|i| ((rank + 1 + i % 7) as f32).to_ne_bytes())
            .collect();
        let buf = DeviceBuffer::from_host(dev, &mine, MemKind::DEVICE)?;
        // SAFETY: `buf` holds `count` f32 and drops only after the synchronize.
        unsafe { comm.all_reduce(buf.ptr(), buf.ptr(), count, DataType::F32, ReduceOp::SUM)? };
        comm.synchronize()?;
        let got: Vec<f32> = buf
            .to_vec()?
            .chunks_exact(4)
            .map(|b| f32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        let ranks = (world * (world + 1) / 2) as f32;
        let wrong = (0..count)
            .filter(|&i| got[i] != ranks + (world * (i % 7)) as f32)
            .count();
        if wrong > 0 {
            return Err(format!("rank {rank}: {wrong} of {count} elements wrong").into());
        }
        if rank == 0 {
            println!(
                "all_reduce of {count} f32 on {world} ranks: correct (route: {})",
                comm.all_reduce_route(count, DataType::F32, ReduceOp::SUM)
            );
        }
    }

    // A token around the ring: send right, receive from the left, on a stream of our own.
    let stream = dev.stream_create()?;
    let (left, right) = ((rank + world - 1) % world, (rank + 1) % world);
    let token = (rank as u64 * 1000).to_ne_bytes();
    let send = DeviceBuffer::from_host(dev, &token, MemKind::DEVICE)?;
    let recv = DeviceBuffer::new(dev, 8, MemKind::DEVICE)?;
    let on = comm.on(stream);
    comm.group(|| {
        // SAFETY: both buffers hold one u64 and drop after the synchronize below.
        unsafe {
            on.send(send.ptr(), 1, DataType::U64, right)?;
            on.recv(recv.ptr(), 1, DataType::U64, left)
        }
    })?;
    dev.stream_synchronize(stream)?;
    let mut got = [0u8; 8];
    recv.copy_to_host(&mut got)?;
    let got = u64::from_ne_bytes(got);
    dev.stream_destroy(stream)?;
    if got != left as u64 * 1000 {
        return Err(format!("rank {rank}: token {got} from rank {left}").into());
    }
    comm.barrier()?;
    println!("rank {rank}: token {got} from rank {left}");
    Ok(())
}
