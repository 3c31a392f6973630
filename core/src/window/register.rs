//! Registration and deregistration of a window of any kind (vendor, symmetric, IPC): the
//! protocol behind `register_window` and `deregister_window`, written against the device
//! table only (VMM, flat mapping, multicast, IPC), the CCL's window group and the job's store.
//! See the module docs of [`crate::window`] for the steps; each holds what it took in guards of
//! [`super::resources`], so a failed step releases everything before it.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use crate::abi::{Comm, DevicePtr, MemKind, Stream};
use crate::adaptor::{Ccl, Device};

use super::agree::{Agreement, Refusal};
use super::fdpass::{self, FdServer};
use super::heap::{HeapAllocation, SymHeap};
use super::policy::{Backing, WindowPlan};
use super::resources::{
    self, DeviceMem, IpcImport, McBinding, McMapping, McObject, Reservation, Slot, VendorWindow,
    Vmm,
};
use super::{SymHeapStep, Window, WindowError, WindowFlags, WindowKind};

/// What one registration works with: the communicator's parts.
pub(crate) struct Context<'a> {
    pub(crate) device: &'a Device,
    pub(crate) device_index: i32,
    pub(crate) ccl: &'a Ccl,
    pub(crate) comm: Comm,
    pub(crate) stream: Stream,
    pub(crate) agree: Agreement<'a>,
    pub(crate) job: &'a str,
    /// The window's number in this communicator (the same on every rank).
    pub(crate) seq: u64,
    pub(crate) timeout: Duration,
    pub(crate) plan: &'a WindowPlan,
    pub(crate) heap: &'a SymHeap,
    /// A step to fail once on this rank (tests).
    pub(crate) inject: &'a Mutex<Option<SymHeapStep>>,
}

impl Context<'_> {
    fn rank(&self) -> usize {
        self.agree.rank
    }

    fn world(&self) -> usize {
        self.agree.world
    }

    /// An error for `step` when a test asked this rank to fail it (once).
    fn injected(&self, step: SymHeapStep) -> Result<(), String> {
        let mut armed = self.inject.lock().unwrap_or_else(|p| p.into_inner());
        if *armed == Some(step) {
            *armed = None;
            return Err(format!("{step}: injected failure"));
        }
        Ok(())
    }

    fn socket(&self, rank: usize) -> String {
        fdpass::socket_name(self.job, self.agree.tag, self.seq, rank)
    }
}

/// What a window holds, released in field order.
pub(crate) enum Held {
    /// Deregistered through the CCL.
    Vendor(VendorWindow),
    /// Peers' heap memory, mapped.
    Mapped { _mapped: Mapped },
    /// Peers' IPC imports.
    Ipc { _peers: IpcPeers },
}

impl Held {
    /// Releases this rank's part without a word to the peers (a dropped window).
    pub(crate) fn release_locally(self) {
        if let Held::Vendor(_) = self {
            tracing::warn!(
                "a vendor window stays registered with the CCL until the communicator is destroyed"
            );
        }
    }
}

/// Peers' heap memory mapped here: one flat range (symmetric) or one range per peer (IPC).
pub(crate) struct Mapped {
    _multicast: Option<Multicast>,
    _peers: Peers,
    _imports: Vec<Vmm>,
    _alloc: Arc<HeapAllocation>,
}

/// A multicast object bound to this rank's memory and mapped.
struct Multicast {
    mapping: McMapping,
    _binding: McBinding,
    _object: McObject,
}

/// Peers' IPC imports and the table of their addresses.
pub(crate) struct IpcPeers {
    _table: DeviceMem,
    _imports: Vec<IpcImport>,
}

/// Mapped peers and their addresses here.
struct Peers {
    table: Option<DeviceMem>,
    _slots: Vec<Slot>,
    reservations: Vec<Reservation>,
    addrs: Vec<DevicePtr>,
    flat: Option<DevicePtr>,
}

/// How peers are mapped.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Layout {
    /// One range, rank `i` at `base + i * size`.
    Flat,
    /// A range per peer.
    PerPeer,
}

