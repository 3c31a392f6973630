//! The provider ferrocx's communicators find through `inventory`, and the backend it makes
//! for each communicator: the scratch window, the round (epoch) counter, and the host or CUDA
//! algorithms.

use std::sync::Mutex;

use ferrocx::abi::{Capabilities, ImageFormat};
use ferrocx::adaptor::Device;
use ferrocx::window::collectives::{
    AllGatherCall, AllReduceCall, CollectiveError, Measured, Scratch, WindowAlgo,
    WindowCollectives, WindowCollectivesProvider, WindowContext,
};

use crate::element::{self, Elem, Op};
use crate::host::{
    algo::{Call, Gather},
    Host,
};
use crate::layout::Layout;
use crate::{cuda, select};

ferrocx::register_window_collectives!(WindowCollectivesProvider {
    name: "ferrocx-kernels",
    measured,
    supports: element::supports,
    create,
});

/// Which backend runs on a device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// A device whose memory is this process's (the host device): the Rust algorithms, run by
    /// `launch_host_func`.
    Host,
    /// A device whose adaptor's kernel group loads CUBIN images (the CUDA adaptor, built in or
    /// its plugin): NVRTC-compiled kernels launched on its streams through that group.
    Cuda,
}

/// The backend for `device`, if one runs on it, decided from its capabilities (probed once):
/// host-addressable memory with host functions runs the host algorithms; a kernel group that
/// loads CUBIN images for a device with an architecture number runs the CUDA kernels for it.
pub(crate) fn kind_of(device: &Device) -> Option<(Kind, u32)> {
    let index = device.get_device().ok()?;
    let caps = device.caps();
    let ordinal = caps.ordinal(index)?;
    let host = Capabilities::HOST_ADDRESSABLE | Capabilities::HOST_FUNC;
    let arch = ordinal.arch();
    if ordinal.capabilities().contains(host) {
        Some((Kind::Host, 0))
    } else if caps.has_kernels() && ordinal.loads(ImageFormat::CUBIN) && arch > 0 {
        Some((Kind::Cuda, arch))
    } else {
        None
    }
}

fn measured(device: &Device, world: usize) -> Option<Measured> {
    match kind_of(device)? {
        (Kind::Host, _) => Some(select::host(world)),
        // Without NVRTC or a driver, nothing can run: the CCL takes every call.
        (Kind::Cuda, _) => cuda::available().then(|| select::cuda(world)),
    }
}

fn create(ctx: &WindowContext<'_>) -> Result<Box<dyn WindowCollectives>, CollectiveError> {
    Ok(Box::new(Engine::new(ctx)?))
}

enum Backend {
    Host(Host),
    Cuda(Box<cuda::Cuda>),
}

/// The window collectives of one communicator.
pub(crate) struct Engine {
    backend: Backend,
    layout: Layout,
    /// The epoch of the next round; held while a call is enqueued, so that rounds are in
    /// stream order.
    next_epoch: Mutex<u64>,
    /// A call that could not be enqueued: its rounds are missing on this rank, so every later
    /// call fails with it.
    enqueue_error: Mutex<Option<CollectiveError>>,
    /// Released (locally) when the engine drops, after the communicator synchronized its
    /// stream: no call is left that reads it.
    _scratch: Scratch,
}

impl Engine {
    /// Allocates and registers the scratch window (collective) and readies the backend.
    pub(crate) fn new(ctx: &WindowContext<'_>) -> Result<Engine, CollectiveError> {
        let device = ctx.device.clone();
        let (kind, arch) = kind_of(&device).ok_or_else(|| {
            CollectiveError::Unavailable(format!(
                "no backend for the device adaptor `{}`",
                device.name()
            ))
        })?;
        let (world, rank) = (ctx.world, ctx.rank);
        let chunk = match kind {
            Kind::Host => select::HOST_CHUNK,
            Kind::Cuda => select::CUDA_CHUNK,
        };
        let layout = match kind {
            Kind::Host => Layout::new(world, chunk),
            Kind::Cuda => Layout::new(world, chunk).with_ll128(crate::layout::LL128_MAX_BYTES),
        };
        // Compiled (or read from the cache) before the collective step, so that a compile
        // error is reported here rather than as a peer's timeout.
        let module = match kind {
            Kind::Cuda => Some(cuda::Module::load(&device, arch)?),
            Kind::Host => None,
        };
        let scratch = ctx.scratch(layout.scratch_bytes())?;
        let peers = scratch.peers().ok_or_else(|| {
            CollectiveError::Unavailable(format!(
                "the scratch window is a {} window without peer addresses",
                scratch.kind()
            ))
        })?;
        tracing::debug!(
            bytes = layout.scratch_bytes(),
            chunk = layout.chunk(),
            "window collectives: {} backend over a {} scratch window",
            match kind {
                Kind::Host => "host",
                Kind::Cuda => "cuda",
            },
            scratch.kind()
        );
        let backend = match module {
            None => Backend::Host(Host::new(device, layout, rank, peers, ctx.timeout)),
            Some(module) => Backend::Cuda(Box::new(cuda::Cuda::new(
                &device,
                module,
                layout,
                rank,
                peers,
                ctx.timeout,
            )?)),
        };
        Ok(Engine {
            backend,
            layout,
            next_epoch: Mutex::new(1),
            enqueue_error: Mutex::new(None),
            _scratch: scratch,
        })
    }
}

