//! Windows on the host backend, across real processes (the test executable re-run once per
//! rank, see `window_ranks`): symmetric windows read and written through the flat range on 2,
//! 3 and 4 ranks with windows of different sizes at once; 1000 registrations without growth of
//! descriptors, mappings or segments; the size-mismatch error on every rank; the forced IPC
//! path; a buffer outside the heap; a failure injected at every step of the sym-heap protocol
//! (every rank ends alike, nothing is left); and the emulated multicast end to end with its
//! kill-switches.

mod window_ranks;

use ferrocx::abi::{DataType, DevicePtr, MemKind, ReduceOp};
use ferrocx::comm::{CommError, Communicator};
use ferrocx::window::{
    Backing, SymHeapStep, Window, WindowError, WindowFlags, WindowKind, VIEW_MULTICAST,
};
use window_ranks::{communicator, download, pattern, rank_of, upload, usage, Job};

/// Reads every rank's window through the flat range and checks it against `pattern(w, ..)`.
fn check_flat_reads(comm: &Communicator, win: &Window, w: u64) {
    let words = win.size() / 8;
    let (base, stride) = (win.flat_base().unwrap(), win.stride().unwrap());
    for p in 0..comm.world() {
        let at = DevicePtr(base.0 + (p * stride) as u64);
        assert_eq!(win.peer(p), Some(at), "rank {p}'s address");
        // SAFETY: `at` is rank `p`'s window of `words * 8` bytes, mapped in the flat range while
        // `win` is registered.
        let got = unsafe { download(comm, at, words) };
        let want: Vec<u64> = (0..words).map(|i| pattern(w, p, i)).collect();
        assert_eq!(
            got, want,
            "window {w}: rank {p} read through the flat range"
        );
    }
}

fn flat_range(test: &str) {
    let comm = communicator();
    let (me, world) = (comm.rank(), comm.world());
    assert_eq!(comm.window_plan().backing, Backing::SymHeap);
    // Windows of different sizes, all registered at once.
    let sizes = [8usize, 3 * 4096 + 24, 256 << 10];
    let bufs: Vec<_> = sizes
        .iter()
        .map(|&s| comm.alloc_symmetric(s).unwrap())
        .collect();
    let wins: Vec<Window> = bufs
        .iter()
        .map(|b| {
            // SAFETY: a live allocation of this rank of at least the registered size, kept until the window is deregistered.
            unsafe { comm.register_window(b.ptr(), b.size(), WindowFlags::NONE) }.unwrap()
        })
        .collect();
    for (w, (win, buf)) in wins.iter().zip(&bufs).enumerate() {
        assert!(buf.is_heap());
        assert_eq!(win.kind(), WindowKind::Symmetric, "{}", win.reason());
        assert_eq!(win.size(), buf.size());
        assert_eq!(win.local(), buf.ptr());
        assert_eq!(win.stride(), Some(buf.capacity()));
        assert!(buf.capacity() >= buf.size() && buf.capacity() % 4096 == 0);
        assert!(!win.has_multicast());
        let v = win.view();
        assert_eq!(
            (v.kind, v.rank, v.world, v.size, v.stride, v.flags),
            (
                WindowKind::Symmetric as u32,
                me as u32,
                world as u32,
                sizes[w] as u64,
                buf.capacity() as u64,
                0
            )
        );
        assert_eq!(v.flat_base, win.flat_base().unwrap());
        let mine: Vec<u64> = (0..win.size() / 8)
            .map(|i| pattern(w as u64, me, i))
            .collect();
        // SAFETY: `win.local()` is this rank's buffer of `win.size()` bytes, `mine`'s size.
        unsafe { upload(&comm, win.local(), &mine) };
    }
    comm.barrier().unwrap();
    for (w, win) in wins.iter().enumerate() {
        check_flat_reads(&comm, win, w as u64);
    }
    comm.barrier().unwrap();
    // A write through the flat range lands in the peer's own buffer.
    let right = (me + 1) % world;
    let big = &wins[2];
    let token = 0xfeed_0000_0000_0000 | me as u64;
    // SAFETY: word 1 of the right neighbour's window of `sizes[2]` bytes, mapped while `big` is
    // registered.
    unsafe { upload(&comm, DevicePtr(big.peer(right).unwrap().0 + 8), &[token]) };
    comm.barrier().unwrap();
    let left = (me + world - 1) % world;
    assert_eq!(
        // SAFETY: word 1 of this rank's own window.
        unsafe { download(&comm, DevicePtr(big.local().0 + 8), 1) },
        vec![0xfeed_0000_0000_0000 | left as u64],
        "rank {left}'s write through the flat range"
    );
    comm.barrier().unwrap();
    for win in wins {
        comm.deregister_window(win).unwrap();
    }
    println!("{test}: rank {me} read {world} ranks' windows of {sizes:?} bytes");
    println!("RANK OK");
}

