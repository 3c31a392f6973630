//! Window collectives on GPUs: the CUDA kernels compiled by NVRTC (and read back from the
//! cache), then one-shot, two-shot and ring all-reduce on 2 processes (and on every GPU when
//! there are more) against the references of `window_ranks::all_reduce`, NCCL's all-reduce of
//! the same inputs checked against the same references, 64 MiB of f32, 1000 calls back to
//! back in one window, and the window all-gather (`all_gather_p2p` forced onto it and by the
//! router's choice) against every rank's input.
//!
//! The compile test needs only NVRTC (no GPU, no driver): `FERROCX_NVRTC_LIBRARY` names it
//! where it is not on the loader's path.
//!
//! The ranks use the CUDA device adaptor and the NCCL CCL as plugins
//! (`libferrocx_adaptor_cuda.so`, `libferrocx_adaptor_nccl.so`), found through
//! `FERROCX_PLUGIN_PATH`, else in `../plugins` beside this executable (the GPU bundle's layout),
//! else in the cargo profile directory above it. Without libcuda, NVRTC, the plugins or two
//! GPUs, each test prints why it skipped and passes. Multicast stays off.

mod window_ranks;

use std::path::{Path, PathBuf};

use ferrocx::comm::Communicator;
use ferrocx::route::Route;
use ferrocx::window::collectives::WindowAlgo;
use window_ranks::all_gather::all_gather_cases;
use window_ranks::all_reduce::{
    back_to_back, check, every_type_op_and_algorithm, input, large, same_digests, size_of, Buffers,
    OPS, TYPES,
};
use window_ranks::{communicator, host_ptr, host_ptr_mut, rank_of, Job};

const CHUNK: usize = ferrocx_kernels::select::CUDA_CHUNK;

/// The directory holding both GPU plugins, if one does.
fn plugin_dir() -> Option<PathBuf> {
    let has = |d: &Path| {
        d.join("libferrocx_adaptor_cuda.so").is_file()
            && d.join("libferrocx_adaptor_nccl.so").is_file()
    };
    if let Ok(path) = std::env::var("FERROCX_PLUGIN_PATH") {
        return std::env::split_paths(&path).find(|d| has(d));
    }
    let exe = std::env::current_exe().ok()?;
    let dir = exe.parent()?;
    [dir.join("../plugins"), dir.join("..")]
        .into_iter()
        .find(|d| has(d))
}

/// The compute capabilities `nvidia-smi` reports (`90` for 9.0), if it runs.
fn gpu_archs() -> Vec<u32> {
    let out = std::process::Command::new("nvidia-smi")
        .args(["--query-gpu=compute_cap", "--format=csv,noheader"])
        .output();
    let Ok(out) = out else { return Vec::new() };
    let mut v: Vec<u32> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.trim().replace('.', "").parse().ok())
        .collect();
    v.sort_unstable();
    v.dedup();
    v
}

#[test]
fn the_kernels_compile_with_nvrtc_and_are_cached() {
    let nvrtc = match ferrocx_kernels::cuda::nvrtc_version() {
        Ok(v) => v,
        Err(e) => {
            println!("skipped: {e}");
            return;
        }
    };
    println!("NVRTC {} ({}.{})", nvrtc.0, nvrtc.1 .0, nvrtc.1 .1);
    let dir = tempfile::tempdir().expect("tempdir");
    let mut archs = vec![80, 90];
    archs.extend(gpu_archs());
    archs.sort_unstable();
    archs.dedup();
    for arch in archs {
        let (cubin, cached) = ferrocx_kernels::cuda::compile(arch, Some(dir.path()))
            .unwrap_or_else(|e| panic!("sm_{arch}: {e}"));
        assert!(
            !cached,
            "sm_{arch}: the first compile cannot come from an empty cache"
        );
        assert!(cubin.starts_with(b"\x7fELF"), "sm_{arch}: not an ELF image");
        let (again, cached) =
            ferrocx_kernels::cuda::compile(arch, Some(dir.path())).expect("from the cache");
        assert!(cached, "sm_{arch}: the second compile reads the cache");
        assert_eq!(again, cubin);
        println!("sm_{arch}: {} bytes of CUBIN, cached", cubin.len());
    }
}

