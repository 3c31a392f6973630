//! A tensor-parallel layer's all-gather + matmul, pipelined: every rank holds `m` rows of the
//! activations `X` (`k` columns); the layer computes `Y = X_full · W` with `X_full` the
//! all-gather of every rank's rows. Two ways, each checked against a reference computed here:
//!
//! - **plain**: `all_gather` on the communicator's stream, then one matmul over `X_full`;
//! - **pipelined**: `all_gather_p2p_each`: slice `j`'s transfer on the communicator's stream
//!   `j mod S`, and slice `j`'s matmul enqueued on that stream right after its event, so the
//!   matmul of one slice runs while the next slices are on the wire.
//!
//! On the host device the matmul is a CPU kernel run in stream order (a host function on the
//! stream); on a device with a kernel group that loads CUBIN (CUDA), a tiled kernel compiled
//! by NVRTC and launched through the group.
//!
//! ```text
//! cargo build --release -p ferrocx-cli --bin ferrocx --example allgather_matmul
//! FERROCX_CONFIG=configs/local.toml ./target/release/ferrocx launch -n 4 -- \
//!     ./target/release/examples/allgather_matmul --m 256 --k 512 --n 512 --streams 2 --iters 5
//! ```
//!
//! Options (all optional): `--m` rows per rank (64), `--k` (128), `--n` (96), `--streams` S
//! (2), `--iters` timed runs of each (3). Rank 0 prints the routes, the times (best of the
//! runs, wall clock around each way and a synchronize) and their ratio.

use std::time::{Duration, Instant};

use ferrocx::abi::{Capabilities, DataType, DevicePtr, ImageFormat, MemKind, Stream};
use ferrocx::adaptor::{Device, DeviceBuffer, Function};
use ferrocx::comm::p2p::launch_host;
use ferrocx::comm::Communicator;

type Error = Box<dyn std::error::Error>;

/// The matmul kernel of the CUDA path: `c[m x n] = a[m x k] · b[k x n]`, row-major f32, in
/// 16 x 16 tiles.
const MATMUL_CU: &str = r#"
extern "C" __global__ void fx_matmul_f32(const float* __restrict__ a,
                                         const float* __restrict__ b,
                                         float* __restrict__ c,
                                         unsigned m, unsigned n, unsigned k) {
    __shared__ float ta[16][17];
    __shared__ float tb[16][17];
    unsigned row = blockIdx.y * 16 + threadIdx.y;
    unsigned col = blockIdx.x * 16 + threadIdx.x;
    float acc = 0.f;
    for (unsigned t = 0; t < k; t += 16) {
        ta[threadIdx.y][threadIdx.x] =
            (row < m && t + threadIdx.x < k) ? a[(size_t)row * k + t + threadIdx.x] : 0.f;
        tb[threadIdx.y][threadIdx.x] =
            (t + threadIdx.y < k && col < n) ? b[(size_t)(t + threadIdx.y) * n + col] : 0.f;
        __syncthreads();
        #pragma unroll
        for (int i = 0; i < 16; ++i) acc += ta[threadIdx.y][i] * tb[i][threadIdx.x];
        __syncthreads();
    }
    if (row < m && col < n) c[(size_t)row * n + col] = acc;
}
"#;

/// The matmul of the device: a CPU kernel on the host device, a CUDA kernel elsewhere.
enum Matmul {
    Host,
    Cuda(Function),
}

impl Matmul {
    fn new(dev: &Device) -> Result<Matmul, Error> {
        let index = dev.get_device()?;
        let caps = dev.caps();
        let ordinal = caps
            .ordinal(index)
            .ok_or_else(|| format!("device {index} of `{}` is not listed", dev.name()))?;
        if ordinal
            .capabilities()
            .contains(Capabilities::HOST_ADDRESSABLE | Capabilities::HOST_FUNC)
        {
            return Ok(Matmul::Host);
        }
        let kernels = dev.kernel().ok_or_else(|| {
            format!(
                "the device adaptor `{}` has neither host functions on host memory nor a kernel group",
                dev.name()
            )
        })?;
        if !ordinal.loads(ImageFormat::CUBIN) || ordinal.arch() == 0 {
            return Err(format!("`{}` loads no CUBIN image", dev.name()).into());
        }
        let cubin = ferrocx_kernels::cuda::compile_source("matmul.cu", MATMUL_CU, ordinal.arch())?;
        let module = kernels.load(&cubin, ImageFormat::CUBIN)?;
        Ok(Matmul::Cuda(module.function("fx_matmul_f32")?))
    }