#[test]
fn flat_range_on_2_ranks() {
    const T: &str = "flat_range_on_2_ranks";
    match rank_of(T) {
        Some(_) => flat_range(T),
        None => drop(Job::new(T, 2).run()),
    }
}

#[test]
fn flat_range_on_3_ranks() {
    const T: &str = "flat_range_on_3_ranks";
    match rank_of(T) {
        Some(_) => flat_range(T),
        None => drop(Job::new(T, 3).run()),
    }
}

#[test]
fn flat_range_on_4_ranks() {
    const T: &str = "flat_range_on_4_ranks";
    match rank_of(T) {
        Some(_) => flat_range(T),
        None => drop(Job::new(T, 4).run()),
    }
}

/// One registration, a check that it works, and its deregistration.
fn register_once(comm: &Communicator, buf: DevicePtr, size: usize, i: u64) -> Window {
    // SAFETY: a live allocation of this rank of at least the registered size, kept until the window is deregistered.
    let win = unsafe { comm.register_window(buf, size, WindowFlags::NONE) }
        .unwrap_or_else(|e| panic!("registration {i}: {e}"));
    assert_eq!(win.kind(), WindowKind::Symmetric, "{}", win.reason());
    assert!(win.has_multicast(), "registration {i}: {}", win.reason());
    win
}

#[test]
fn register_deregister_1000_times() {
    const T: &str = "register_deregister_1000_times";
    let Some(me) = rank_of(T) else {
        // Multicast is on, so its lifecycle runs every time too.
        let out = Job::new(T, 2).multicast("on").run();
        for f in &out {
            assert_eq!(f.lines("USAGE "), vec!["same".to_string()], "{}", f.stdout);
            f.lines("ROUNDS ").iter().for_each(|l| println!("{l}"));
        }
        return;
    };
    let comm = communicator();
    let buf = comm.alloc_symmetric(2 * 4096).unwrap();
    let mine: Vec<u64> = (0..1024).map(|i| pattern(7, me, i)).collect();
    // SAFETY: `buf` is a symmetric allocation of `2 * 4096` bytes, `mine`'s size.
    unsafe { upload(&comm, buf.ptr(), &mine) };
    // Warm up: the first rounds make the thread stacks, arenas and store connections that
    // later ones reuse.
    for i in 0..3 {
        let w = register_once(&comm, buf.ptr(), buf.size(), i);
        comm.deregister_window(w).unwrap();
    }
    comm.barrier().unwrap();
    let before = usage();
    let start = std::time::Instant::now();
    for i in 0..1000u64 {
        let w = register_once(&comm, buf.ptr(), buf.size(), i);
        if i % 250 == 0 {
            let peer = (me + 1) % comm.world();
            // SAFETY: the peer's window of `buf.size() >= 1024 * 8` bytes, mapped while `w` is
            // registered.
            let got = unsafe { download(&comm, w.peer(peer).unwrap(), 1024) };
            assert_eq!(
                got,
                (0..1024).map(|i| pattern(7, peer, i)).collect::<Vec<_>>()
            );
        }
        comm.deregister_window(w).unwrap();
    }
    comm.barrier().unwrap();
    let after = usage();
    assert_eq!(
        after, before,
        "descriptors, mappings and segments after 1000 rounds"
    );
    println!(
        "ROUNDS rank {me}: 1000 registrations with multicast in {:.2} s; {} fds, {} mappings, {} segments before and after",
        start.elapsed().as_secs_f64(),
        after.fds,
        after.maps,
        after.segments.len()
    );
    println!("USAGE same");
    println!("RANK OK");
}

