//! The CUDA backend: `cuda/*.cu` compiled by NVRTC for the device's architecture at first use
//! (and cached on disk) into a CUBIN, loaded and launched on the communicator's stream through
//! the device adaptor's kernel group (`ferrocx_device_kernel_v1`: `module_load`,
//! `module_get_function`, `launch_kernel`).
//!
//! The backend runs on a device whose adaptor exports the kernel group and loads CUBIN images
//! (see `engine::kind_of`); the kernels address memory by the adaptor's `DevicePtr` values,
//! which for the CUDA adaptor are `CUdeviceptr`s. This crate opens no driver: only NVRTC, to
//! compile. Everything else — memory, the scratch window, the failure record — goes through
//! the device table too.

mod cache;
mod nvrtc;

use std::collections::HashMap;
use std::ffi::c_void;

use ferrocx::abi::{DevicePtr, ImageFormat, MemKind};
use ferrocx::adaptor::{Device, Function};
use ferrocx::window::collectives::{AllGatherCall, AllReduceCall, CollectiveError, WindowAlgo};

use crate::element::{Elem, Op};
use crate::layout::{Layout, Signal, LL_MAX_BYTES, LL_SLOT, MAX_BLOCKS, SIGNAL_STRIDE};

pub use cache::ENV_KERNEL_CACHE;
pub use nvrtc::ENV_NVRTC_LIBRARY;

/// The most ranks a launch addresses (its peer table is part of the arguments).
pub const MAX_RANKS: usize = 16;
/// Threads per block (`FX_THREADS` in the sources).
const THREADS: u32 = 512;
/// Bytes each thread of a launch moves (one 16-byte vector per thread and block) before a
/// launch gets another block, up to [`MAX_BLOCKS`].
const BYTES_PER_THREAD: usize = 16;

/// The sources, embedded.
pub const COMMON_CUH: &str = include_str!("../../cuda/common.cuh");
/// The kernels, embedded.
pub const ALL_REDUCE_CU: &str = include_str!("../../cuda/all_reduce.cu");
/// The name `all_reduce.cu` includes `common.cuh` by.
const COMMON_NAME: &str = "ferrocx_common.cuh";

/// The launch arguments (`FxArgs` in the sources, which checks the size at compile time).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Args {
    peers: [u64; MAX_RANKS],
    send: u64,
    recv: u64,
    count: u64,
    counter: u64,
    parity_bytes: u64,
    chunk: u64,
    signals: u64,
    timeout_ns: u64,
    status: u64,
    ll: u64,
    ll_max: u64,
    ll128: u64,
    ll128_slot: u64,
    ll128_max: u64,
    rank: u32,
    world: u32,
    signal_stride: u32,
    max_blocks: u32,
    vec: u32,
    algo: u32,
}

/// Environment variable: the largest one-shot message (bytes) sent as LL lines, at most (and by
/// default) [`LL_MAX_BYTES`]; larger one-shot messages are pushed into the chunk slots. A tuning
/// knob for measuring the crossover on a new machine.
pub const LL_MAX_ENV: &str = "FERROCX_WINDOW_LL_MAX";

/// The LL limit of this process: [`LL_MAX_ENV`] if set (clamped to [`LL_MAX_BYTES`]), else
/// [`LL_MAX_BYTES`].
fn ll_max() -> usize {
    knob(LL_MAX_ENV, "a byte count", LL_MAX_BYTES, |v| {
        parse_bytes(v).map(|b| b.min(LL_MAX_BYTES))
    })
}

/// Environment variable: the largest one-shot message (bytes) sent as LL128 lines (128-byte
/// lines of 120 data bytes and the round, see [`crate::layout::LL128_LINE`]), at most
/// [`crate::layout::LL128_MAX_BYTES`]; 0, the default, leaves LL128 off. Messages up to
/// [`LL_MAX_ENV`] stay LL lines. LL128 relies on a warp's 128-byte store reaching the peer
/// whole, which NVLink gives and PCIe does not promise: set it only where every pair of GPUs
/// is joined by NVLink.
pub const LL128_MAX_ENV: &str = "FERROCX_WINDOW_LL128_MAX";