/// `algo`, or the next larger one where the message does not fit a parity (the same on every
/// rank: it depends on the size only).
fn fit(algo: WindowAlgo, bytes: usize, layout: &Layout) -> WindowAlgo {
    match algo {
        WindowAlgo::OneShot | WindowAlgo::TwoShot if bytes > layout.parity_bytes() => {
            WindowAlgo::Ring
        }
        a => a,
    }
}

impl WindowCollectives for Engine {
    fn backend(&self) -> &str {
        match self.backend {
            Backend::Host(_) => "host",
            Backend::Cuda(_) => "cuda",
        }
    }

    fn all_reduce(&self, call: &AllReduceCall, algo: WindowAlgo) -> Result<(), CollectiveError> {
        self.check()
            .map_err(|e| CollectiveError::Poisoned(Box::new(e)))?;
        let elem = Elem::of(call.dtype)?;
        let op = Op::of(call.op)?;
        if call.count == 0 {
            return Ok(());
        }
        let bytes = call.count.checked_mul(elem.size()).ok_or_else(|| {
            CollectiveError::Unsupported(format!("{} elements overflow a size", call.count))
        })?;
        let algo = fit(algo, bytes, &self.layout);
        let rounds = match algo {
            WindowAlgo::Ring => self.layout.ring_rounds(bytes),
            _ => 1,
        };
        let mut next = self.next_epoch.lock().unwrap_or_else(|p| p.into_inner());
        let epoch = *next;
        let enqueued = match &self.backend {
            Backend::Host(h) => h.enqueue(
                call.stream,
                algo,
                Call {
                    send: call.send.0,
                    recv: call.recv.0,
                    count: call.count,
                    elem,
                    op,
                },
                epoch,
            ),
            Backend::Cuda(c) => c.launch(call, algo, elem, op),
        };
        *next += rounds;
        if let Err(e) = &enqueued {
            // This rank's rounds are now out of step with its peers': later calls fail too.
            let mut slot = self.enqueue_error.lock().unwrap_or_else(|p| p.into_inner());
            slot.get_or_insert_with(|| e.clone());
        }
        enqueued
    }

    fn all_gather_max(&self) -> usize {
        // The CUDA kernel pushes each rank's input into one chunk slot of every peer; the host
        // algorithm publishes it in its own parity. A chunk slot either way.
        self.layout.chunk()
    }

    fn all_gather(&self, call: &AllGatherCall) -> Result<(), CollectiveError> {
        self.check()
            .map_err(|e| CollectiveError::Poisoned(Box::new(e)))?;
        let es = call.dtype.size().ok_or_else(|| {
            CollectiveError::Unsupported(format!("all-gather of {:?}: unknown size", call.dtype))
        })?;
        let bytes = call.count.checked_mul(es).ok_or_else(|| {
            CollectiveError::Unsupported(format!("{} elements overflow a size", call.count))
        })?;
        if bytes > self.all_gather_max() {
            return Err(CollectiveError::Unsupported(format!(
                "all-gather of {bytes} bytes a rank: the window takes at most {}",
                self.all_gather_max()
            )));
        }
        if bytes == 0 {
            return Ok(());
        }
        let mut next = self.next_epoch.lock().unwrap_or_else(|p| p.into_inner());
        let epoch = *next;
        let enqueued = match &self.backend {
            Backend::Host(h) => h.enqueue_all_gather(
                call.stream,
                Gather {
                    send: call.send.0,
                    recv: call.recv.0,
                    len: bytes,
                },
                epoch,
            ),
            Backend::Cuda(c) => c.launch_all_gather(call),
        };
        *next += 1;
        if let Err(e) = &enqueued {
            // As `all_reduce`: this rank's rounds are out of step with its peers' from now on.
            let mut slot = self.enqueue_error.lock().unwrap_or_else(|p| p.into_inner());
            slot.get_or_insert_with(|| e.clone());
        }
        enqueued
    }

    fn check(&self) -> Result<(), CollectiveError> {
        if let Some(e) = &*self.enqueue_error.lock().unwrap_or_else(|p| p.into_inner()) {
            return Err(e.clone());
        }
        match &self.backend {
            Backend::Host(h) => h.check(),
            Backend::Cuda(c) => c.check(),
        }
    }
}