#[test]
fn size_mismatch_is_an_error_on_every_rank() {
    const T: &str = "size_mismatch_is_an_error_on_every_rank";
    let Some(me) = rank_of(T) else {
        let out = Job::new(T, 3).run();
        let first = out[0].lines("ERROR ");
        assert_eq!(first.len(), 1, "{}", out[0].stdout);
        for f in &out {
            assert_eq!(
                f.lines("ERROR "),
                first,
                "every rank reports the same error"
            );
        }
        return;
    };
    let comm = communicator();
    let buf = comm.alloc_symmetric(2 * 4096).unwrap();
    let size = if me == 1 { 2 * 4096 } else { 4096 };
    // SAFETY: a live allocation of this rank of at least the registered size, kept until the window is deregistered.
    let e = unsafe { comm.register_window(buf.ptr(), size, WindowFlags::NONE) }
        .expect_err("sizes differ");
    match &e {
        CommError::Window(WindowError::SizeMismatch { sizes }) => {
            assert_eq!(sizes, &[(0, 4096), (1, 8192), (2, 4096)]);
        }
        other => panic!("expected a size mismatch, got {other}"),
    }
    let text = e.to_string();
    assert!(
        text.contains("rank 0: 4096 bytes, rank 1: 8192 bytes, rank 2: 4096 bytes"),
        "{text}"
    );
    println!("ERROR {text}");
    // Nothing was left half-done: the next registration works.
    // SAFETY: a live allocation of this rank of at least the registered size, kept until the window is deregistered.
    let win = unsafe { comm.register_window(buf.ptr(), 4096, WindowFlags::NONE) }.unwrap();
    assert_eq!(win.kind(), WindowKind::Symmetric);
    comm.deregister_window(win).unwrap();
    println!("RANK OK");
}

/// Checks an IPC window: every rank's words through its pointer and the device table.
fn check_ipc(comm: &Communicator, win: &Window, w: u64) {
    assert_eq!(win.kind(), WindowKind::Ipc, "{}", win.reason());
    assert_eq!((win.flat_base(), win.stride()), (None, None));
    assert!(!win.has_multicast());
    let v = win.view();
    assert_eq!(v.kind, WindowKind::Ipc as u32);
    // SAFETY: `v.peers` is the window's device table of one address per rank.
    let table = unsafe { download(comm, v.peers, comm.world()) };
    let words = win.size() / 8;
    assert_eq!(table.len(), comm.world());
    for (p, &entry) in table.iter().enumerate() {
        let at = win.peer(p).unwrap();
        assert_eq!(entry, at.0, "entry {p} of the device table");
        // SAFETY: `at` is rank `p`'s window of `words * 8` bytes, mapped while `win` is registered.
        let got = unsafe { download(comm, at, words) };
        assert_eq!(
            got,
            (0..words).map(|i| pattern(w, p, i)).collect::<Vec<_>>()
        );
    }
}

#[test]
fn forced_ipc_path() {
    const T: &str = "forced_ipc_path";
    let Some(me) = rank_of(T) else {
        drop(Job::new(T, 3).window("ipc").run());
        return;
    };
    let comm = communicator();
    assert_eq!(comm.window_plan().backing, Backing::Ipc);
    assert!(comm.window_plan().reason.contains("window = \"ipc\""));
    let words = 3000;
    // Device memory reached through IPC handles, and heap memory mapped peer by peer.
    let plain = comm.device().mem_alloc(words * 8, MemKind::DEVICE).unwrap();
    let heap = comm.alloc_symmetric(words * 8).unwrap();
    for (w, buf) in [(1u64, plain), (2, heap.ptr())] {
        // SAFETY: `buf` is `plain` or `heap`, each `words * 8` bytes.
        unsafe {
            upload(
                &comm,
                buf,
                &(0..words).map(|i| pattern(w, me, i)).collect::<Vec<_>>(),
            )
        };
        // SAFETY: a live allocation of this rank of at least the registered size, kept until the window is deregistered.
        let win = unsafe { comm.register_window(buf, words * 8, WindowFlags::NONE) }.unwrap();
        comm.barrier().unwrap();
        check_ipc(&comm, &win, w);
        comm.barrier().unwrap();
        comm.deregister_window(win).unwrap();
    }
    // SAFETY: the allocation made above; its windows are deregistered.
    unsafe { comm.device().mem_free(plain, MemKind::DEVICE) }.unwrap();
    println!("RANK OK");
}