/// The LL128 limit of this process (see [`LL128_MAX_ENV`]), at most what the layout's slots
/// hold.
fn ll128_max(layout: &Layout) -> usize {
    knob(LL128_MAX_ENV, "a byte count", 0, |v| {
        parse_bytes(v).map(|b| b.min(layout.ll128_max_bytes()))
    })
}

/// Threads per block of the LL128 one-shot launches: 8 warps, 32 lines at a time.
const LL128_THREADS: u32 = 256;

/// Environment variable: threads per block of the LL one-shot launches, 64, 128, 256 (the
/// default) or 512: fewer spread a message's lines over more SMs. A tuning knob, as
/// [`LL_MAX_ENV`].
pub const LL_THREADS_ENV: &str = "FERROCX_WINDOW_LL_THREADS";

/// Threads per block of the LL one-shot launches by default. Measured on 2 H200 (one-shot,
/// 8 KiB to 256 KiB, eager and graph): 256 was 1-3 % faster than 512 at every size (up to
/// 256 KiB a launch then spreads over up to 128 SMs, not 64); 128 and 64 lose from 128 KiB (a
/// thread then carries two or more lines).
const LL_THREADS: u32 = 256;

/// The LL block size of this process (see [`LL_THREADS_ENV`]).
fn ll_threads() -> u32 {
    knob(LL_THREADS_ENV, "64, 128, 256 or 512", LL_THREADS, |v| {
        one_of(v, &[64, 128, 256, 512])
    })
}

/// The tuning variable `var` as `parse` reads it (trimmed), else `default`: when it is unset,
/// or, with a warning naming what was `expected`, when `parse` refuses it.
fn knob<T>(var: &str, expected: &str, default: T, parse: impl Fn(&str) -> Option<T>) -> T {
    let Ok(v) = std::env::var(var) else {
        return default;
    };
    parse(v.trim()).unwrap_or_else(|| {
        tracing::warn!("{var}={v:?}: expected {expected}; using the default");
        default
    })
}

/// `v` as a number among `allowed`.
fn one_of(v: &str, allowed: &[u32]) -> Option<u32> {
    v.parse().ok().filter(|n| allowed.contains(n))
}

/// Environment variable: how the ring moves its partials, `push` (into the right neighbour's
/// slot) or `pull` (the right neighbour reads them). A tuning knob, as [`LL_MAX_ENV`].
pub const RING_ENV: &str = "FERROCX_WINDOW_RING";

/// The ring's way of this process (see [`RING_ENV`]): whether it pushes.
fn ring_push() -> bool {
    knob(RING_ENV, "push or pull", true, |v| match v {
        "push" => Some(true),
        "pull" => Some(false),
        _ => None,
    })
}

/// Environment variable: 16-byte packs each thread of a bulk move keeps in flight (1, 2, 4 or
/// 8; `FX_UNROLL` in the sources). A tuning knob, as [`LL_MAX_ENV`].
pub const UNROLL_ENV: &str = "FERROCX_WINDOW_UNROLL";

/// Packs in flight per thread by default.
const UNROLL: u32 = 4;

/// The packs in flight of this process (see [`UNROLL_ENV`]).
fn unroll() -> u32 {
    knob(UNROLL_ENV, "1, 2, 4 or 8", UNROLL, |v| {
        one_of(v, &[1, 2, 4, 8])
    })
}

/// `"4096"`, `"64K"` or `"1M"` as bytes.
fn parse_bytes(v: &str) -> Option<usize> {
    let v = v.trim();
    let (digits, shift) = match v.as_bytes().last()? {
        b'K' | b'k' => (&v[..v.len() - 1], 10),
        b'M' | b'm' => (&v[..v.len() - 1], 20),
        _ => (v, 0),
    };
    digits.parse::<usize>().ok()?.checked_mul(1 << shift)
}

