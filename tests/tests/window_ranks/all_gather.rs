//! All-gather cases shared by the window-collective tests of the host backend and of GPUs:
//! each rank's output against every rank's input (the all-reduce cases' inputs).

use ferrocx::abi::{DataType, DevicePtr, MemKind};
use ferrocx::comm::Communicator;
use ferrocx::route::Route;
use ferrocx::window::collectives::WindowAlgo;

use super::all_reduce::{input, size_of, TYPES};
use super::{host_ptr, host_ptr_mut};

/// Every rank's gathered output against every rank's input (computed here): every type at 1,
/// 3, 7, 1000 and 4099 elements and at the most a rank's input may be (`chunk`, the backend's
/// chunk slot), in place
/// (the input at this rank's place in the output) and out of place, forced onto the window and
/// by the router's choice (the window below `reach` bytes of output, the provider's measured
/// `all_gather_below`, else the CCL), through `all_gather_p2p` (whose handle names its route)
/// and the plain `all_gather`; then a forced call past the chunk slot is refused naming the
/// limit, and a call after it still runs.
pub fn all_gather_cases(comm: &Communicator, test: &str, chunk: usize, reach: usize) {
    let (me, world) = (comm.rank(), comm.world());
    let dev = comm.device();
    let send = dev.mem_alloc(chunk, MemKind::DEVICE).expect("alloc");
    let recv = dev
        .mem_alloc(world * chunk, MemKind::DEVICE)
        .expect("alloc");
    let mut case = 0u64;
    let mut windowed = 0;
    for dtype in TYPES {
        let es = size_of(dtype);
        for count in [1, 3, 7, 1000, 4099, chunk / es] {
            for in_place in [false, true] {
                for (forced, plain) in [(true, false), (false, false), (true, true), (false, true)]
                {
                    case += 1;
                    let bytes = count * es;
                    let mine = input(case, me, count, dtype);
                    let src = if in_place {
                        DevicePtr(recv.0 + (me * bytes) as u64)
                    } else {
                        send
                    };
                    // SAFETY: `recv` holds `world * chunk` bytes, `src` at least `bytes`, and
                    // `mine` `bytes`; nothing runs on the stream yet.
                    unsafe {
                        dev.mem_set(recv, 0xa5, world * bytes).expect("poison");
                        dev.mem_copy(src, host_ptr(&mine), bytes).expect("upload");
                    }
                    let call = comm.call();
                    let call = if forced {
                        call.via(Route::Window(WindowAlgo::OneShot))
                    } else {
                        call
                    };
                    let window = forced || (world * bytes < reach && bytes <= chunk);
                    if plain {
                        // SAFETY: as below.
                        unsafe { call.all_gather(src, recv, count, dtype) }
                            .unwrap_or_else(|e| panic!("case {case}: {e}"));
                        comm.synchronize()
                            .unwrap_or_else(|e| panic!("case {case}: {e}"));
                    } else {
                        // SAFETY: `src` holds `count` elements and `recv` `world * count`, `src`
                        // is this rank's place in it or disjoint; both outlive the synchronize
                        // below.
                        let h = unsafe { call.all_gather_p2p(src, recv, count, dtype, 2) }
                            .unwrap_or_else(|e| panic!("case {case}: {e}"));
                        assert_eq!(
                            h.route() == Route::Window(WindowAlgo::OneShot),
                            window,
                            "case {case}: {} bytes a rank took {}",
                            bytes,
                            h.route()
                        );
                        h.synchronize()
                            .unwrap_or_else(|e| panic!("case {case}: {e}"));
                    }
                    windowed += usize::from(window);
                    let mut got = vec![0u8; world * bytes];
                    // SAFETY: after the synchronize; `got` holds `world * bytes`.
                    unsafe { dev.mem_copy(host_ptr_mut(&mut got), recv, world * bytes) }
                        .expect("download");
                    for q in 0..world {
                        assert!(
                            got[q * bytes..(q + 1) * bytes] == input(case, q, count, dtype)[..],
                            "case {case}: {count} {dtype:?} (in place {in_place}): rank {q}'s \
                             slice differs on rank {me}"
                        );
                    }
                }
            }
        }
    }
    let count = chunk / 4 + 1;
    // SAFETY: refused before anything is enqueued (the size is checked first).
    let e = unsafe {
        comm.call()
            .via(Route::Window(WindowAlgo::OneShot))
            .all_gather_p2p(send, recv, count, DataType::F32, 2)
    }
    .err()
    .expect("past the chunk slot");
    let text = e.to_string();
    assert!(text.contains(&format!("takes at most {chunk}")), "{text}");
    // The refusal left the window's rounds in step: one more gather runs and is right.
    case += 1;
    let mine = input(case, me, 5, DataType::F32);
    // SAFETY: as above.
    unsafe { dev.mem_copy(send, host_ptr(&mine), 20) }.expect("upload");
    // SAFETY: as above.
    let h = unsafe {
        comm.call()
            .via(Route::Window(WindowAlgo::OneShot))
            .all_gather_p2p(send, recv, 5, DataType::F32, 1)
    }
    .expect("after the refusal");
    h.synchronize().expect("after the refusal");
    drop(h);
    let mut got = vec![0u8; world * 20];
    // SAFETY: after the synchronize.
    unsafe { dev.mem_copy(host_ptr_mut(&mut got), recv, world * 20) }.expect("download");
    for q in 0..world {
        assert_eq!(
            got[q * 20..(q + 1) * 20],
            input(case, q, 5, DataType::F32)[..]
        );
    }
    comm.synchronize().expect("synchronize");
    // SAFETY: the allocations above, unused after the synchronize.
    unsafe {
        let _ = dev.mem_free(send, MemKind::DEVICE);
        let _ = dev.mem_free(recv, MemKind::DEVICE);
    }
    println!("{test}: rank {me} of {world}: {case} gathers checked, {windowed} on the window");
    println!("RANK OK");
}