#[test]
fn buffers_outside_the_heap_go_through_ipc_handles() {
    const T: &str = "buffers_outside_the_heap_go_through_ipc_handles";
    let Some(me) = rank_of(T) else {
        let out = Job::new(T, 2).run();
        assert_eq!(out[0].lines("ERROR ").len(), 1, "{}", out[0].stdout);
        assert_eq!(out[0].lines("ERROR "), out[1].lines("ERROR "));
        return;
    };
    let comm = communicator();
    let words = 512;
    let heap = comm.alloc_symmetric(words * 8).unwrap();
    let plain = comm.device().mem_alloc(words * 8, MemKind::DEVICE).unwrap();
    // SAFETY: `plain` is a fresh allocation of `words * 8` bytes.
    unsafe {
        upload(
            &comm,
            plain,
            &(0..words).map(|i| pattern(3, me, i)).collect::<Vec<_>>(),
        )
    };
    // Device memory on every rank: IPC handles.
    // SAFETY: a live allocation of this rank of at least the registered size, kept until the window is deregistered.
    let win = unsafe { comm.register_window(plain, words * 8, WindowFlags::NONE) }.unwrap();
    assert!(
        win.reason()
            .contains("rank 0's buffer is not memory of alloc_symmetric"),
        "{}",
        win.reason()
    );
    comm.barrier().unwrap();
    check_ipc(&comm, &win, 3);
    comm.barrier().unwrap();
    comm.deregister_window(win).unwrap();
    // Heap memory on rank 0 only: IPC handles too, which the host's heap memory has none of,
    // so every rank fails alike, naming rank 1's buffer.
    let buf = if me == 1 { plain } else { heap.ptr() };
    // SAFETY: a live allocation of this rank of at least the registered size, kept until the window is deregistered.
    let e = unsafe { comm.register_window(buf, words * 8, WindowFlags::NONE) }
        .expect_err("heap memory has no IPC handle on the host device")
        .to_string();
    assert!(
        e.starts_with(
            "IPC window (rank 1's buffer is not memory of alloc_symmetric): rank 0: ipc-export:"
        ),
        "{e}"
    );
    println!("ERROR {e}");
    // SAFETY: the allocation made above; its window is deregistered, the second registration
    // failed.
    unsafe { comm.device().mem_free(plain, MemKind::DEVICE) }.unwrap();
    println!("RANK OK");
}

/// What every rank must end with when `step` fails on `failing`.
fn expected(step: SymHeapStep, failing: usize) -> String {
    let injected = format!("{step}: injected failure");
    match step {
        // Before the heap's memory is passed: IPC handles, which heap memory has none of.
        SymHeapStep::Export | SymHeapStep::Exchange | SymHeapStep::Import => format!(
            "error: IPC window (the symmetric heap failed on rank {failing}: {injected}): rank 0"
        ),
        // The flat range: each peer mapped on its own.
        SymHeapStep::Reserve | SymHeapStep::Map => format!(
            "ipc: the flat range failed on rank {failing}: {injected}; each peer mapped on its own"
        ),
        SymHeapStep::Multicast => "symmetric without multicast".into(),
        SymHeapStep::IpcExport | SymHeapStep::IpcOpen => format!(
            "error: IPC window (rank 0's buffer is not memory of alloc_symmetric): rank {failing}: {injected}"
        ),
    }
}