/// The source NVRTC compiles: the constants the host defines, then the kernels.
pub fn source() -> String {
    format!(
        "#define FX_MAX_RANKS {MAX_RANKS}\n#define FX_ARGS_SIZE {}\n#define FX_LL_SLOT {LL_SLOT}\n\
         #define FX_UNROLL {}\n{ALL_REDUCE_CU}",
        std::mem::size_of::<Args>(),
        unroll()
    )
}

/// The NVRTC options for `sm_<arch>`.
pub fn options(arch: u32) -> Vec<String> {
    vec![
        format!("--gpu-architecture=sm_{arch}"),
        "--std=c++17".into(),
        "-lineinfo".into(),
    ]
}

/// Every kernel's name, with what it runs.
pub fn kernel_names() -> Vec<(String, WindowAlgo, Elem, Op)> {
    let mut v = Vec::new();
    for algo in WindowAlgo::ALL {
        for elem in Elem::ALL {
            for op in Op::ALL {
                let a = algo.name().replace('-', "_");
                v.push((
                    format!("fx_{a}_{}_{}", elem.name(), op.name()),
                    algo,
                    elem,
                    op,
                ));
            }
        }
    }
    v
}

/// The all-gather kernel's name (one kernel for every element type).
pub const ALL_GATHER_KERNEL: &str = "fx_all_gather";

/// `args.algo` of the all-gather kernel, as its failure record carries it.
const ALGO_ALL_GATHER: u32 = 4;

/// `true` when NVRTC can be opened here (the device adaptor's kernel group does the rest).
pub fn available() -> bool {
    nvrtc::load().is_ok()
}

/// NVRTC's path and `(major, minor)` version, or why it cannot be opened (compiling needs no
/// GPU and no driver).
pub fn nvrtc_version() -> Result<(String, (i32, i32)), String> {
    nvrtc::load().map(|n| (n.path.clone(), n.version()))
}

fn unavailable(e: String) -> CollectiveError {
    CollectiveError::Unavailable(e)
}

/// The cache directory the environment names (see the `cache` module): `FERROCX_KERNEL_CACHE`,
/// else `$XDG_CACHE_HOME/ferrocx/kernels`, else `$HOME/.cache/ferrocx/kernels`.
pub fn cache_dir() -> Option<std::path::PathBuf> {
    cache::dir(|k| std::env::var(k).ok())
}

/// Compiles the kernels for `sm_<arch>`, or reads them from the cache directory `dir` (none:
/// always compile): the CUBIN, and whether it came from the cache. A compile error carries
/// NVRTC's log.
pub fn compile(arch: u32, dir: Option<&std::path::Path>) -> Result<(Vec<u8>, bool), String> {
    let nv = nvrtc::load()?;
    let src = source();
    let opts = options(arch);
    let (major, minor) = nv.version();
    let version = format!("nvrtc {major}.{minor}");
    let key = cache::hash(&[
        src.as_bytes(),
        COMMON_CUH.as_bytes(),
        opts.join(" ").as_bytes(),
        version.as_bytes(),
    ]);
    let name = cache::file_name(key, arch);
    if let Some(bytes) = dir.and_then(|d| cache::read(d, &name)) {
        return Ok((bytes, true));
    }
    let start = std::time::Instant::now();
    let cubin = nv
        .compile("all_reduce.cu", &src, &[(COMMON_NAME, COMMON_CUH)], &opts)
        .map_err(|e| {
            format!(
                "compiling the window kernels for sm_{arch} with {} ({version}): {e}",
                nv.path
            )
        })?;
    tracing::info!(
        arch,
        ms = start.elapsed().as_millis() as u64,
        "compiled the window kernels with {}",
        nv.path
    );
    if let Some(d) = dir {
        if let Err(e) = cache::write(d, &name, &cubin) {
            tracing::warn!("could not cache the window kernels in {}: {e}", d.display());
        }
    }
    Ok((cubin, false))
}

