//! A tensor-parallel layer's all-gather + matmul, pipelined: every rank holds `m` rows of the
//! activations `X` (`k` columns); the layer computes `Y = X_full · W` with `X_full` the
//! all-gather of every rank's rows. Two ways, each checked against a reference computed here:
//!
//! - **plain**: `all_gather` on the communicator's stream, then one matmul over `X_full`;
//! - **pipelined**: `all_gather_p2p_each`: slice `j`'s transfer on the communicator's stream
//!   `j mod S`, and slice `j`'s matmul enqueued on that stream right after its event, so the
//!   matmul of one slice runs while the next slices are on the wire.
//!
//! The matmul is `ferrocx_kernels::matmul`: on the host device a CPU kernel run in stream
//! order (a host function on the stream); on a device with a kernel group that loads CUBIN
//! (CUDA), a tiled kernel compiled by NVRTC and launched through the group.
//!
//! ```text
//! cargo build --release -p ferrocx-cli --bin ferrocx --example allgather_matmul
//! FERROCX_CONFIG=configs/local.toml ./target/release/ferrocx launch -n 4 -- \
//!     ./target/release/examples/allgather_matmul --m 256 --k 512 --n 512 --streams 2 --iters 5
//! ```
//!
//! Options (all optional): `--m` rows per rank (64), `--k` (128), `--n` (96), `--streams` S
//! (2), `--iters` timed runs of each (3), `--route` of the pipelined gather (`auto`: the
//! router's, the default; `ccl`, `window-copies`, `window-reads` forced), `--pieces P` (each
//! peer's slice in P pieces, each multiplied as it lands: the window-copies route), and
//! `--in-window`: the tensor-parallel layout, `X_full` in symmetric memory registered as a
//! window (`WindowFlags::PEERS`) with this rank's rows already in their place, so the
//! gather is in place and, on 2 GPUs, pushes each rank's rows straight into its peers' `X_full`
//! (`Call::output_window`) while each rank multiplies its own rows at once. Rank 0 prints the
//! routes, the times (best of the runs, wall clock around each way and a synchronize) and
//! their ratio.
//!
//! ```text
//! FERROCX_CONFIG=configs/nccl.toml ./target/release/ferrocx launch -n 2 -- \
//!     ./target/release/examples/allgather_matmul --m 131072 --k 64 --n 16 --in-window --pieces 2
//! ```

use std::time::{Duration, Instant};

use ferrocx::abi::{DataType, DevicePtr, MemKind};
use ferrocx::adaptor::DeviceBuffer;
use ferrocx::comm::Communicator;
use ferrocx::route::Route;
use ferrocx::window::{SymmetricBuffer, Window, WindowFlags};
use ferrocx_kernels::matmul::Matmul;

type Error = Box<dyn std::error::Error>;

/// X_full's memory.
enum Full {
    Device(DeviceBuffer),
    Symmetric(SymmetricBuffer),
}

impl Full {
    fn ptr(&self) -> DevicePtr {
        match self {
            Full::Device(b) => b.ptr(),
            Full::Symmetric(b) => b.ptr(),
        }
    }
}

/// Rank `r`'s activations: small integers, so every product sum is exact in f32.
fn x_of(r: usize, m: usize, k: usize) -> Vec<f32> {
    (0..m * k)
        .map(|i| ((r * 131 + (i / k) * 7 + (i % k) * 3) % 9) as f32 - 4.0)
        .collect()
}

fn w_of(k: usize, n: usize) -> Vec<f32> {
    (0..k * n)
        .map(|i| (((i / n) * 5 + (i % n) * 11) % 7) as f32 - 3.0)
        .collect()
}

fn bytes_of(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_ne_bytes()).collect()
}