#[test]
fn a_failure_at_every_step_releases_everything() {
    const T: &str = "a_failure_at_every_step_releases_everything";
    let Some(me) = rank_of(T) else {
        let out = Job::new(T, 3).multicast("on").run();
        for f in &out {
            let got = f.lines("OUTCOME ");
            assert_eq!(got.len(), SymHeapStep::ALL.len(), "{}", f.stdout);
            assert_eq!(got, out[0].lines("OUTCOME "), "every rank ends alike");
        }
        out[0]
            .lines("OUTCOME ")
            .iter()
            .for_each(|l| println!("{l}"));
        return;
    };
    let comm = communicator();
    let world = comm.world();
    let words = 1024;
    let heap = comm.alloc_symmetric(words * 8).unwrap();
    let plain = comm.device().mem_alloc(words * 8, MemKind::DEVICE).unwrap();
    // SAFETY: `heap` holds `words * 8` bytes.
    unsafe {
        upload(
            &comm,
            heap.ptr(),
            &(0..words).map(|i| pattern(5, me, i)).collect::<Vec<_>>(),
        )
    };
    // SAFETY: `plain` is a fresh allocation of `words * 8` bytes.
    unsafe {
        upload(
            &comm,
            plain,
            &(0..words).map(|i| pattern(5, me, i)).collect::<Vec<_>>(),
        )
    };
    // The IPC steps run on IPC handles, of device memory.
    let buf_for = |step: SymHeapStep| match step {
        SymHeapStep::IpcExport | SymHeapStep::IpcOpen => plain,
        _ => heap.ptr(),
    };
    // Warm up every path once.
    for step in [SymHeapStep::Export, SymHeapStep::IpcExport] {
        // SAFETY: a live allocation of this rank of at least the registered size, kept until the window is deregistered.
        let w =
            unsafe { comm.register_window(buf_for(step), words * 8, WindowFlags::NONE) }.unwrap();
        comm.deregister_window(w).unwrap();
    }
    comm.barrier().unwrap();
    let before = usage();
    for (i, step) in SymHeapStep::ALL.into_iter().enumerate() {
        let failing = i % world;
        if me == failing {
            comm.inject_window_failure(step);
        }
        // SAFETY: a live allocation of this rank of at least the registered size, kept until the window is deregistered.
        let outcome =
            match unsafe { comm.register_window(buf_for(step), words * 8, WindowFlags::NONE) } {
                Ok(win) => {
                    comm.barrier().unwrap();
                    let what = match (win.kind(), win.has_multicast()) {
                        (WindowKind::Symmetric, false) => {
                            check_flat_reads(&comm, &win, 5);
                            "symmetric without multicast".to_string()
                        }
                        (WindowKind::Ipc, _) => {
                            check_ipc(&comm, &win, 5);
                            format!("ipc: {}", win.reason())
                        }
                        (kind, mc) => format!("{kind} with multicast {mc}"),
                    };
                    comm.barrier().unwrap();
                    comm.deregister_window(win).unwrap();
                    what
                }
                Err(e) => format!("error: {e}"),
            };
        let want = expected(step, failing);
        assert!(
            outcome.starts_with(&want),
            "step {step} failing on rank {failing}:\n got: {outcome}\nwant: {want}..."
        );
        assert_eq!(usage(), before, "after a failure at {step}");
        println!("OUTCOME {step} on rank {failing}: {outcome}");
    }
    // SAFETY: the allocation made above; every window over it is gone.
    unsafe { comm.device().mem_free(plain, MemKind::DEVICE) }.unwrap();
    println!("RANK OK");
}

/// The `f32` rank `r` holds at element `i` (sums stay exact).
fn value(r: usize, i: usize) -> f32 {
    (r as f32 + 1.0) * 0.5 + (i % 97) as f32 * 0.25 - (r * i % 5) as f32
}