/// Compiles `source`, one CUDA C++ translation unit named `name` that includes nothing, for
/// `sm_<arch>` with NVRTC (the options of the window kernels): a CUBIN that a device's kernel
/// group loads. For a program's own kernels (the `allgather_matmul` example's matmul); not
/// cached. A compile error carries NVRTC's log.
pub fn compile_source(name: &str, source: &str, arch: u32) -> Result<Vec<u8>, String> {
    let nv = nvrtc::load()?;
    nv.compile(name, source, &[], &options(arch))
        .map_err(|e| format!("compiling {name} for sm_{arch} with {}: {e}", nv.path))
}

/// The kernels, loaded through the device adaptor's kernel group onto the device the caller
/// works on (the module stays loaded while a function of it is held).
pub(crate) struct Module {
    functions: HashMap<(WindowAlgo, Elem, Op), Function>,
    /// `fx_all_gather` (every element type: it moves bytes).
    all_gather: Function,
}

impl Module {
    /// Compiles (or reads from the cache) and loads the kernels for `sm_<arch>` onto the
    /// device `device` works on for this thread.
    pub(crate) fn load(device: &Device, arch: u32) -> Result<Module, CollectiveError> {
        let kernels = device.kernel().ok_or_else(|| {
            unavailable(format!(
                "the device adaptor `{}` has no kernel group",
                device.name()
            ))
        })?;
        device
            .get_device()
            .and_then(|d| device.set_device(d))
            .map_err(|e| unavailable(e.to_string()))?;
        let (cubin, cached) = compile(arch, cache_dir().as_deref()).map_err(unavailable)?;
        let module = kernels.load(&cubin, ImageFormat::CUBIN).map_err(|e| {
            unavailable(format!(
                "{e} (the kernels for sm_{arch}, {})",
                if cached {
                    "from the cache"
                } else {
                    "just compiled"
                }
            ))
        })?;
        let mut functions = HashMap::new();
        for (name, algo, elem, op) in kernel_names() {
            let f = module
                .function(&name)
                .map_err(|e| unavailable(e.to_string()))?;
            functions.insert((algo, elem, op), f);
        }
        let all_gather = module
            .function(ALL_GATHER_KERNEL)
            .map_err(|e| unavailable(e.to_string()))?;
        Ok(Module {
            functions,
            all_gather,
        })
    }
}

/// The CUDA backend of one communicator.
pub(crate) struct Cuda {
    module: Module,
    device: Device,
    base: Args,
    layout: Layout,
    /// A u64 in pinned host memory where a kernel records the first failure.
    status: DevicePtr,
    /// Device memory, one u64 per block index (`MAX_BLOCKS`): the round the next launch runs,
    /// which the launches advance themselves (so a captured graph runs new rounds when
    /// replayed).
    counter: DevicePtr,
    /// Threads per block of the LL one-shot launches ([`LL_THREADS_ENV`]).
    ll_threads: u32,
    /// Whether the ring pushes its partials ([`RING_ENV`]).
    ring_push: bool,
}

// SAFETY: `Args` holds plain addresses; the module is Send + Sync; the status word is read
// with volatile loads only.
unsafe impl Send for Cuda {}
// SAFETY: as above.
unsafe impl Sync for Cuda {}