/// This rank's record of the first step.
struct Offer {
    size: u64,
    /// Why this rank's arguments cannot make a window (empty: they can).
    invalid: String,
    /// Heap buffer: its allocation's size and the buffer's offset in it.
    heap: Option<(u64, u64)>,
    /// Heap buffer: why exporting it (or listening) failed (empty: it did not).
    export_error: String,
    pid: u32,
    multicast: bool,
    node: String,
    netns: String,
}

impl Offer {
    fn encode(&self) -> Vec<u8> {
        let mut w = Vec::new();
        let str = |w: &mut Vec<u8>, s: &str| {
            w.extend_from_slice(&(s.len() as u32).to_le_bytes());
            w.extend_from_slice(s.as_bytes());
        };
        w.extend_from_slice(&self.size.to_le_bytes());
        str(&mut w, &self.invalid);
        let (alloc, offset) = self.heap.unwrap_or((0, 0));
        w.push(u8::from(self.heap.is_some()));
        w.extend_from_slice(&alloc.to_le_bytes());
        w.extend_from_slice(&offset.to_le_bytes());
        str(&mut w, &self.export_error);
        w.extend_from_slice(&self.pid.to_le_bytes());
        w.push(u8::from(self.multicast));
        str(&mut w, &self.node);
        str(&mut w, &self.netns);
        w
    }

    fn decode(mut b: &[u8]) -> Option<Offer> {
        fn take<'a>(b: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
            (b.len() >= n).then(|| {
                let (head, tail) = b.split_at(n);
                *b = tail;
                head
            })
        }
        fn u64_(b: &mut &[u8]) -> Option<u64> {
            take(b, 8).map(|x| u64::from_le_bytes(x.try_into().unwrap_or_default()))
        }
        fn u32_(b: &mut &[u8]) -> Option<u32> {
            take(b, 4).map(|x| u32::from_le_bytes(x.try_into().unwrap_or_default()))
        }
        fn str_(b: &mut &[u8]) -> Option<String> {
            let n = u32_(b)? as usize;
            take(b, n).map(|s| String::from_utf8_lossy(s).into_owned())
        }
        let size = u64_(&mut b)?;
        let invalid = str_(&mut b)?;
        let is_heap = take(&mut b, 1)?[0] == 1;
        let (alloc, offset) = (u64_(&mut b)?, u64_(&mut b)?);
        let export_error = str_(&mut b)?;
        let pid = u32_(&mut b)?;
        let multicast = take(&mut b, 1)?[0] == 1;
        let node = str_(&mut b)?;
        let netns = str_(&mut b)?;
        b.is_empty().then_some(Offer {
            size,
            invalid,
            heap: is_heap.then_some((alloc, offset)),
            export_error,
            pid,
            multicast,
            node,
            netns,
        })
    }
}

/// This machine's boot id (the node) and this process's network namespace (who can reach
/// whose abstract sockets).
fn node_identity() -> &'static (String, String) {
    static ID: OnceLock<(String, String)> = OnceLock::new();
    ID.get_or_init(|| {
        let read = |p: &str| {
            std::fs::read_to_string(p)
                .map(|s| s.trim().to_string())
                .unwrap_or_default()
        };
        let boot = read("/proc/sys/kernel/random/boot_id");
        let node = if boot.is_empty() {
            read("/proc/sys/kernel/hostname")
        } else {
            boot
        };
        let netns = std::fs::read_link("/proc/self/ns/net")
            .map(|p| p.display().to_string())
            .unwrap_or_default();
        (node, netns)
    })
}

/// A heap buffer's descriptor and this rank's listening socket, made before the first
/// agreement.
struct Prepared {
    fd: OwnedFd,
    server: FdServer,
}

fn prepare(ctx: &Context<'_>, alloc: &HeapAllocation) -> Result<Prepared, String> {
    ctx.injected(SymHeapStep::Export)?;
    let fd = alloc
        .mem()
        .export_fd()
        .map_err(|e| format!("export: {e}"))?;
    let name = ctx.socket(ctx.rank());
    let server =
        FdServer::bind(&name).map_err(|e| format!("export: listening on socket @{name}: {e}"))?;
    Ok(Prepared { fd, server })
}

