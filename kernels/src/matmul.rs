//! A plain f32 matmul on any device ferrocx runs on, in stream order: the consumer of the
//! pipelined all-gather + matmul (`examples/allgather_matmul.rs`, `ferrocx bench --overlap`).
//!
//! On a device whose memory is the process's with host functions (the host device), a CPU
//! kernel enqueued as a host function on the stream; on a device whose kernel group loads
//! CUBIN images (CUDA), `cuda/matmul.cu` compiled by NVRTC for the device's architecture and
//! launched through the group (`ferrocx_device_kernel_v1`), as the window kernels are.

use ferrocx::abi::{Capabilities, DevicePtr, ImageFormat, Stream};
use ferrocx::adaptor::{Device, Function};
use ferrocx::comm::p2p::launch_host;

/// The CUDA source.
pub const MATMUL_CU: &str = include_str!("../cuda/matmul.cu");

/// The matmul of one device: `c[m x n] = a[m x k] · b[k x n]`, row-major f32.
pub enum Matmul {
    /// The CPU kernel, as a host function on the stream.
    Host,
    /// The CUDA kernel.
    Cuda(Function),
}

impl Matmul {
    /// The matmul for the device `dev` works on (compiling the CUDA kernel there), or why none
    /// runs on it.
    pub fn new(dev: &Device) -> Result<Matmul, String> {
        let index = dev.get_device().map_err(|e| e.to_string())?;
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
                "the device adaptor `{}` has neither host functions on host memory nor a \
                 kernel group",
                dev.name()
            )
        })?;
        if !ordinal.loads(ImageFormat::CUBIN) || ordinal.arch() == 0 {
            return Err(format!("`{}` loads no CUBIN image", dev.name()));
        }
        let cubin = crate::cuda::compile_source("matmul.cu", MATMUL_CU, ordinal.arch())?;
        let module = kernels
            .load(&cubin, ImageFormat::CUBIN)
            .map_err(|e| e.to_string())?;
        let f = module
            .function("fx_matmul_f32")
            .map_err(|e| e.to_string())?;
        Ok(Matmul::Cuda(f))
    }

    /// What runs it, for reports.
    pub fn name(&self) -> &'static str {
        match self {
            Matmul::Host => "CPU kernel (a host function on the stream)",
            Matmul::Cuda(_) => "CUDA kernel (NVRTC, launched through the kernel group)",
        }
    }

    /// Enqueues `c = a · b` on `stream` with `(m, n, k)`: `a` is m x k, `b` k x n, `c` m x n.
    ///
    /// # Safety
    /// The three buffers are memory of `dev` (the device this matmul was made for) holding
    /// what the shapes say, alive and untouched by other work until the stream has run the
    /// matmul; `c` overlaps neither input; `stream` is a stream of `dev`.
    pub unsafe fn enqueue(
        &self,
        dev: &Device,
        stream: Stream,
        [a, b, c]: [DevicePtr; 3],
        (m, n, k): (usize, usize, usize),
    ) -> Result<(), String> {
        match self {
            Matmul::Host => {
                let (a, b, c) = (a.0 as usize, b.0 as usize, c.0 as usize);
                launch_host(dev, stream, move || {
                    // SAFETY: on the host device a device address is this process's; the
                    // buffers hold the shapes' elements, `c` apart from the inputs, until the
                    // stream ran this (the caller's contract).
                    let (a, b, c) = unsafe {
                        (
                            std::slice::from_raw_parts(a as *const f32, m * k),
                            std::slice::from_raw_parts(b as *const f32, k * n),
                            std::slice::from_raw_parts_mut(c as *mut f32, m * n),
                        )
                    };
                    cpu_matmul(a, b, c, (m, n, k));
                })
                .map_err(|e| e.to_string())
            }
            Matmul::Cuda(f) => {
                let to_u32 = |v: usize| {
                    u32::try_from(v).map_err(|_| format!("matmul: dimension {v} exceeds u32"))
                };
                let (un, uk) = (to_u32(n)?, to_u32(k)?);
                // CUDA's grid is at most 65535 blocks high: rows go in launches of at most
                // that many 16-row blocks, each on its rows of `a` and `c`.
                const ROWS: usize = 65535 * 16;
                let mut r = Ok(());
                for first in (0..m).step_by(ROWS) {
                    let rows = ROWS.min(m - first);
                    let (mut pa, mut pb, mut pc) = (
                        a.0 + (first * k * 4) as u64,
                        b.0,
                        c.0 + (first * n * 4) as u64,
                    );
                    let (mut um, mut un, mut uk) = (to_u32(rows)?, un, uk);
                    let mut args = [
                        (&mut pa as *mut u64).cast(),
                        (&mut pb as *mut u64).cast(),
                        (&mut pc as *mut u64).cast(),
                        (&mut um as *mut u32).cast(),
                        (&mut un as *mut u32).cast(),
                        (&mut uk as *mut u32).cast(),
                    ];
                    let grid = [un.div_ceil(16), um.div_ceil(16), 1];
                    // SAFETY: one pointer per parameter of `fx_matmul_f32`, each to a value of
                    // its type (device addresses as u64, sizes as u32), live across the call
                    // (the adaptor copies them); the buffers hold the shapes' elements until the
                    // launch completes (the caller's contract), and `rows` rows from `first` lie
                    // inside them; `stream` is a stream of the module's device.
                    r = unsafe { f.launch(grid, [16, 16, 1], 0, &mut args, stream) }
                        .map_err(|e| e.to_string());
                    if r.is_err() {
                        break;
                    }
                }
                r
            }
        }
    }
}

/// `c = a · b` on the CPU, row-major, in i-k-j order.
pub fn cpu_matmul(a: &[f32], b: &[f32], c: &mut [f32], (m, n, k): (usize, usize, usize)) {
    c[..m * n].fill(0.0);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cpu_kernel_matches_a_naive_product_on_odd_shapes() {
        for (m, n, k) in [(1, 1, 1), (3, 5, 7), (17, 9, 33)] {
            let a: Vec<f32> = (0..m * k).map(|i| ((i * 7) % 11) as f32 - 5.0).collect();
            let b: Vec<f32> = (0..k * n).map(|i| ((i * 3) % 13) as f32 - 6.0).collect();
            let mut c = vec![f32::NAN; m * n];
            cpu_matmul(&a, &b, &mut c, (m, n, k));
            for i in 0..m {
                for j in 0..n {
                    let want: f32 = (0..k).map(|x| a[i * k + x] * b[x * n + j]).sum();
                    assert_eq!(c[i * n + j], want, "({m}, {n}, {k}) at ({i}, {j})");
                }
            }
        }
    }

    #[test]
    fn the_source_defines_the_kernel_launched() {
        assert!(MATMUL_CU.contains("extern \"C\" __global__ void fx_matmul_f32("));
    }

    /// Where NVRTC can be opened (no GPU needed), the kernel compiles to a CUBIN for the
    /// architectures the GPU runs use (as the window kernels' test, it says so and passes where
    /// NVRTC is absent).
    #[test]
    fn the_cuda_kernel_compiles_with_nvrtc() {
        if let Err(e) = crate::cuda::nvrtc_version() {
            println!("skipped: {e}");
            return;
        }
        for arch in [80, 90] {
            let cubin = crate::cuda::compile_source("matmul.cu", MATMUL_CU, arch)
                .unwrap_or_else(|e| panic!("sm_{arch}: {e}"));
            assert!(cubin.starts_with(b"\x7fELF"), "sm_{arch}: not an ELF image");
        }
    }
}
