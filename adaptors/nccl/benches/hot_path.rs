//! What the NCCL adaptor adds to the host side of one small collective: the time to enqueue an
//! 8-byte all-reduce through the adaptor (watchdog on and off) against libnccl called directly,
//! on one GPU with one-rank communicators, and the cost of the driver calls the watchdog makes
//! per operation, all in one process and interleaved.
//!
//! ```text
//! cargo bench -p ferrocx-adaptor-nccl --bench hot_path            # on a machine with a GPU
//! ```
//!
//! Each method enqueues batches of `BATCH` calls back to back; the host time of a batch (the
//! enqueue, not the GPU work: the stream is synchronised after the clock stops) over `BATCH` is
//! one sample, and the methods take turns batch by batch. `--without-watchdog` leaves out the
//! watched communicator (and so the watchdog's thread), to see what that thread costs the others. The table gives the median per call
//! and what each method adds over NCCL called directly. The driver calls timed alone go through
//! the CUDA adaptor's loader (`ferrocx_adaptor_cuda::shared`), the very calls the watchdog makes.
//! Without a CUDA driver or libnccl it prints why and exits 0.

use std::ffi::c_void;
use std::time::Instant;

use ferrocx_adaptor_cuda::shared::{self as cuda, CUevent, CUresult};
use ferrocx_adaptor_cuda::CudaDevice;
use ferrocx_adaptor_nccl::library::{Api, Candidates};
use ferrocx_adaptor_nccl::{sys, NcclCcl};
use ferrocx_plugin_sdk::abi::{Comm, DataType, MemKind, ReduceOp, Stream};
use ferrocx_plugin_sdk::{CclAdaptor, CommInit, DeviceAdaptor, Options};

/// Calls per timed batch (well below the depth at which a launch queue blocks the host).
const BATCH: usize = 200;
/// Batches per method.
const ROUNDS: usize = 60;

