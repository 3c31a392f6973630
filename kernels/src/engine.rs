//! The provider ferrocx's communicators find through `inventory`, and the backend it makes
//! for each communicator: the scratch window, the round (epoch) counter, and the host or CUDA
//! algorithms.

use std::sync::Mutex;

use ferrocx::abi::Capabilities;
use ferrocx::adaptor::Device;
use ferrocx::comm::{CommError, Communicator};
use ferrocx::window::collectives::{
    AllReduceCall, CollectiveError, Measured, WindowAlgo, WindowCollectives,
    WindowCollectivesProvider,
};
use ferrocx::window::{SymmetricBuffer, Window, WindowFlags};

use crate::element::{self, Elem, Op};
use crate::host::{algo::Call, Host};
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
    /// The built-in CUDA device adaptor (or its plugin): NVRTC-compiled kernels launched on
    /// its streams.
    Cuda,
}

/// The backend for `device`, if one runs on it.
pub(crate) fn kind_of(device: &Device) -> Option<(Kind, u32)> {
    let index = device.get_device().ok()?;
    let props = device.properties(index).ok()?;
    let host = Capabilities::HOST_ADDRESSABLE | Capabilities::HOST_FUNC;
    if props.capabilities.contains(host) {
        Some((Kind::Host, 0))
    } else if device.name() == "cuda" && props.vendor == "NVIDIA" {
        Some((Kind::Cuda, props.arch))
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

fn create(comm: &Communicator) -> Result<Box<dyn WindowCollectives>, CommError> {
    Ok(Box::new(Engine::new(comm)?))
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
    // Released (locally) in `drop`, before the buffer it maps.
    window: Option<Window>,
    _buffer: SymmetricBuffer,
}

impl Engine {
    /// Allocates and registers the scratch window (collective) and readies the backend.
    pub(crate) fn new(comm: &Communicator) -> Result<Engine, CommError> {
        let device = comm.device().clone();
        let (kind, arch) = kind_of(&device).ok_or_else(|| {
            CollectiveError::Unavailable(format!(
                "no backend for the device adaptor `{}`",
                device.name()
            ))
        })?;
        let (world, rank) = (comm.world(), comm.rank());
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
        let buffer = comm.alloc_symmetric(layout.scratch_bytes())?;
        // Signal slots start at 0; every peer waits for a value of at least 1.
        // SAFETY: `buffer` is a live symmetric allocation of `buffer.size()` bytes that no stream
        // uses yet.
        unsafe { device.mem_set(buffer.ptr(), 0, buffer.size()) }?;
        let window =
            comm.register_peer_window(buffer.ptr(), buffer.size(), WindowFlags::NO_MULTICAST)?;
        let peers: Vec<u64> = (0..world)
            .map(|q| window.peer(q).map(|p| p.0))
            .collect::<Option<_>>()
            .ok_or_else(|| {
                CollectiveError::Unavailable(format!(
                    "the scratch window is a {} window without peer addresses",
                    window.kind()
                ))
            })?;
        tracing::debug!(
            kind = %window.kind(),
            bytes = layout.scratch_bytes(),
            chunk = layout.chunk(),
            "window collectives: scratch window registered ({})",
            window.reason()
        );
        let backend = match module {
            None => Backend::Host(Host::new(device, layout, rank, peers, comm.timeout())),
            Some(module) => Backend::Cuda(Box::new(cuda::Cuda::new(
                &device,
                module,
                layout,
                rank,
                peers,
                comm.timeout(),
            )?)),
        };
        Ok(Engine {
            backend,
            layout,
            next_epoch: Mutex::new(1),
            enqueue_error: Mutex::new(None),
            window: Some(window),
            _buffer: buffer,
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

impl Drop for Engine {
    fn drop(&mut self) {
        // The communicator synchronized its stream before its fields drop: no call is left
        // that reads the window. Peers keep their own mappings of this rank's memory.
        if let Some(w) = self.window.take() {
            w.release_local();
        }
    }
}