#[test]
fn multicast_emulation_end_to_end() {
    const T: &str = "multicast_emulation_end_to_end";
    let Some(me) = rank_of(T) else {
        drop(Job::new(T, 4).multicast("on").run());
        return;
    };
    use ferrocx_adaptor_host::multicast;
    let comm = communicator();
    let world = comm.world();
    assert!(
        comm.window_plan().multicast.allowed,
        "{}",
        comm.window_plan()
    );
    let buf = comm.alloc_symmetric(2 * 4096).unwrap();
    // SAFETY: `buf` is a symmetric allocation of `buf.capacity()` bytes, not yet shared.
    unsafe { comm.device().mem_set(buf.ptr(), 0, buf.capacity()) }.unwrap();
    // SAFETY: a live allocation of this rank of at least the registered size, kept until the window is deregistered.
    let win = unsafe { comm.register_window(buf.ptr(), buf.size(), WindowFlags::NONE) }.unwrap();
    assert_eq!(win.kind(), WindowKind::Symmetric);
    let mc = win.multicast_base().expect("multicast mapped");
    assert_eq!(win.view().flags & VIEW_MULTICAST, VIEW_MULTICAST);
    assert_eq!(win.view().multicast_base, mc);
    comm.barrier().unwrap();

    // One store from each rank reaches every rank's memory.
    let word = |r: usize| 0x5eed_0000_0000_0000u64 | ((r as u64) << 16) | 0xabc;
    multicast::store(mc.0 + 8 * me as u64, &word(me).to_le_bytes()).unwrap();
    comm.barrier().unwrap();
    let all: Vec<u64> = (0..world).map(word).collect();
    assert_eq!(
        // SAFETY: the first `world` words of this rank's window of 4096 bytes.
        unsafe { download(&comm, win.local(), world) },
        all,
        "own memory"
    );
    for p in 0..world {
        assert_eq!(
            // SAFETY: the first `world` words of rank `p`'s window, mapped while `win` is
            // registered.
            unsafe { download(&comm, win.peer(p).unwrap(), world) },
            all,
            "rank {p}'s memory"
        );
    }

    // A reduce-load sums every rank's memory.
    let n = 1000;
    let at = 4096u64;
    let mine: Vec<f32> = (0..n).map(|i| value(me, i)).collect();
    // SAFETY: `at + n * 4 <= 4096 + 4000` bytes of this rank's `2 * 4096`-byte window; `mine` holds
    // `n` f32s.
    unsafe {
        comm.device().mem_copy(
            DevicePtr(win.local().0 + at),
            window_ranks::host_ptr(&mine),
            n * 4,
        )
    }
    .unwrap();
    comm.barrier().unwrap();
    let mut out = vec![0u8; n * 4];
    multicast::load_reduce(mc.0 + at, &mut out, DataType::F32, ReduceOp::SUM).unwrap();
    let got: Vec<f32> = out
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    let want: Vec<f32> = (0..n)
        .map(|i| (0..world).map(|r| value(r, i)).sum())
        .collect();
    assert_eq!(got, want);
    comm.barrier().unwrap();
    comm.deregister_window(win).unwrap();

    // The flag opts one window out where every rank allows multicast.
    // SAFETY: a live allocation of this rank of at least the registered size, kept until the window is deregistered.
    let win =
        unsafe { comm.register_window(buf.ptr(), buf.size(), WindowFlags::NO_MULTICAST) }.unwrap();
    assert_eq!(
        (win.kind(), win.has_multicast()),
        (WindowKind::Symmetric, false)
    );
    comm.deregister_window(win).unwrap();
    println!("RANK OK");
}

#[test]
fn multicast_kill_switches_turn_it_off_everywhere() {
    const T: &str = "multicast_kill_switches_turn_it_off_everywhere";
    let Some(me) = rank_of(T) else {
        // One rank's switch is everyone's "no"; NCCL's switch does the same for all.
        let out = Job::new(T, 3)
            .multicast("on")
            .env_of(1, "FERROCX_MULTICAST", "0")
            .run();
        assert_eq!(out[1].lines("PLAN "), vec!["off".to_string()]);
        assert_eq!(out[0].lines("PLAN "), vec!["allowed".to_string()]);
        let out = Job::new(T, 2)
            .multicast("on")
            .env("NCCL_NVLS_ENABLE", "0")
            .run();
        assert!(out.iter().all(|f| f.lines("PLAN ") == ["off"]));
        return;
    };
    let comm = communicator();
    let plan = comm.window_plan();
    let killed = ["FERROCX_MULTICAST", "NCCL_NVLS_ENABLE"]
        .iter()
        .find(|v| std::env::var(v).is_ok_and(|x| x == "0"));
    if let Some(var) = killed {
        assert!(!plan.multicast.allowed);
        assert!(
            plan.multicast.reason.contains(var),
            "{}",
            plan.multicast.reason
        );
        // The config's `apply_env` (in `from_env`) already turned `on` off with its warning;
        // the plan does not repeat it.
        assert_eq!(plan.multicast.warning, None);
    }
    println!(
        "PLAN {}",
        if plan.multicast.allowed {
            "allowed"
        } else {
            "off"
        }
    );
    let buf = comm.alloc_symmetric(4096).unwrap();
    // SAFETY: a live allocation of this rank of at least the registered size, kept until the window is deregistered.
    let win = unsafe { comm.register_window(buf.ptr(), buf.size(), WindowFlags::NONE) }.unwrap();
    assert_eq!(win.kind(), WindowKind::Symmetric);
    assert!(!win.has_multicast(), "rank {me}: no rank may map multicast");
    comm.deregister_window(win).unwrap();
    println!("RANK OK");
}