/// Whether this rank votes for multicast on this window.
fn multicast_vote(ctx: &Context<'_>, flags: WindowFlags) -> bool {
    if !ctx.plan.multicast.allowed || flags.contains(WindowFlags::NO_MULTICAST) {
        return false;
    }
    match resources::mc_supported(ctx.device, ctx.device_index) {
        Ok(yes) => yes,
        Err(e) => {
            tracing::debug!("mc_supported: {e}; no multicast");
            false
        }
    }
}

/// The steps of one registration (see the module docs of [`crate::window`]).
pub(crate) fn register(
    ctx: &Context<'_>,
    buf: DevicePtr,
    size: usize,
    flags: WindowFlags,
) -> Result<Window, WindowError> {
    let window = match ctx.plan.backing {
        Backing::Unavailable => return Err(WindowError::Unsupported(ctx.plan.reason.clone())),
        Backing::Vendor => vendor(ctx, buf, size, flags)?,
        Backing::SymHeap | Backing::Ipc => heap_or_ipc(ctx, buf, size, flags)?,
    };
    tracing::debug!(
        window = ctx.seq,
        kind = %window.kind,
        bytes = size,
        multicast = window.has_multicast(),
        reason = %window.reason,
        "window registered"
    );
    Ok(window)
}

fn vendor(
    ctx: &Context<'_>,
    buf: DevicePtr,
    size: usize,
    flags: WindowFlags,
) -> Result<Window, WindowError> {
    // SAFETY: the caller's buffer of `size` bytes, passed on as `Communicator::register_window`
    // received it (its contract is the caller's to keep until deregistration).
    let w = unsafe { VendorWindow::register(ctx.ccl, ctx.comm, buf, size, flags.vendor_bits()) }?;
    let mut win = window(ctx, WindowKind::Vendor, buf, size, ctx.plan.reason.clone());
    win.vendor = Some(w.handle());
    win.held = Some(Held::Vendor(w));
    Ok(win)
}

/// A window with no peers, multicast or resources yet.
fn window(
    ctx: &Context<'_>,
    kind: WindowKind,
    buf: DevicePtr,
    size: usize,
    reason: String,
) -> Window {
    Window {
        tag: ctx.agree.tag,
        seq: ctx.seq,
        kind,
        rank: ctx.rank(),
        world: ctx.world(),
        size,
        local: buf,
        peers: Vec::new(),
        flat: None,
        multicast: None,
        vendor: None,
        peer_table: DevicePtr::NULL,
        reason,
        held: None,
    }
}

