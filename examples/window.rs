//! Windows: every rank allocates a buffer in the symmetric heap, registers it as a window,
//! writes its own pattern, and reads every peer's through the window (the flat range when the
//! window is symmetric), checking each word.
//!
//! ```text
//! cargo build --release -p ferrocx-cli --bin ferrocx --example window
//! FERROCX_CONFIG=configs/local.toml ./target/release/ferrocx launch -n 4 -- ./target/release/examples/window
//! ```
//!
//! `FERROCX_LOG=debug` shows which backing each window got and why. With `--plain` the buffer is
//! ordinary device memory instead of the heap's: it cannot be mapped into a flat range, so the
//! window is reached through the device's IPC handles.

use ferrocx::abi::{DevicePtr, MemKind};
use ferrocx::adaptor::DeviceBuffer;
use ferrocx::comm::Communicator;
use ferrocx::window::WindowFlags;

/// The word rank `rank` writes at index `i`.
fn pattern(rank: usize, i: usize) -> u64 {
    ((rank as u64 + 1) << 40) | i as u64
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    if let Ok(filter) = std::env::var("FERROCX_LOG") {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .with_writer(std::io::stderr)
            .init();
    }
    ferrocx_adaptor_host::link();
    let comm = Communicator::from_env()?;
    let (rank, world) = (comm.rank(), comm.world());
    if rank == 0 {
        println!("windows: {}", comm.window_plan());
    }

    let words = 1 << 16;
    let plain = std::env::args().any(|a| a == "--plain");
    // Keep the buffer alive while its window is in use.
    let mut heap = None;
    let mut plain_mem = None;
    let (ptr, size) = if plain {
        let buf = plain_mem.insert(DeviceBuffer::new(
            comm.device(),
            words * 8,
            MemKind::DEVICE,
        )?);
        (buf.ptr(), buf.len())
    } else {
        let buf = heap.insert(comm.alloc_symmetric(words * 8)?);
        (buf.ptr(), buf.size())
    };
    // SAFETY: `ptr` is `size` bytes of this rank's device memory, freed only after the window is deregistered.
    let win = unsafe { comm.register_window(ptr, size, WindowFlags::NONE) }?;
    println!(
        "rank {rank}: {} window of {} bytes (local {:#x}, flat base {}, stride {}, multicast {})",
        win.kind(),
        win.size(),
        win.local().0,
        win.flat_base()
            .map_or("-".to_string(), |b| format!("{:#x}", b.0)),
        win.stride().map_or("-".to_string(), |s| s.to_string()),
        if win.has_multicast() { "mapped" } else { "off" },
    );

    let mine: Vec<u64> = (0..words).map(|i| pattern(rank, i)).collect();
    // SAFETY: `win.local()` is this rank's buffer of `size == words * 8` bytes, which no peer
    // reads before the barrier below; `mine` holds as many.
    unsafe {
        comm.device()
            .mem_copy(win.local(), DevicePtr(mine.as_ptr() as u64), words * 8)
    }?;
    comm.barrier()?;

    if win.peer(0).is_none() {
        // A vendor window (the CCL registered it) is reached through the CCL's own window
        // operations, not through addresses of the peers' memory.
        println!("rank {rank}: the CCL holds this window; peers are not addressable from here");
        comm.barrier()?;
        comm.deregister_window(win)?;
        return Ok(());
    }
    let mut checked = Vec::new();
    for peer in 0..world {
        let at = win
            .peer(peer)
            .ok_or_else(|| format!("the window has no address for rank {peer}"))?;
        let mut got = vec![0u64; words];
        // SAFETY: `at` is rank `peer`'s buffer of `words * 8` bytes, mapped here until the
        // deregistration after the barrier below; `got` holds `words` words.
        unsafe {
            comm.device()
                .mem_copy(DevicePtr(got.as_mut_ptr() as u64), at, words * 8)
        }?;
        let wrong = (0..words).filter(|&i| got[i] != pattern(peer, i)).count();
        if wrong > 0 {
            return Err(format!("rank {rank}: {wrong} wrong words in rank {peer}'s window").into());
        }
        checked.push(format!("{peer}@{:#x}", at.0));
    }
    println!(
        "rank {rank}: read {words} words of every rank, all correct: {}",
        checked.join(" ")
    );

    comm.barrier()?;
    comm.deregister_window(win)?;
    drop(plain_mem);
    drop(heap);
    Ok(())
}