#[test]
fn plans_name_the_choice_and_the_reason() {
    use ferrocx::config::{Config, Fallback, MulticastMode, WindowMode};
    use ferrocx::registry::Registry;
    ferrocx_adaptor_host::link();
    let config = Config::default_local();
    let sel = Registry::with_builtins().select(&config, 0).unwrap();
    let no_env = |_: &str| None;
    let plan_of = |window, fallback, multicast| {
        let mut c = config.clusters[0].clone();
        (c.window, c.fallback, c.multicast) = (window, fallback, multicast);
        ferrocx::window::plan(&c, &sel.device, &sel.ccl, no_env)
    };
    let auto = plan_of(WindowMode::Auto, Fallback::SymHeap, MulticastMode::Auto);
    assert_eq!(auto.backing, Backing::SymHeap);
    assert_eq!(auto.reason, "the CCL `host` has no window group");
    assert!(auto.multicast.allowed, "{auto}");
    let forced = plan_of(WindowMode::SymHeap, Fallback::Disabled, MulticastMode::Off);
    assert_eq!(
        (forced.backing, forced.reason.as_str()),
        (Backing::SymHeap, "window = \"symheap\"")
    );
    assert_eq!(
        (forced.multicast.allowed, forced.multicast.reason.as_str()),
        (false, "multicast = \"off\" in the config")
    );
    let none = plan_of(WindowMode::Auto, Fallback::Disabled, MulticastMode::Auto);
    assert_eq!(none.backing, Backing::Unavailable);
    assert!(none.reason.contains("fallback = \"none\""), "{none}");
    let vendor = plan_of(WindowMode::Vendor, Fallback::SymHeap, MulticastMode::Auto);
    assert_eq!(vendor.backing, Backing::Unavailable);
    assert_eq!(
        vendor.reason,
        "window = \"vendor\", but the CCL `host` has no window group"
    );
    let ipc = plan_of(WindowMode::Ipc, Fallback::SymHeap, MulticastMode::On);
    assert_eq!(ipc.backing, Backing::Ipc);
    assert!(!ipc.multicast.allowed);
    assert!(
        ipc.multicast.warning.is_some(),
        "`on` cannot be honoured: a warning"
    );
}

/// One rank of [`two_communicators_are_distinct`]: two communicators made one after
/// the other, each reducing its own values.
fn two_communicators(rank: usize, world: usize) {
    let first = communicator();
    let second = communicator();
    let n = 1027;
    for (comm, scale) in [(&first, 1.0f32), (&second, 1000.0)] {
        let dev = comm.device();
        let buf = dev.mem_alloc(n * 4, MemKind::DEVICE).expect("buffer");
        let mine: Vec<f32> = (0..n)
            .map(|i| scale * (rank + 1) as f32 + i as f32)
            .collect();
        // SAFETY: `buf` is a fresh allocation of `n * 4` bytes; `mine` holds `n` f32s.
        unsafe { dev.mem_copy(buf, DevicePtr(mine.as_ptr() as u64), n * 4) }.expect("upload");
        // SAFETY: `buf` holds `n` f32 and is freed after the synchronize below.
        unsafe { comm.all_reduce(buf, buf, n, DataType::F32, ReduceOp::SUM) }.expect("all_reduce");
        comm.synchronize().expect("synchronize");
        let mut got = vec![0f32; n];
        // SAFETY: `buf` holds `n` f32s, reduced before the synchronize above; `got` holds as many.
        unsafe { dev.mem_copy(DevicePtr(got.as_mut_ptr() as u64), buf, n * 4) }.expect("download");
        let ranks_sum = (world * (world + 1) / 2) as f32;
        for (i, v) in got.iter().enumerate() {
            let want = scale * ranks_sum + (world * i) as f32;
            assert_eq!(
                *v, want,
                "element {i} of the communicator scaled by {scale}"
            );
        }
        // SAFETY: the allocation made above; the stream was synchronized.
        unsafe { dev.mem_free(buf, MemKind::DEVICE) }.expect("free");
    }
    println!("two communicators: ok");
    println!("RANK OK");
}

#[test]
fn two_communicators_are_distinct() {
    const T: &str = "two_communicators_are_distinct";
    match rank_of(T) {
        Some(rank) => two_communicators(rank, 3),
        None => {
            let out = Job::new(T, 3).run();
            for f in &out {
                assert_eq!(
                    f.lines("two communicators: "),
                    vec!["ok"],
                    "rank {}",
                    f.rank
                );
            }
        }
    }
}