/// The first agreement, then the heap's protocol where every rank can take it, IPC handles
/// where not.
fn heap_or_ipc(
    ctx: &Context<'_>,
    buf: DevicePtr,
    size: usize,
    flags: WindowFlags,
) -> Result<Window, WindowError> {
    let invalid = match (size, buf) {
        (0, _) => "a window of 0 bytes",
        (_, DevicePtr::NULL) => "a null buffer",
        _ => "",
    };
    let local = match invalid.is_empty() {
        true => ctx.heap.find(buf, size),
        false => None,
    };
    let prepared = local.as_ref().map(|(alloc, _)| prepare(ctx, alloc));
    let (node, netns) = node_identity().clone();
    let offer = Offer {
        size: size as u64,
        invalid: invalid.to_string(),
        heap: local
            .as_ref()
            .map(|(a, off)| (a.size() as u64, *off as u64)),
        export_error: match &prepared {
            Some(Err(e)) => e.clone(),
            _ => String::new(),
        },
        pid: std::process::id(),
        multicast: local.is_some() && multicast_vote(ctx, flags),
        node,
        netns,
    };
    let offers = ctx
        .agree
        .gather("offer", &offer.encode())?
        .iter()
        .enumerate()
        .map(|(rank, b)| {
            Offer::decode(b).ok_or(WindowError::Protocol {
                step: "offer",
                rank,
            })
        })
        .collect::<Result<Vec<_>, _>>()?;

    let bad: Vec<String> = offers
        .iter()
        .enumerate()
        .filter(|(_, o)| !o.invalid.is_empty())
        .map(|(r, o)| format!("rank {r} registers {}", o.invalid))
        .collect();
    if !bad.is_empty() {
        return Err(WindowError::InvalidArgument(format!(
            "register_window: {}",
            bad.join("; ")
        )));
    }
    if offers.iter().any(|o| o.size != offers[0].size) {
        return Err(WindowError::SizeMismatch {
            sizes: offers
                .iter()
                .enumerate()
                .map(|(r, o)| (r, o.size as usize))
                .collect(),
        });
    }
    if let Some((r, o)) = offers
        .iter()
        .enumerate()
        .find(|(_, o)| o.node != offers[0].node)
    {
        return Err(WindowError::Nodes(format!(
            "rank 0 runs on node {:?}, rank {r} on node {:?}",
            offers[0].node, o.node
        )));
    }

    let mut why_ipc = None;
    if let Some(r) = offers.iter().position(|o| o.heap.is_none()) {
        why_ipc = Some(format!(
            "rank {r}'s buffer is not memory of alloc_symmetric"
        ));
    } else if let Some(r) = offers.iter().position(|o| o.heap != offers[0].heap) {
        let (a0, o0) = offers[0].heap.unwrap_or_default();
        let (a, o) = offers[r].heap.unwrap_or_default();
        why_ipc = Some(format!(
            "the heap buffers differ: rank 0's is at offset {o0} of {a0} bytes, rank {r}'s at \
             offset {o} of {a} bytes"
        ));
    } else if let Some(r) = offers.iter().position(|o| o.netns != offers[0].netns) {
        why_ipc = Some(format!(
            "rank {r} is in another network namespace than rank 0: descriptors cannot be passed"
        ));
    } else if let Some(r) = offers.iter().position(|o| !o.export_error.is_empty()) {
        why_ipc = Some(fell_back(ctx, r, &offers[r].export_error));
    }
    let (Some((alloc, offset)), Some(Ok(prepared)), None) = (local, prepared, &why_ipc) else {
        let why = why_ipc.unwrap_or_else(|| ctx.plan.reason.clone());
        return device_ipc(ctx, buf, size, why);
    };
    let layout = match ctx.plan.backing {
        Backing::SymHeap => Layout::Flat,
        _ => Layout::PerPeer,
    };
    let multicast = layout == Layout::Flat && offers.iter().all(|o| o.multicast);
    let pids: Vec<u32> = offers.iter().map(|o| o.pid).collect();
    peer_mapped(
        ctx, buf, size, alloc, offset, prepared, &pids, layout, multicast,
    )
}

/// The reason of an IPC window that replaces a failed sym-heap step, logged once.
fn fell_back(ctx: &Context<'_>, rank: usize, reason: &str) -> String {
    let why = format!("the symmetric heap failed on rank {rank}: {reason}");
    tracing::warn!(window = ctx.seq, "{why}; every rank falls back to IPC");
    why
}