impl Cuda {
    /// The backend over scratch windows at `peers` (this GPU's addresses of every rank's).
    pub(crate) fn new(
        device: &Device,
        module: Module,
        layout: Layout,
        rank: usize,
        peers: Vec<u64>,
        timeout: std::time::Duration,
    ) -> Result<Cuda, CollectiveError> {
        if peers.len() > MAX_RANKS {
            return Err(unavailable(format!(
                "the CUDA window kernels address at most {MAX_RANKS} ranks, not {}",
                peers.len()
            )));
        }
        let adaptor = |e: ferrocx::adaptor::AdaptorError| unavailable(e.to_string());
        let status = device.mem_alloc(64, MemKind::PINNED).map_err(adaptor)?;
        let counter = match device.mem_alloc(8 * MAX_BLOCKS, MemKind::DEVICE) {
            Ok(c) => c,
            Err(e) => {
                // SAFETY: `status` is the pinned allocation just made, unused.
                let _ = unsafe { device.mem_free(status, MemKind::PINNED) };
                return Err(adaptor(e));
            }
        };
        // Rounds start at 1 (signal slots start at 0), in every block's word.
        let first = [1u64; MAX_BLOCKS];
        // SAFETY: `status` is a fresh pinned allocation of 64 bytes.
        let ready = unsafe { device.mem_set(status, 0, 64) }.and_then(|()| {
            // SAFETY: `counter` is a fresh device allocation of `8 * MAX_BLOCKS` bytes; `first`
            // holds as many.
            unsafe { device.mem_copy(counter, DevicePtr(first.as_ptr() as u64), 8 * MAX_BLOCKS) }
        });
        if let Err(e) = ready {
            // SAFETY: the allocations just made, unused by any stream.
            let _ = unsafe { device.mem_free(status, MemKind::PINNED) };
            // SAFETY: as above.
            let _ = unsafe { device.mem_free(counter, MemKind::DEVICE) };
            return Err(adaptor(e));
        }
        let mut base = Args {
            counter: counter.0,
            parity_bytes: layout.parity_bytes() as u64,
            chunk: layout.chunk() as u64,
            signals: layout.signals_offset() as u64,
            timeout_ns: u64::try_from(timeout.as_nanos()).unwrap_or(u64::MAX),
            status: status.0,
            ll: layout.ll_offset() as u64,
            ll_max: ll_max() as u64,
            ll128: layout.ll128_offset() as u64,
            ll128_slot: layout.ll128_slot() as u64,
            ll128_max: ll128_max(&layout) as u64,
            rank: rank as u32,
            world: peers.len() as u32,
            signal_stride: SIGNAL_STRIDE as u32,
            max_blocks: MAX_BLOCKS as u32,
            ..Args::default()
        };
        base.peers[..peers.len()].copy_from_slice(&peers);
        Ok(Cuda {
            module,
            device: device.clone(),
            base,
            layout,
            status,
            counter,
            ll_threads: ll_threads(),
            ring_push: ring_push(),
        })
    }

    /// Launches `algo` on the call's stream (a ring: one launch per round). The launches take
    /// their rounds from the device-side counter.
    pub(crate) fn launch(
        &self,
        call: &AllReduceCall,
        algo: WindowAlgo,
        elem: Elem,
        op: Op,
    ) -> Result<(), CollectiveError> {
        let fail = |message: String| CollectiveError::Failed { algo, message };
        let f = self
            .module
            .functions
            .get(&(algo, elem, op))
            .ok_or_else(|| fail(format!("no kernel for {elem:?} {op:?}")))?;
        let es = elem.size();
        let world = self.layout.world();
        let mut args = self.base;
        args.vec = u32::from((call.send.0 | call.recv.0) % 16 == 0);
        args.algo = match algo {
            WindowAlgo::OneShot => 0,
            WindowAlgo::TwoShot => 1,
            WindowAlgo::Ring if self.ring_push => 3,
            WindowAlgo::Ring => 2,
        };
        let rounds: Vec<(usize, usize)> = match algo {
            WindowAlgo::Ring => {
                let round = self.layout.parity_bytes() / es;
                (0..call.count)
                    .step_by(round)
                    .map(|done| (done, round.min(call.count - done)))
                    .collect()
            }
            _ => vec![(0, call.count)],
        };
        for (done, n) in rounds {
            args.send = call.send.0 + (done * es) as u64;
            args.recv = call.recv.0 + (done * es) as u64;
            args.count = n as u64;
            let work = match algo {
                WindowAlgo::OneShot => n * es,
                WindowAlgo::TwoShot | WindowAlgo::Ring => (n * es).div_ceil(world),
            };
            // LL lines carry 8 bytes each, one line per thread (a thread with two lines would
            // wait out two round trips), in blocks of `ll_threads`.
            // LL128 lines carry 120 bytes, one line per 8 threads.
            let bytes = (n * es) as u64;
            let (threads, per_thread) = match algo {
                WindowAlgo::OneShot if bytes <= self.base.ll_max => (self.ll_threads, 8),
                WindowAlgo::OneShot if bytes <= self.base.ll128_max => (LL128_THREADS, 15),
                _ => (THREADS, BYTES_PER_THREAD),
            };
            let blocks = work
                .div_ceil(threads as usize * per_thread)
                .clamp(1, MAX_BLOCKS) as u32;
            let mut params = [(&mut args as *mut Args).cast::<c_void>()];
            // SAFETY: a function of the loaded module whose single parameter is `FxArgs` (the
            // same layout as `Args`, checked by the compile); `params` points at it for the
            // call (the adaptor copies it); the addresses in it (peers' windows, the buffers,
            // the counter and status words) stay valid until the stream has run the launch;
            // the stream is the communicator's, of the module's device.
            unsafe { f.launch([blocks, 1, 1], [threads, 1, 1], 0, &mut params, call.stream) }
                .map_err(|e| fail(e.to_string()))?;
        }
        Ok(())
    }

