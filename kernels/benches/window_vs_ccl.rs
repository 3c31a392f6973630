//! The window all-reduce (one-shot, two-shot, ring) against the CCL's own all-reduce on the host
//! backend, in one run: every rank is a process (this executable re-run with a launcher's
//! variables and a store the parent hosts), f32 sum, out of place, the mean time of back-to-back
//! calls (as nccl-tests), the median of several timed runs, each method's result checked once
//! per size.
//!
//! ```text
//! cargo bench -p ferrocx-kernels --bench window_vs_ccl                 # 2 and 4 ranks
//! cargo bench -p ferrocx-kernels --bench window_vs_ccl -- --ranks 2 --sizes 8,4K
//! ```

use std::net::{Ipv4Addr, SocketAddr};
use std::process::{Command, Stdio};
use std::time::Instant;

use ferrocx::abi::{DataType, MemKind, ReduceOp};
use ferrocx::adaptor::DeviceBuffer;
use ferrocx::bootstrap::StoreServer;
use ferrocx::comm::Communicator;
use ferrocx::route::Route;
use ferrocx::window::collectives::WindowAlgo;

const ROLE: &str = "FERROCX_KERNELS_BENCH_RANK";
const TOKEN: &str = "kernels-bench";
const REPEATS: usize = 5;

#[derive(Clone, Copy, Debug, PartialEq)]
enum Method {
    Ccl,
    Window(WindowAlgo),
}

impl Method {
    const ALL: [Method; 4] = [
        Method::Ccl,
        Method::Window(WindowAlgo::OneShot),
        Method::Window(WindowAlgo::TwoShot),
        Method::Window(WindowAlgo::Ring),
    ];

    fn name(self) -> String {
        match self {
            Method::Ccl => "ccl".into(),
            Method::Window(a) => a.name().into(),
        }
    }
}

fn parse_size(s: &str) -> usize {
    let (digits, shift) = match s.chars().last() {
        Some('K') => (&s[..s.len() - 1], 10),
        Some('M') => (&s[..s.len() - 1], 20),
        _ => (s, 0),
    };
    digits.parse::<usize>().expect("a size: digits with K or M") << shift
}