/// Passes the descriptors, maps the peers and, when decided, multicast.
#[allow(clippy::too_many_arguments)]
fn peer_mapped(
    ctx: &Context<'_>,
    buf: DevicePtr,
    size: usize,
    alloc: Arc<HeapAllocation>,
    offset: usize,
    prepared: Prepared,
    pids: &[u32],
    layout: Layout,
    multicast: bool,
) -> Result<Window, WindowError> {
    let me = ctx.rank();
    let bytes = alloc.size();
    // Rank 0 makes the multicast object now, so its descriptor travels with its memory's.
    let (mc_root, mc_fd) = match multicast && me == 0 {
        true => match McObject::create(ctx.device, bytes, ctx.world() as i32)
            .and_then(|o| o.export_fd().map(|fd| (o, fd)))
        {
            Ok((o, fd)) => (Some(Ok(o)), Some(fd)),
            Err(e) => (Some(Err(format!("multicast: {e}"))), None),
        },
        false => (None, None),
    };
    let mut send: Vec<BorrowedFd<'_>> = vec![prepared.fd.as_fd()];
    send.extend(mc_fd.as_ref().map(|fd| fd.as_fd()));
    let stop = AtomicBool::new(false);
    let (received, outcome) = std::thread::scope(|s| {
        let server = s.spawn(|| prepared.server.serve(me, pids, &send, &stop, ctx.timeout));
        let received = receive(ctx, pids, bytes);
        let mine = received.as_ref().map(|_| ()).map_err(Clone::clone);
        let outcome = ctx.agree.outcome("exchange", &mine);
        // Every rank is past its receiving once the outcome is known (or the store failed).
        stop.store(true, Ordering::Release);
        if server.join().is_err() {
            tracing::warn!(window = ctx.seq, "the descriptor server panicked");
        }
        (received, outcome)
    });
    drop(send);
    drop((prepared, mc_fd));
    let received = match (outcome?, received) {
        (Ok(()), Ok(r)) => r,
        (Err(refusal), _) => {
            return device_ipc(
                ctx,
                buf,
                size,
                fell_back(ctx, refusal.rank, &refusal.reason),
            )
        }
        (Ok(()), Err(e)) => return Err(internal(format!("exchange agreed despite {e}"))),
    };

    let mapped = map_peers(ctx, layout, &alloc, offset, buf, &received.imports);
    let mine = mapped.as_ref().map(|_| ()).map_err(Clone::clone);
    let (kind, peers, reason) = match (ctx.agree.outcome("map", &mine)?, mapped) {
        (Ok(()), Ok(p)) => {
            let kind = match layout {
                Layout::Flat => WindowKind::Symmetric,
                Layout::PerPeer => WindowKind::Ipc,
            };
            (kind, p, ctx.plan.reason.clone())
        }
        (Err(refusal), failed) if layout == Layout::Flat => {
            drop(failed);
            let why = format!(
                "the flat range failed on rank {}: {}; each peer mapped on its own",
                refusal.rank, refusal.reason
            );
            tracing::warn!(window = ctx.seq, "{why}");
            let per_peer = map_peers(ctx, Layout::PerPeer, &alloc, offset, buf, &received.imports);
            let mine = per_peer.as_ref().map(|_| ()).map_err(Clone::clone);
            match (ctx.agree.outcome("map-peers", &mine)?, per_peer) {
                (Ok(()), Ok(p)) => (WindowKind::Ipc, p, why),
                (Err(r), _) => return Err(ipc_error(why, r)),
                (Ok(()), Err(e)) => return Err(internal(format!("map agreed despite {e}"))),
            }
        }
        (Err(refusal), _) => return Err(ipc_error(ctx.plan.reason.clone(), refusal)),
        (Ok(()), Err(e)) => return Err(internal(format!("map agreed despite {e}"))),
    };

    let attached = match (multicast, kind) {
        (true, WindowKind::Symmetric) => {
            match attach_multicast(ctx, mc_root, received.mc_fd, &alloc)? {
                Ok(m) => Some(m),
                Err(r) => {
                    tracing::warn!(
                        window = ctx.seq,
                        "multicast failed on rank {}: {}; the window stays symmetric without it",
                        r.rank,
                        r.reason
                    );
                    None
                }
            }
        }
        _ => None,
    };
    let multicast_base = attached
        .as_ref()
        .map(|m| DevicePtr(m.mapping.ptr().0 + offset as u64));
    let mut win = window(ctx, kind, buf, size, reason);
    win.peers = peers.addrs.clone();
    win.flat = peers.flat.map(|b| (b, bytes));
    win.multicast = multicast_base;
    win.peer_table = peers.table.as_ref().map_or(DevicePtr::NULL, DeviceMem::ptr);
    win.held = Some(Held::Mapped {
        _mapped: Mapped {
            _multicast: attached,
            _peers: peers,
            _imports: received.imports.into_iter().flatten().collect(),
            _alloc: alloc,
        },
    });
    Ok(win)
}

fn internal(what: String) -> WindowError {
    WindowError::InvalidArgument(format!("internal error of the window protocol: {what}"))
}