/// A rank: checks that there are GPUs enough, then runs every workload.
fn gpu_rank(test: &str) {
    ferrocx_kernels::link();
    let comm = communicator();
    let gpus = comm.device().device_count().expect("device_count") as usize;
    if gpus < comm.world() {
        println!("SKIP {} GPUs for {} ranks", gpus, comm.world());
        println!("RANK OK");
        return;
    }
    assert_eq!(comm.device().name(), "cuda");
    every_type_op_and_algorithm(&comm, test, CHUNK);
    against_nccl(&comm);
    large(&comm, test, CHUNK);
    back_to_back(&comm, test);
    let reach = ferrocx_kernels::select::cuda(comm.world()).all_gather_below;
    all_gather_cases(&comm, test, CHUNK, reach);
}

/// NCCL's all-reduce of the same inputs as the window's, checked against the same references
/// (for float sums within the type's tolerance, as the ring's): so both agree within it.
fn against_nccl(comm: &Communicator) {
    let world = comm.world();
    let bufs = Buffers::new(comm, (1 << 20) + 16);
    let dev = comm.device();
    let mut case = 5000;
    for dtype in TYPES {
        for op in OPS {
            for count in [1usize, 4099, (1 << 20) / size_of(dtype)] {
                case += 1;
                let bytes = count * size_of(dtype);
                let mine = input(case, comm.rank(), count, dtype);
                // SAFETY: `bufs` holds `(1 << 20) + 16` bytes per buffer, at least `bytes`; `mine`
                // holds `bytes`.
                unsafe { dev.mem_copy(bufs.send, host_ptr(&mine), bytes) }.expect("upload");
                // SAFETY: both buffers hold `(1 << 20) + 16` bytes, more than `bytes`, and
                // outlive the synchronize below.
                unsafe {
                    comm.call()
                        .via(Route::Ccl)
                        .all_reduce(bufs.send, bufs.recv, count, dtype, op)
                }
                .expect("NCCL all_reduce");
                comm.synchronize().expect("synchronize");
                let mut got = vec![0u8; bytes];
                // SAFETY: as the upload, after the synchronize; `got` holds `bytes`.
                unsafe { dev.mem_copy(host_ptr_mut(&mut got), bufs.recv, bytes) }
                    .expect("download");
                check(
                    &got,
                    0..count,
                    case,
                    world,
                    count,
                    dtype,
                    op,
                    WindowAlgo::Ring,
                );
            }
        }
    }
}

/// GPUs of this machine, as `nvidia-smi -L` lists them (0 without it).
fn gpu_count() -> usize {
    std::process::Command::new("nvidia-smi")
        .arg("-L")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).lines().count())
        .unwrap_or(0)
}

fn gpu_job(test: &str, world: usize) {
    let Some(plugins) = plugin_dir() else {
        println!("skipped: no directory holds libferrocx_adaptor_cuda.so and libferrocx_adaptor_nccl.so (set FERROCX_PLUGIN_PATH)");
        return;
    };
    if !ferrocx_kernels::cuda::available() {
        println!("skipped: libcuda.so.1 or NVRTC cannot be opened here");
        return;
    }
    // One rank per GPU: NCCL refuses two ranks on one GPU ("Duplicate GPU detected") before a
    // rank could see the count itself.
    let gpus = gpu_count();
    if gpus < world {
        println!("skipped: {gpus} GPU(s) here, the test needs {world}");
        return;
    }
    let out = Job::new(test, world)
        .adaptors("cuda", "nccl")
        .env("FERROCX_PLUGIN_PATH", &plugins.to_string_lossy())
        .env("NCCL_NVLS_ENABLE", "0")
        .env("FERROCX_MULTICAST", "0")
        .run();
    if out.iter().any(|f| !f.lines("SKIP ").is_empty()) {
        println!("skipped: {}", out[0].lines("SKIP ").join(""));
        return;
    }
    same_digests(&out);
    for f in &out {
        f.lines("CALLS ").iter().for_each(|l| println!("{l}"));
    }
}

#[test]
fn window_all_reduce_on_2_gpus() {
    const T: &str = "window_all_reduce_on_2_gpus";
    match rank_of(T) {
        Some(_) => gpu_rank(T),
        None => gpu_job(T, 2),
    }
}

#[test]
fn window_all_reduce_on_every_gpu() {
    const T: &str = "window_all_reduce_on_every_gpu";
    if rank_of(T).is_some() {
        return gpu_rank(T);
    }
    let n = gpu_count();
    if n <= 2 {
        println!("skipped: {n} GPUs (the 2-GPU test covers them)");
        return;
    }
    gpu_job(T, n.min(ferrocx_kernels::cuda::MAX_RANKS));
}