    /// Launches the all-gather of `call` (`call.count` elements of each rank, at most a chunk
    /// slot's bytes) on its stream: one launch, one round.
    pub(crate) fn launch_all_gather(&self, call: &AllGatherCall) -> Result<(), CollectiveError> {
        let bytes = call.count * call.dtype.size().unwrap_or(0);
        let mut args = self.base;
        args.vec = u32::from((call.send.0 | call.recv.0 | bytes as u64) % 16 == 0);
        args.algo = ALGO_ALL_GATHER;
        args.send = call.send.0;
        args.recv = call.recv.0;
        args.count = bytes as u64;
        let blocks = bytes
            .div_ceil(THREADS as usize * BYTES_PER_THREAD)
            .clamp(1, MAX_BLOCKS) as u32;
        let mut params = [(&mut args as *mut Args).cast::<c_void>()];
        // SAFETY: the all-gather kernel, whose single parameter is `FxArgs` (as `launch`);
        // the buffers (the caller's contract), the peers' windows, the counter and the status
        // word stay valid until the stream has run it; the stream is of the module's device.
        unsafe {
            self.module.all_gather.launch(
                [blocks, 1, 1],
                [THREADS, 1, 1],
                0,
                &mut params,
                call.stream,
            )
        }
        .map_err(|e| CollectiveError::Failed {
            algo: WindowAlgo::OneShot,
            message: format!("all-gather: {e}"),
        })
    }

    /// The first failure a kernel recorded, if one.
    pub(crate) fn check(&self) -> Result<(), CollectiveError> {
        // SAFETY: 64 bytes of pinned host memory this backend allocated (host-addressable at
        // the same address), 8-byte aligned; kernels write the word whole.
        let word = unsafe { std::ptr::read_volatile(self.status.0 as *const u64) };
        if word & 1 == 0 {
            return Ok(());
        }
        Err(decode_failure(
            word,
            std::time::Duration::from_nanos(self.base.timeout_ns),
        ))
    }
}

/// The error a kernel's failure record `word` describes.
pub(crate) fn decode_failure(word: u64, waited: std::time::Duration) -> CollectiveError {
    let gather = (word >> 4) & 0xf == u64::from(ALGO_ALL_GATHER);
    // The all-gather is one round of publishing and reading, as the one-shot all-reduce.
    let algo = match (word >> 4) & 0xf {
        1 => WindowAlgo::TwoShot,
        2 | 3 => WindowAlgo::Ring,
        _ => WindowAlgo::OneShot,
    };
    let what = match (word >> 8) & 0xff {
        k if k == Signal::Arrive as u64 && gather => "its all-gather input".to_string(),
        k if k == Signal::Arrive as u64 => "its input".to_string(),
        k if k == Signal::Reduced as u64 => "its reduced share".to_string(),
        _ => "its ring step".to_string(),
    };
    CollectiveError::PeerTimeout {
        algo,
        peer: ((word >> 16) & 0xffff) as usize,
        what,
        epoch: word >> 32,
        waited,
    }
}