fn ipc_error(why: String, r: Refusal) -> WindowError {
    WindowError::Ipc {
        why,
        rank: r.rank,
        reason: r.reason,
    }
}

/// The peers' memory, imported (index = rank; `None` for this rank), and rank 0's multicast
/// object's descriptor when it sent one.
struct Received {
    imports: Vec<Option<Vmm>>,
    mc_fd: Option<OwnedFd>,
}

fn receive(ctx: &Context<'_>, pids: &[u32], bytes: usize) -> Result<Received, String> {
    let me = ctx.rank();
    ctx.injected(SymHeapStep::Exchange)?;
    let mut fds: Vec<Vec<OwnedFd>> = Vec::with_capacity(pids.len());
    for (r, &pid) in pids.iter().enumerate() {
        fds.push(match r == me {
            true => Vec::new(),
            false => fdpass::fetch(&ctx.socket(r), me, pid, ctx.timeout)
                .map_err(|e| format!("exchange: from rank {r}: {e}"))?,
        });
    }
    ctx.injected(SymHeapStep::Import)?;
    let mut imports = Vec::with_capacity(pids.len());
    let mut mc_fd = None;
    for (r, mut got) in fds.into_iter().enumerate() {
        if r == me {
            imports.push(None);
            continue;
        }
        if got.is_empty() {
            return Err(format!("exchange: rank {r} sent no descriptor"));
        }
        if r == 0 && got.len() > 1 {
            mc_fd = got.pop();
        }
        let vmm = Vmm::import(ctx.device, got[0].as_fd(), bytes)
            .map_err(|e| format!("import: rank {r}'s memory: {e}"))?;
        imports.push(Some(vmm));
    }
    Ok(Received { imports, mc_fd })
}

/// Maps every peer (and, flat, this rank) and, per peer, writes the table of addresses.
fn map_peers(
    ctx: &Context<'_>,
    layout: Layout,
    alloc: &HeapAllocation,
    offset: usize,
    buf: DevicePtr,
    imports: &[Option<Vmm>],
) -> Result<Peers, String> {
    let (me, world, bytes) = (ctx.rank(), ctx.world(), alloc.size());
    let mem = |r: usize| match (r == me, imports.get(r).and_then(Option::as_ref)) {
        (true, _) => Ok(alloc.mem()),
        (false, Some(v)) => Ok(v),
        (false, None) => Err(format!("map: rank {r}'s memory was not imported")),
    };
    let mut peers = Peers {
        table: None,
        _slots: Vec::with_capacity(world),
        reservations: Vec::new(),
        addrs: vec![DevicePtr::NULL; world],
        flat: None,
    };
    match layout {
        Layout::Flat => {
            ctx.injected(SymHeapStep::Reserve)?;
            let total = bytes
                .checked_mul(world)
                .ok_or_else(|| format!("reserve: {world} x {bytes} bytes overflows"))?;
            let range = Reservation::new(ctx.device, total).map_err(|e| format!("reserve: {e}"))?;
            let base = range.base();
            peers.reservations.push(range);
            ctx.injected(SymHeapStep::Map)?;
            for r in 0..world {
                let slot = peers.reservations[0]
                    .map(r, bytes, mem(r)?)
                    .map_err(|e| format!("map: rank {r}'s memory: {e}"))?;
                peers.addrs[r] = DevicePtr(slot.addr().0 + offset as u64);
                peers._slots.push(slot);
            }
            peers.flat = Some(DevicePtr(base.0 + offset as u64));
        }
        Layout::PerPeer => {
            for r in (0..world).filter(|&r| r != me) {
                ctx.injected(SymHeapStep::Reserve)?;
                let range =
                    Reservation::new(ctx.device, bytes).map_err(|e| format!("reserve: {e}"))?;
                ctx.injected(SymHeapStep::Map)?;
                let slot = range
                    .map(0, bytes, mem(r)?)
                    .map_err(|e| format!("map: rank {r}'s memory: {e}"))?;
                peers.addrs[r] = DevicePtr(slot.addr().0 + offset as u64);
                // The slot goes before its range: `_slots` is dropped first.
                peers._slots.push(slot);
                peers.reservations.push(range);
            }
            peers.addrs[me] = buf;
            peers.table =
                Some(peer_table(ctx.device, &peers.addrs).map_err(|e| format!("peer table: {e}"))?);
        }
    }
    Ok(peers)
}