fn arg(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

fn iters_for(bytes: usize) -> usize {
    match bytes {
        0..=4096 => 2000,
        4097..=1_048_576 => 200,
        _ => 5,
    }
}

fn main() {
    if std::env::var(ROLE).is_ok() {
        rank();
        return;
    }
    let ranks: Vec<usize> = arg("--ranks")
        .unwrap_or_else(|| "2,4".into())
        .split(',')
        .map(|r| r.parse().expect("--ranks 2,4"))
        .collect();
    let sizes = arg("--sizes").unwrap_or_else(|| "8,4K,256K,64M".into());
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!("# f32 sum, out of place, host backend, {cores} cores; time in us (mean of back-to-back calls, median of {REPEATS} runs)");
    for world in ranks {
        run_job(world, &sizes);
    }
}

/// Runs `world` ranks and prints rank 0's table.
fn run_job(world: usize, sizes: &str) {
    let dir = std::env::temp_dir().join(format!("ferrocx-kbench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let config = dir.join("bench.toml");
    std::fs::write(
        &config,
        "[runtime]\ntimeout_ms = 60000\n\n[[cluster]]\nname = \"local\"\ndevice = \"host\"\nccl = \"host\"\nmulticast = \"off\"\n",
    )
    .expect("config");
    let server =
        StoreServer::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)), TOKEN.into()).expect("store");
    let job = format!("kb{}w{world}", std::process::id());
    let children: Vec<_> = (0..world)
        .map(|rank| {
            Command::new(std::env::current_exe().expect("exe"))
                .env(ROLE, "1")
                .env("RANK", rank.to_string())
                .env("WORLD_SIZE", world.to_string())
                .env("LOCAL_RANK", rank.to_string())
                .env("LOCAL_WORLD_SIZE", world.to_string())
                .env("MASTER_ADDR", "127.0.0.1")
                .env("MASTER_PORT", server.local_addr().port().to_string())
                .env("FERROCX_STORE_HOSTED", "1")
                .env("FERROCX_JOB_ID", &job)
                .env("FERROCX_JOB_TOKEN", TOKEN)
                .env("FERROCX_CONFIG", &config)
                .env("BENCH_SIZES", sizes)
                .stdout(if rank == 0 {
                    Stdio::inherit()
                } else {
                    Stdio::null()
                })
                .spawn()
                .expect("spawn a rank")
        })
        .collect();
    for mut c in children {
        let status = c.wait().expect("wait");
        assert!(status.success(), "a rank failed: {status}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

fn rank() {
    ferrocx_adaptor_host::link();
    ferrocx_kernels::link();
    let comm = Communicator::from_env().expect("communicator");
    let (me, world) = (comm.rank(), comm.world());
    let sizes: Vec<usize> = std::env::var("BENCH_SIZES")
        .expect("sizes")
        .split(',')
        .map(parse_size)
        .collect();
    let max = *sizes.iter().max().expect("a size");
    let dev = comm.device();
    let mut send_buf = DeviceBuffer::new(dev, max, MemKind::DEVICE).expect("alloc");
    let mut recv_buf = DeviceBuffer::new(dev, max, MemKind::DEVICE).expect("alloc");
    let (send, recv) = (send_buf.ptr(), recv_buf.ptr());
    // Rank r holds r + 1 everywhere: the sum is world * (world + 1) / 2, exact.
    let mine: Vec<u8> = (0..max / 4)
        .flat_map(|_| ((me + 1) as f32).to_ne_bytes())
        .collect();
    send_buf.copy_from_host(&mine).expect("upload");
    let want = (world * (world + 1) / 2) as f32;
    if me == 0 {
        println!("\n## {world} ranks");
        println!(
            "| size | {} | {} |",
            Method::ALL.map(|m| m.name()).join(" | "),
            Method::ALL[1..]
                .iter()
                .map(|m| format!("{} / ccl", m.name()))
                .collect::<Vec<_>>()
                .join(" | ")
        );
        println!("|---:|{}", "---:|".repeat(2 * Method::ALL.len() - 1));
    }
    for &bytes in &sizes {
        let count = bytes / 4;
        let route = |m: Method| match m {
            Method::Ccl => Route::Ccl,
            Method::Window(a) => Route::Window(a),
        };
        // SAFETY: `send` and `recv` hold the largest size and outlive every synchronize.
        let call = |m: Method| unsafe {
            comm.call()
                .via(route(m))
                .all_reduce(send, recv, count, DataType::F32, ReduceOp::SUM)
                .map_err(|e| e.to_string())
        };
        let mut row = Vec::new();
        for m in Method::ALL {
            // Beyond one parity of the scratch window one-shot and two-shot are the ring.
            if matches!(m, Method::Window(WindowAlgo::OneShot | WindowAlgo::TwoShot))
                && bytes > world << 20
            {
                row.push(None);
                continue;
            }
            recv_buf.fill(0).expect("clear");
            call(m).expect("all-reduce");
            comm.synchronize().expect("sync");
            let mut got = vec![0u8; bytes];
            recv_buf.copy_to_host(&mut got).expect("download");
            assert!(
                got.chunks_exact(4)
                    .all(|v| f32::from_ne_bytes(v.try_into().expect("4 bytes")) == want),
                "{}: wrong result at {bytes} bytes",
                m.name()
            );
            let iters = iters_for(bytes);
            for _ in 0..iters.min(20) {
                call(m).expect("warm-up");
            }
            comm.synchronize().expect("sync");
            let mut runs = Vec::new();
            for _ in 0..REPEATS {
                comm.barrier().expect("barrier");
                let start = Instant::now();
                for _ in 0..iters {
                    call(m).expect("all-reduce");
                }
                comm.synchronize().expect("sync");
                runs.push(start.elapsed().as_secs_f64() * 1e6 / iters as f64);
            }
            runs.sort_by(f64::total_cmp);
            row.push(Some(runs[REPEATS / 2]));
        }
        if me == 0 {
            let show = |v: Option<f64>| v.map_or("-".to_string(), |t| format!("{t:.2}"));
            let ratio = |v: Option<f64>| match (v, row[0]) {
                (Some(t), Some(c)) => format!("{:.2}", t / c),
                _ => "-".into(),
            };
            let size = match bytes {
                b if b >= 1 << 20 => format!("{} MiB", b >> 20),
                b if b >= 1 << 10 => format!("{} KiB", b >> 10),
                b => format!("{b} B"),
            };
            println!(
                "| {size} | {} | {} |",
                row.iter().map(|&v| show(v)).collect::<Vec<_>>().join(" | "),
                row[1..]
                    .iter()
                    .map(|&v| ratio(v))
                    .collect::<Vec<_>>()
                    .join(" | ")
            );
        }
    }
    comm.barrier().expect("barrier");
}