impl Drop for Cuda {
    fn drop(&mut self) {
        // SAFETY: allocations `new` made, freed once; the communicator synchronized its stream
        // before its window backend drops, so no kernel uses them.
        let _ = unsafe { self.device.mem_free(self.status, MemKind::PINNED) };
        // SAFETY: as above.
        let _ = unsafe { self.device.mem_free(self.counter, MemKind::DEVICE) };
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn ll_limits_parse_as_bytes() {
        assert_eq!(super::parse_bytes("4096"), Some(4096));
        assert_eq!(super::parse_bytes(" 64K"), Some(64 << 10));
        assert_eq!(super::parse_bytes("1M"), Some(1 << 20));
        assert_eq!(super::parse_bytes("1.5M"), None);
        assert_eq!(super::parse_bytes(""), None);
    }

    /// Each test process sets these variables once, before any reader, and only here.
    #[test]
    fn tuning_variables_take_allowed_values_and_fall_back_to_the_default() {
        assert_eq!(super::one_of("4", &[1, 2, 4, 8]), Some(4));
        assert_eq!(super::one_of("3", &[1, 2, 4, 8]), None);
        assert_eq!(super::one_of("x", &[1, 2, 4, 8]), None);
        let var = "FERROCX_TEST_KNOB_UNSET_VARIABLE";
        assert_eq!(super::knob(var, "a number", 7u32, |v| v.parse().ok()), 7);
        std::env::set_var("FERROCX_TEST_KNOB_SET", " 16 ");
        std::env::set_var("FERROCX_TEST_KNOB_BAD", "sixteen");
        let parse = |v: &str| v.parse::<u32>().ok();
        assert_eq!(
            super::knob("FERROCX_TEST_KNOB_SET", "a number", 7, parse),
            16
        );
        assert_eq!(
            super::knob("FERROCX_TEST_KNOB_BAD", "a number", 7, parse),
            7
        );
    }

    use super::*;

    #[test]
    fn the_arguments_have_the_layout_the_sources_expect() {
        assert_eq!(std::mem::size_of::<Args>(), 264);
        assert_eq!(std::mem::offset_of!(Args, send), 8 * MAX_RANKS);
        assert_eq!(std::mem::offset_of!(Args, rank), 8 * MAX_RANKS + 14 * 8);
        let src = source();
        assert!(src.starts_with("#define FX_MAX_RANKS 16\n#define FX_ARGS_SIZE 264\n"));
        assert!(src.contains("#include \"ferrocx_common.cuh\""));
        assert!(COMMON_CUH.contains("static_assert(sizeof(FxArgs) == FX_ARGS_SIZE"));
    }

    #[test]
    fn every_kernel_is_instantiated_in_the_source() {
        let names = kernel_names();
        assert_eq!(names.len(), 36);
        // The sources instantiate them through FX_TYPES(algo) x FX_OPS(type) macros.
        for algo in ["one_shot", "two_shot", "ring"] {
            assert!(
                ALL_REDUCE_CU.contains(&format!("FX_TYPES({algo})")),
                "{algo}"
            );
        }
        for (ty, e) in [
            ("f32", "F32"),
            ("bf16", "BF16"),
            ("f16", "F16"),
            ("i32", "I32"),
        ] {
            assert!(
                ALL_REDUCE_CU.contains(&format!("FX_OPS(ALGO, {ty}, {e})")),
                "{ty}"
            );
        }
        assert!(names.iter().any(|(n, ..)| n == "fx_two_shot_bf16_max"));
    }

    #[test]
    fn failure_records_decode() {
        let word = 1 | (1 << 4) | ((Signal::Reduced as u64) << 8) | (3 << 16) | (77 << 32);
        match decode_failure(word, std::time::Duration::from_secs(1)) {
            CollectiveError::PeerTimeout {
                algo,
                peer,
                epoch,
                what,
                ..
            } => {
                assert_eq!((algo, peer, epoch), (WindowAlgo::TwoShot, 3, 77));
                assert_eq!(what, "its reduced share");
            }
            other => panic!("{other}"),
        }
    }
}