    fn name(&self) -> &'static str {
        match self {
            Matmul::Host => "CPU kernel (a host function on the stream)",
            Matmul::Cuda(_) => "CUDA kernel (NVRTC, launched through the kernel group)",
        }
    }

    /// Enqueues `c = a · b` on `stream` (`a`: m x k, `b`: k x n, `c`: m x n, row-major f32).
    ///
    /// # Safety
    /// The three buffers are memory of `dev` holding what the shapes say, alive and untouched
    /// by other work until the stream has run the matmul.
    #[allow(clippy::too_many_arguments)]
    unsafe fn enqueue(
        &self,
        dev: &Device,
        stream: Stream,
        a: DevicePtr,
        b: DevicePtr,
        c: DevicePtr,
        (m, n, k): (usize, usize, usize),
    ) -> Result<(), Error> {
        match self {
            Matmul::Host => {
                let (a, b, c) = (a.0 as usize, b.0 as usize, c.0 as usize);
                launch_host(dev, stream, move || {
                    // SAFETY: on the host device a device address is this process's; the
                    // buffers hold the shapes' elements and live until the stream ran this
                    // (the caller's contract).
                    let (a, b, c) = unsafe {
                        (
                            std::slice::from_raw_parts(a as *const f32, m * k),
                            std::slice::from_raw_parts(b as *const f32, k * n),
                            std::slice::from_raw_parts_mut(c as *mut f32, m * n),
                        )
                    };
                    cpu_matmul(a, b, c, m, n, k);
                })?;
            }
            Matmul::Cuda(f) => {
                let (mut pa, mut pb, mut pc) = (a.0, b.0, c.0);
                let (mut um, mut un, mut uk) = (m as u32, n as u32, k as u32);
                let mut args = [
                    (&mut pa as *mut u64).cast(),
                    (&mut pb as *mut u64).cast(),
                    (&mut pc as *mut u64).cast(),
                    (&mut um as *mut u32).cast(),
                    (&mut un as *mut u32).cast(),
                    (&mut uk as *mut u32).cast(),
                ];
                let grid = [n.div_ceil(16) as u32, m.div_ceil(16) as u32, 1];
                // SAFETY: one pointer per parameter of `fx_matmul_f32`, each to a value of its
                // type (device addresses as u64, sizes as u32); the buffers hold the shapes'
                // elements until the launch completes (the caller's contract); `stream` is a
                // stream of the module's device.
                unsafe { f.launch(grid, [16, 16, 1], 0, &mut args, stream) }?;
            }
        }
        Ok(())
    }
}

/// `c = a · b`, row-major, in i-k-j order (the CPU kernel).
fn cpu_matmul(a: &[f32], b: &[f32], c: &mut [f32], m: usize, n: usize, k: usize) {
    c.fill(0.0);
    for i in 0..m {
        let row = &mut c[i * n..(i + 1) * n];
        for kk in 0..k {
            let x = a[i * k + kk];
            for (out, &w) in row.iter_mut().zip(&b[kk * n..(kk + 1) * n]) {
                *out += x * w;
            }
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

fn main() -> Result<(), Error> {
    if let Ok(filter) = std::env::var("FERROCX_LOG") {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .with_span_events(tracing_subscriber::fmt::format::FmtSpan::NEW)
            .with_writer(std::io::stderr)
            .init();
    }
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let Some(a) = args.iter().find(|a| {
        a.starts_with("--") && !["--m", "--k", "--n", "--streams", "--iters"].contains(&a.as_str())
    }) {
        return Err(
            format!("unknown option {a}: expected --m, --k, --n, --streams, --iters").into(),
        );
    }
    let (m, k, n) = (
        arg(&args, "--m", 64)?,
        arg(&args, "--k", 128)?,
        arg(&args, "--n", 96)?,
    );
    let streams = arg(&args, "--streams", ferrocx::comm::DEFAULT_P2P_STREAMS)?;
    let iters = arg(&args, "--iters", 3)?;

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
    let x_full = DeviceBuffer::new(dev, world * m * k * 4, MemKind::DEVICE)?;
    let mut y = DeviceBuffer::new(dev, world * m * n * 4, MemKind::DEVICE)?;
    let at = |buf: &DeviceBuffer, elems: usize| DevicePtr(buf.ptr().0 + (elems * 4) as u64);

    let plain = |y: &DeviceBuffer| -> Result<(), Error> {
        // SAFETY: the buffers hold what the shapes say and live past the synchronize.
        unsafe {
            comm.all_gather(x.ptr(), x_full.ptr(), m * k, DataType::F32)?;
            matmul.enqueue(
                dev,
                comm.stream(),
                x_full.ptr(),
                wb.ptr(),
                y.ptr(),
                (world * m, n, k),
            )?;
        }
        comm.synchronize()?;
        Ok(())
    };
    let mut route = None;
    let mut pipelined = |y: &DeviceBuffer| -> Result<(), Error> {
        let hook = |s: &ferrocx::comm::Slice| {
            // SAFETY: slice `s.rank` of `x_full` (m x k) is in place when the stream reaches
            // this point (after its event); the rows of `y` it writes are its own.
            unsafe {
                matmul.enqueue(
                    dev,
                    s.stream,
                    s.ptr,
                    wb.ptr(),
                    at(y, s.rank * m * n),
                    (m, n, k),
                )
            }
            .map_err(|e| ferrocx::comm::CommError::PointToPoint(e.to_string()))
        };
        // SAFETY: the buffers hold what the shapes say and live past the synchronize.
        let h = unsafe {
            comm.call().all_gather_p2p_each(
                x.ptr(),
                x_full.ptr(),
                m * k,
                DataType::F32,
                streams,
                hook,
            )
        }?;
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
    if rank == 0 {
        let route = route.map_or("-".to_string(), |r| r.to_string());
        println!(
            "allgather_matmul on {world} ranks, {m}x{k} rows per rank times {k}x{n}, {streams} stream(s), matmul: {}",
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