fn floats(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_ne_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn arg(args: &[String], name: &str, default: usize) -> Result<usize, Error> {
    match args.iter().position(|a| a == name) {
        None => Ok(default),
        Some(i) => {
            let v = args
                .get(i + 1)
                .ok_or_else(|| format!("{name} needs a value"))?;
            let n: usize = v
                .parse()
                .map_err(|_| format!("{name}: expected a positive integer, not {v:?}"))?;
            if n == 0 {
                return Err(format!("{name}: expected a positive integer, not 0").into());
            }
            Ok(n)
        }
    }
}

/// `--route`: `None` for the router's choice.
fn route_arg(args: &[String]) -> Result<Option<Route>, Error> {
    let Some(i) = args.iter().position(|a| a == "--route") else {
        return Ok(None);
    };
    match args.get(i + 1).map(String::as_str) {
        Some("auto") => Ok(None),
        Some("ccl") => Ok(Some(Route::Ccl)),
        Some("window-copies") => Ok(Some(Route::WindowCopies)),
        Some("window-reads") => Ok(Some(Route::WindowReads)),
        Some(other) => Err(format!(
            "--route: expected auto, ccl, window-copies or window-reads, not {other}"
        )
        .into()),
        None => Err("--route needs a value".into()),
    }
}

fn main() -> Result<(), Error> {
    if let Ok(filter) = std::env::var("FERROCX_LOG") {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .with_span_events(tracing_subscriber::fmt::format::FmtSpan::NEW)
            .with_writer(std::io::stderr)
            .init();
    }
    let args: Vec<String> = std::env::args().skip(1).collect();
    const OPTIONS: [&str; 8] = [
        "--m",
        "--k",
        "--n",
        "--streams",
        "--iters",
        "--route",
        "--pieces",
        "--in-window",
    ];
    if let Some(a) = args
        .iter()
        .find(|a| a.starts_with("--") && !OPTIONS.contains(&a.as_str()))
    {
        return Err(format!("unknown option {a}: expected one of {}", OPTIONS.join(", ")).into());
    }
    let in_window = args.iter().any(|a| a == "--in-window");
    let forced = route_arg(&args)?;
    let (m, k, n) = (
        arg(&args, "--m", 64)?,
        arg(&args, "--k", 128)?,
        arg(&args, "--n", 96)?,
    );
    let streams = arg(&args, "--streams", ferrocx::comm::DEFAULT_P2P_STREAMS)?;
    let iters = arg(&args, "--iters", 3)?;
    let pieces = arg(&args, "--pieces", 1)?;

    ferrocx_adaptor_host::link();
    ferrocx_kernels::link();
    let comm = Communicator::from_env()?;
    let (rank, world) = (comm.rank(), comm.world());
    let dev = comm.device();
    let matmul = Matmul::new(dev)?;

    // The reference: every rank's rows times W, in f64 (exact for these values).
    let w = w_of(k, n);
    let mut reference = vec![0f32; world * m * n];
    for r in 0..world {
        let x = x_of(r, m, k);
        for i in 0..m {
            for c in 0..n {
                let s: f64 = (0..k)
                    .map(|kk| f64::from(x[i * k + kk]) * f64::from(w[kk * n + c]))
                    .sum();
                reference[(r * m + i) * n + c] = s as f32;
            }
        }
    }

    let x = DeviceBuffer::from_host(dev, &bytes_of(&x_of(rank, m, k)), MemKind::DEVICE)?;
    let wb = DeviceBuffer::from_host(dev, &bytes_of(&w), MemKind::DEVICE)?;
    let full_bytes = world * m * k * 4;
    // `--in-window`: X_full in the symmetric heap, a window of peer addresses; else device
    // memory.
    let (full, window): (Full, Option<Window>) = if in_window {
        let mem = comm.alloc_symmetric(full_bytes)?;
        // SAFETY: a live symmetric allocation of its size, deregistered below before it is
        // freed.
        let w = unsafe {
            comm.register_window(
                mem.ptr(),
                mem.size(),
                WindowFlags::PEERS | WindowFlags::NO_MULTICAST,
            )
        }?;
        (Full::Symmetric(mem), Some(w))
    } else {
        (
            Full::Device(DeviceBuffer::new(dev, full_bytes, MemKind::DEVICE)?),
            None,
        )
    };
    let x_full = full.ptr();
    // The gather's input: `x`, or in the window this rank's rows of X_full (put there once:
    // the gathers leave them in place).
    let send = if in_window {
        let own = DevicePtr(x_full.0 + (rank * m * k * 4) as u64);
        // SAFETY: `x` holds `m * k` f32, and this rank's rows of X_full as many.
        unsafe { dev.mem_copy(own, x.ptr(), m * k * 4) }?;
        own
    } else {
        x.ptr()
    };
    let mut y = DeviceBuffer::new(dev, world * m * n * 4, MemKind::DEVICE)?;
    let at = |buf: &DeviceBuffer, elems: usize| DevicePtr(buf.ptr().0 + (elems * 4) as u64);

    let plain = |y: &DeviceBuffer| -> Result<(), Error> {
        // SAFETY: the buffers hold what the shapes say and live past the synchronize.
        unsafe {
            comm.all_gather(send, x_full, m * k, DataType::F32)?;
            matmul.enqueue(
                dev,
                comm.stream(),
                [x_full, wb.ptr(), y.ptr()],
                (world * m, n, k),
            )?;
        }
        comm.synchronize()?;
        Ok(())
    };
    let mut route = None;
    let mut pipelined = |y: &DeviceBuffer| -> Result<(), Error> {
        let hook = |s: &ferrocx::comm::Slice| {
            // A slice, or a piece of one: whole rows of X_full from `row` on.
            let row = (s.ptr.0 - x_full.0) as usize / (k * 4);
            // SAFETY: those rows of `x_full` (`s.count / k` of them) are in place when the
            // stream reaches this point (after its event; this rank's own in place from the
            // start in the window); the rows of `y` it writes are its own.
            unsafe {
                matmul.enqueue(
                    dev,
                    s.stream,
                    [s.ptr, wb.ptr(), at(y, row * n)],
                    (s.count / k, n, k),
                )
            }
            .map_err(ferrocx::comm::CommError::PointToPoint)
        };
        let mut call = match forced {
            Some(r) => comm.call().via(r),
            None => comm.call(),
        };
        call = call.pieces(m.div_ceil(pieces) * k);
        if let Some(w) = &window {
            call = call.output_window(w);
        }
        // SAFETY: the buffers hold what the shapes say and live past the synchronize.
        let h =
            unsafe { call.all_gather_p2p_each(send, x_full, m * k, DataType::F32, streams, hook) }?;
        route = Some(h.route());
        h.join(comm.stream())?;
        h.synchronize()?;
        drop(h);
        comm.synchronize()?;
        Ok(())
    };

    let check = |y: &mut DeviceBuffer, what: &str| -> Result<(), Error> {
        let got = floats(&y.to_vec()?);
        let wrong = got.iter().zip(&reference).filter(|(a, b)| a != b).count();
        if wrong > 0 {
            return Err(format!(
                "rank {rank}: {what}: {wrong} of {} elements wrong",
                got.len()
            )
            .into());
        }
        y.fill(0xff)?;
        Ok(())
    };

    let mut best = [Duration::MAX; 2];
    for it in 0..=iters {
        for (i, name) in ["plain", "pipelined"].into_iter().enumerate() {
            comm.barrier()?;
            let t = Instant::now();
            if i == 0 {
                plain(&y)?;
            } else {
                pipelined(&y)?;
            }
            let took = t.elapsed();
            // The first run of each is a warm-up.
            if it > 0 {
                best[i] = best[i].min(took);
            }
            check(&mut y, name)?;
        }
    }
    comm.barrier()?;
    if let Some(w) = window {
        comm.deregister_window(w)?;
    }
    drop(full);
    if rank == 0 {
        let route = route.map_or("-".to_string(), |r| r.to_string());
        let layout = match in_window {
            true => ", X_full in a window, gathered in place",
            false => "",
        };
        println!(
            "allgather_matmul on {world} ranks, {m}x{k} rows per rank times {k}x{n}, {streams} stream(s), {pieces} piece(s) a slice{layout}, matmul: {}",
            matmul.name()
        );
        println!(
            "plain all_gather + matmul: correct, {:.3} ms",
            best[0].as_secs_f64() * 1e3
        );
        println!(
            "pipelined all_gather_p2p (route {route}) + per-slice matmul: correct, {:.3} ms",
            best[1].as_secs_f64() * 1e3
        );
        println!(
            "plain / pipelined: {:.2}",
            best[0].as_secs_f64() / best[1].as_secs_f64()
        );
    }
    println!("rank {rank}: both ways correct");
    Ok(())
}