/// Device memory holding `addrs` as little-endian `u64`s.
fn peer_table(
    dev: &Device,
    addrs: &[DevicePtr],
) -> Result<DeviceMem, crate::adaptor::AdaptorError> {
    let bytes: Vec<u8> = addrs.iter().flat_map(|a| a.0.to_le_bytes()).collect();
    let table = DeviceMem::alloc(dev, bytes.len(), MemKind::DEVICE)?;
    // SAFETY: `table` is a fresh allocation of `bytes.len()` bytes; `bytes` is live host memory.
    unsafe { dev.mem_copy(table.ptr(), DevicePtr(bytes.as_ptr() as u64), bytes.len()) }?;
    Ok(table)
}

/// Every rank adds its device, then binds its memory and maps the object; `Ok(Err(_))` when a
/// rank could not (everything taken is released).
fn attach_multicast(
    ctx: &Context<'_>,
    root: Option<Result<McObject, String>>,
    fd: Option<OwnedFd>,
    alloc: &HeapAllocation,
) -> Result<Result<Multicast, Refusal>, WindowError> {
    let bytes = alloc.size();
    let object = ctx.injected(SymHeapStep::Multicast).and_then(|()| {
        let o = match (root, fd) {
            (Some(created), _) => created?,
            (None, Some(fd)) => McObject::import(ctx.device, fd.as_fd(), bytes)
                .map_err(|e| format!("multicast: import: {e}"))?,
            (None, None) => return Err("multicast: rank 0 sent no multicast object".into()),
        };
        o.add_device(ctx.device_index)
            .map_err(|e| format!("multicast: add device: {e}"))?;
        Ok(o)
    });
    let mine = object.as_ref().map(|_| ()).map_err(Clone::clone);
    if let Err(r) = ctx.agree.outcome("mc-add", &mine)? {
        return Ok(Err(r));
    }
    let object = object.map_err(|e| internal(format!("mc-add agreed despite {e}")))?;
    // Every device is added before any binds (CUDA's order).
    let bound = object
        .bind(ctx.device_index, alloc.mem(), bytes)
        .and_then(|b| object.map(bytes).map(|m| (b, m)))
        .map_err(|e| format!("multicast: {e}"));
    let mine = bound.as_ref().map(|_| ()).map_err(Clone::clone);
    if let Err(r) = ctx.agree.outcome("mc-map", &mine)? {
        return Ok(Err(r));
    }
    let (binding, mapping) = bound.map_err(|e| internal(format!("mc-map agreed despite {e}")))?;
    Ok(Ok(Multicast {
        mapping,
        _binding: binding,
        _object: object,
    }))
}