/// One way of issuing a call.
struct Method<'a> {
    name: &'static str,
    call: Box<dyn FnMut() + 'a>,
    samples: Vec<f64>,
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    if !ferrocx_adaptor_cuda::is_present() {
        println!("hot_path: skipped, no CUDA driver");
        return;
    }
    let dev = CudaDevice::instance();
    dev.init(&Options::default()).expect("CUDA adaptor init");
    dev.set_device(0).expect("set_device");
    let ccl = NcclCcl::instance();
    if let Err(e) = ccl.init(&Options::default()) {
        println!("hot_path: skipped, {}", e.message());
        return;
    }
    // The driver as the watchdog reaches it: the CUDA adaptor's one loader.
    let driver = cuda::Driver::get().expect("the CUDA driver");
    let api: &'static Api = Box::leak(Box::new(
        Api::load(&Candidates::from(&Options::default())).expect("libnccl"),
    ));

    let comm = |watchdog: &str| -> Comm {
        let uid = ccl.unique_id().expect("unique id");
        ccl.comm_init_rank(&CommInit {
            rank: 0,
            nranks: 1,
            device: 0,
            unique_id: &uid,
            timeout_ms: 30_000,
            options: Options::new(vec![("watchdog".into(), watchdog.into())]),
        })
        .expect("one-rank communicator")
    };
    let watched = !std::env::args().any(|a| a == "--without-watchdog");
    let (on, off) = (watched.then(|| comm("on")), comm("off"));
    let mut direct: sys::ncclComm_t = std::ptr::null_mut();
    let mut id = sys::ncclUniqueId {
        internal: [0; sys::NCCL_UNIQUE_ID_BYTES],
    };
    // SAFETY: valid out-pointers; one rank, so the init does not wait for anyone.
    unsafe {
        assert_eq!((api.ncclGetUniqueId)(&mut id), sys::NCCL_SUCCESS);
        assert_eq!(
            (api.ncclCommInitRank)(&mut direct, 1, id, 0),
            sys::NCCL_SUCCESS
        );
    }

    let stream: Stream = dev.stream_create(0).expect("stream");
    let s = stream.0;
    let send = dev.mem_alloc(256, MemKind::DEVICE).expect("mem_alloc");
    let recv = dev.mem_alloc(256, MemKind::DEVICE).expect("mem_alloc");
    let (sp, rp) = (
        send.0 as usize as *const c_void,
        recv.0 as usize as *mut c_void,
    );
    let events: Vec<CUevent> = (0..BATCH)
        .map(|_| {
            driver
                .event_create(cuda::EVENT_DISABLE_TIMING)
                .expect("cuEventCreate")
        })
        .collect();
    let f32t = ferrocx_adaptor_nccl::conv::dtype(DataType::F32, api.version).expect("f32");
    let sum = ferrocx_adaptor_nccl::conv::op(ReduceOp::SUM, api.version).expect("sum");
    let nccl = || {
        // SAFETY: 2 f32 on the device in both buffers, a live communicator and stream.
        let rc = unsafe { (api.ncclAllReduce)(sp, rp, 2, f32t, sum, direct, s) };
        assert_eq!(rc, sys::NCCL_SUCCESS);
    };
    let adaptor = |c: Comm| {
        move || {
            ccl.all_reduce(send, recv, 2, DataType::F32, ReduceOp::SUM, c, stream)
                .expect("all_reduce")
        }
    };
    let recorder = |events: Vec<CUevent>| {
        let mut next = 0usize;
        move || {
            let e = events[next % events.len()];
            next += 1;
            // SAFETY: an event of the current context and a live stream.
            unsafe { driver.event_record(e, s.cast()) }.expect("cuEventRecord");
        }
    };
    let capturing = || {
        // SAFETY: a live stream.
        let captured = unsafe { driver.stream_is_capturing(s.cast()) };
        assert!(!captured.expect("cuStreamIsCapturing"));
    };
    let mut record_after = recorder(events.clone());
    let mut methods = vec![
        Method {
            name: "ncclAllReduce, called directly",
            call: Box::new(nccl),
            samples: Vec::new(),
        },
        Method {
            name: "adaptor, watchdog off",
            call: Box::new(adaptor(off)),
            samples: Vec::new(),
        },
        Method {
            name: "ncclAllReduce + cuEventRecord",
            call: Box::new(move || {
                nccl();
                record_after();
            }),
            samples: Vec::new(),
        },
        Method {
            name: "ncclAllReduce + cuStreamIsCapturing",
            call: Box::new(move || {
                nccl();
                capturing();
            }),
            samples: Vec::new(),
        },
        Method {
            name: "cuEventRecord alone",
            call: Box::new(recorder(events.clone())),
            samples: Vec::new(),
        },
        Method {
            name: "cuStreamIsCapturing alone",
            call: Box::new(capturing),
            samples: Vec::new(),
        },
    ];
    if let Some(on) = on {
        methods.insert(
            2,
            Method {
                name: "adaptor, watchdog on",
                call: Box::new(adaptor(on)),
                samples: Vec::new(),
            },
        );
    }
    // A word of mapped host memory the stream writes a counter into (the alternative to an
    // event), through the same driver table.
    let lib = driver.raw();
    let success = |r| r == CUresult::CUDA_SUCCESS;
    let mut host: *mut c_void = std::ptr::null_mut();
    let mut dptr = 0u64;
    // SAFETY: valid out-pointers; CU_MEMHOSTALLOC_DEVICEMAP (2) maps it for the device. The
    // allocation lives to the process exit.
    let mapped = unsafe {
        success((lib.cuMemHostAlloc)(&mut host, 64, 2))
            && success((lib.cuMemHostGetDevicePointer_v2)(&mut dptr, host, 0))
    };
    if mapped {
        let mut value = 0u32;
        methods.push(Method {
            name: "cuStreamWriteValue32 alone",
            call: Box::new(move || {
                value = value.wrapping_add(1);
                // SAFETY: a device address of mapped host memory; a live stream.
                let r = unsafe { (lib.cuStreamWriteValue32_v2)(s.cast(), dptr, value, 0) };
                assert!(success(r), "cuStreamWriteValue32: {r:?}");
            }),
            samples: Vec::new(),
        });
    } else {
        println!("cuStreamWriteValue32: no mapped host memory on this device");
    }
    // The host-side pieces of the adaptor's path, for the breakdown.
    methods.push(Method {
        name: "Instant::now alone",
        call: Box::new(|| {
            std::hint::black_box(Instant::now());
        }),
        samples: Vec::new(),
    });
    methods.push(Method {
        name: "CLOCK_MONOTONIC_COARSE alone",
        call: Box::new(|| {
            let mut ts = libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            };
            // SAFETY: a valid out-pointer.
            unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut ts) };
            std::hint::black_box(ts.tv_nsec);
        }),
        samples: Vec::new(),
    });
    // The adaptor's communicator table (the SDK's HandleTable: a Mutex<HashMap>).
    let table = ferrocx_plugin_sdk::handles::HandleTable::new("communicator");
    for k in 0..4u64 {
        table.insert(std::sync::Arc::new(k));
    }
    methods.push(Method {
        name: "Mutex<HashMap> lookup + Arc clone alone",
        call: Box::new(move || {
            let v = table.get(2).ok();
            std::hint::black_box(v);
        }),
        samples: Vec::new(),
    });
    // Warm-up: every method a few batches, untimed.
    for m in methods.iter_mut() {
        for _ in 0..5 * BATCH {
            (m.call)();
        }
        dev.stream_synchronize(stream).expect("synchronize");
    }
    for round in 0..ROUNDS {
        let n = methods.len();
        for k in 0..n {
            let m = &mut methods[(k + round) % n];
            let t = Instant::now();
            for _ in 0..BATCH {
                (m.call)();
            }
            let per = t.elapsed().as_secs_f64() * 1e9 / BATCH as f64;
            dev.stream_synchronize(stream).expect("synchronize");
            m.samples.push(per);
        }
    }
    println!(
        "# host time per call, median of {ROUNDS} batches of {BATCH}, 8-byte f32 all-reduce, \
         one rank (NCCL {})",
        api.version_string()
    );
    println!("{:<40} {:>10} {:>12}", "method", "ns/call", "added ns");
    let base = median(&mut methods[0].samples.clone());
    for m in methods.iter_mut() {
        let t = median(&mut m.samples);
        let added = if m.name.contains("alone") {
            String::from("-")
        } else {
            format!("{:+.0}", t - base)
        };
        println!("{:<40} {:>10.0} {:>12}", m.name, t, added);
    }
    drop(methods);
    for e in events {
        // SAFETY: events created above, their records complete (the stream was synchronised);
        // the device's context is current.
        unsafe { driver.event_destroy(e) }.expect("cuEventDestroy");
    }
    // SAFETY: the direct communicator, idle.
    unsafe { (api.ncclCommDestroy)(direct) };
    if let Some(on) = on {
        ccl.comm_destroy(on).expect("destroy");
    }
    ccl.comm_destroy(off).expect("destroy");
    dev.mem_free(send, MemKind::DEVICE).expect("free");
    dev.mem_free(recv, MemKind::DEVICE).expect("free");
    dev.stream_destroy(stream).expect("stream_destroy");
}