/// A window of IPC handles: every rank exports its buffer's handle, every rank opens every
/// peer's.
fn device_ipc(
    ctx: &Context<'_>,
    buf: DevicePtr,
    size: usize,
    why: String,
) -> Result<Window, WindowError> {
    let me = ctx.rank();
    let exported = ctx.injected(SymHeapStep::IpcExport).and_then(|()| {
        // SAFETY: the caller's buffer, passed on as `Communicator::register_window` received it.
        unsafe { resources::ipc_export(ctx.device, buf) }.map_err(|e| format!("ipc-export: {e}"))
    });
    let record = match &exported {
        Ok(h) => [&[1u8][..], h].concat(),
        Err(e) => [&[0u8][..], e.as_bytes()].concat(),
    };
    let all = ctx.agree.gather("ipc", &record)?;
    if let Some((rank, r)) = all.iter().enumerate().find(|(_, r)| r.first() != Some(&1)) {
        return Err(WindowError::Ipc {
            why,
            rank,
            reason: String::from_utf8_lossy(r.get(1..).unwrap_or(&[])).into_owned(),
        });
    }
    let opened = (|| {
        ctx.injected(SymHeapStep::IpcOpen)?;
        let mut addrs = vec![DevicePtr::NULL; all.len()];
        let mut imports = Vec::with_capacity(all.len());
        for (r, record) in all.iter().enumerate() {
            if r == me {
                addrs[r] = buf;
                continue;
            }
            let import = IpcImport::open(ctx.device, &record[1..])
                .map_err(|e| format!("ipc-open: rank {r}'s handle: {e}"))?;
            addrs[r] = import.ptr();
            imports.push(import);
        }
        let table = peer_table(ctx.device, &addrs).map_err(|e| format!("peer table: {e}"))?;
        Ok::<_, String>((addrs, imports, table))
    })();
    let mine = opened.as_ref().map(|_| ()).map_err(Clone::clone);
    let (addrs, imports, table) = match (ctx.agree.outcome("ipc-open", &mine)?, opened) {
        (Ok(()), Ok(o)) => o,
        (Err(r), _) => return Err(ipc_error(why, r)),
        (Ok(()), Err(e)) => return Err(internal(format!("ipc-open agreed despite {e}"))),
    };
    let mut win = window(ctx, WindowKind::Ipc, buf, size, why);
    win.peers = addrs;
    win.peer_table = table.ptr();
    win.held = Some(Held::Ipc {
        _peers: IpcPeers {
            _table: table,
            _imports: imports,
        },
    });
    Ok(win)
}

/// Waits for this rank's stream and for every rank to be done with the window, then releases
/// it; a vendor window is deregistered by the CCL.
pub(crate) fn deregister(ctx: &Context<'_>, mut window: Window) -> Result<(), WindowError> {
    let held = window.held.take();
    if window.tag != ctx.agree.tag {
        if let Some(h) = held {
            h.release_locally();
        }
        return Err(WindowError::InvalidArgument(
            "deregister_window: the window belongs to another communicator".into(),
        ));
    }
    let synced = ctx.device.stream_synchronize(ctx.stream);
    match held {
        None => {}
        Some(Held::Vendor(v)) => v.deregister()?,
        Some(held) => {
            let all = ctx.agree.gather("release", &window.seq.to_le_bytes());
            // Every rank has arrived (or the store failed, and waiting longer cannot help).
            drop(held);
            let mismatched: Vec<String> = all?
                .iter()
                .enumerate()
                .filter(|(_, s)| s.as_slice() != window.seq.to_le_bytes())
                .map(|(r, s)| {
                    let seq = s.as_slice().try_into().map(u64::from_le_bytes);
                    format!("rank {r} released window #{}", seq.unwrap_or(u64::MAX))
                })
                .collect();
            if !mismatched.is_empty() {
                return Err(WindowError::Mismatch(format!(
                    "rank {} released window #{}, but {}",
                    ctx.rank(),
                    window.seq,
                    mismatched.join(", ")
                )));
            }
        }
    }
    synced?;
    tracing::debug!(window = window.seq, kind = %window.kind, "window deregistered");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offers_round_trip_and_truncations_are_refused() {
        let o = Offer {
            size: 4096,
            invalid: String::new(),
            heap: Some((8192, 64)),
            export_error: "export: nope".into(),
            pid: 77,
            multicast: true,
            node: "boot-1".into(),
            netns: "net:[1]".into(),
        };
        let b = o.encode();
        let d = Offer::decode(&b).expect("decodes");
        assert_eq!(
            (d.size, d.heap, d.export_error.as_str(), d.pid, d.multicast),
            (4096, Some((8192, 64)), "export: nope", 77, true)
        );
        assert_eq!((d.node.as_str(), d.netns.as_str()), ("boot-1", "net:[1]"));
        for n in 0..b.len() {
            assert!(
                Offer::decode(&b[..n]).is_none(),
                "a record cut at {n} bytes"
            );
        }
        assert!(Offer::decode(&[b.as_slice(), &[0]].concat()).is_none());
        let plain = Offer { heap: None, ..o };
        assert_eq!(Offer::decode(&plain.encode()).map(|d| d.heap), Some(None));
    }
}
