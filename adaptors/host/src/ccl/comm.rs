//! A host communicator: its segment and the order its operations execute in.
//!
//! Operations are enqueued on a stream and run on that stream's worker. Each gets a ticket
//! when enqueued; a worker runs an operation only when every earlier ticket of the
//! communicator has run, so ranks execute their operations in the order they issued them even
//! across streams. The first failure breaks the communicator: later operations fail at once
//! with it, and `comm_get_async_error` reports it.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::Duration;

use ferrocx_plugin_sdk::abi::Status;
use ferrocx_plugin_sdk::{Error, Result};

use super::cores::Placement;
use super::ctx::Ctx;
use super::helpers::Helpers;
use super::segment::Segment;

struct Exec {
    /// Workers waiting for their ticket's turn (only operations of one communicator enqueued
    /// on several streams ever wait).
    waiting: usize,
    /// Barrier generation reached.
    gen: u64,
    /// Generation every rank is known to have reached (see `Ctx::settle`).
    settled: u64,
    /// Ticket of the next operation to run.
    next: u64,
    /// The first failure; later operations fail with it.
    broken: Option<Error>,
}

/// A value on a cache line of its own.
#[repr(align(128))]
struct Padded<T>(T);

/// One rank's communicator. Aligned to a cache line, so that the reference counts its `Arc`
/// keeps in front of it (taken by the thread that enqueues, dropped by the stream's worker)
/// share no line with what the worker reads.
#[repr(align(128))]
pub struct HostComm {
    pub rank: usize,
    pub nranks: usize,
    pub seg: Segment,
    pub timeout: Duration,
    /// Where this rank's collective work runs.
    pub placement: Placement,
    /// Helper threads for the copies and reductions of large collectives.
    pub helpers: Helpers,
    /// Taken by the enqueuing thread for every call: a line of its own.
    tickets: Padded<AtomicU64>,
    exec: Mutex<Exec>,
    turn: Condvar,
    pub aborted: AtomicBool,
    /// Bytes read and written by the copies and reductions of the large collectives (the
    /// slot and chunk paths), counted by the thread that runs them; logged (debug) when the
    /// communicator goes.
    pub moved: AtomicU64,
    /// Set when the handle is destroyed (handle caches check it).
    pub destroyed: AtomicBool,
    /// The peers' inputs mapped for the reads in place (see `direct`).
    pub peers: super::direct::PeerInputs,
}

impl HostComm {
    /// Wraps an attached segment.
    pub fn new(
        rank: usize,
        nranks: usize,
        seg: Segment,
        timeout: Duration,
        placement: Placement,
        helpers: Helpers,
    ) -> Self {
        HostComm {
            rank,
            nranks,
            seg,
            timeout,
            placement,
            helpers,
            tickets: Padded(AtomicU64::new(0)),
            exec: Mutex::new(Exec {
                waiting: 0,
                gen: 0,
                settled: 0,
                next: 0,
                broken: None,
            }),
            turn: Condvar::new(),
            aborted: AtomicBool::new(false),
            moved: AtomicU64::new(0),
            destroyed: AtomicBool::new(false),
            peers: Default::default(),
        }
    }

    /// Counts `bytes` read or written by a large collective's copies and reductions.
    pub fn count_moved(&self, bytes: usize) {
        // Only the thread that runs the communicator's operations (one at a time) adds.
        self.moved.fetch_add(bytes as u64, Ordering::Relaxed);
    }

    /// Sets the barrier generation reached during initialisation.
    pub fn set_generation(&self, gen: u64) {
        let mut ex = self.exec.lock().unwrap_or_else(|p| p.into_inner());
        ex.gen = gen;
        ex.settled = gen;
    }

    /// Blocks until every operation enqueued so far has run; returns the first failure.
    pub fn wait_idle(&self) -> Result<()> {
        let target = self.tickets.0.load(Ordering::Acquire);
        let mut ex = self.exec.lock().unwrap_or_else(|p| p.into_inner());
        while ex.next < target && ex.broken.is_none() {
            ex.waiting += 1;
            ex = self.turn.wait(ex).unwrap_or_else(|p| p.into_inner());
            ex.waiting -= 1;
        }
        match &ex.broken {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }

    /// A ticket for an operation about to be enqueued.
    pub fn ticket(&self) -> u64 {
        self.tickets.0.fetch_add(1, Ordering::AcqRel)
    }

    /// The first failure of the communicator, if any.
    pub fn async_error(&self) -> Option<Error> {
        self.exec
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .broken
            .clone()
    }

    /// Marks the communicator aborted: every pending and later operation fails.
    pub fn abort(&self) {
        self.aborted.store(true, Ordering::Release);
        let h = self.seg.header();
        h.abort.store(1, Ordering::Release);
        h.wake.fetch_add(1, Ordering::AcqRel);
        ferrocx::futex::wake(&h.wake);
        let mut ex = self.exec.lock().unwrap_or_else(|p| p.into_inner());
        ex.broken
            .get_or_insert_with(|| Error::new(Status::ABORTED, "the communicator was aborted"));
        drop(ex);
        self.turn.notify_all();
    }

    /// Runs operation `ticket` once every earlier ticket has run; `resume` when an inline
    /// attempt ([`run_inline`](Self::run_inline)) already made its start; `small` for a
    /// latency-bound operation (see `Placement::bind_for`).
    pub fn run(
        &self,
        ticket: u64,
        resume: bool,
        small: bool,
        f: impl FnOnce(&mut Ctx<'_>) -> Result<()>,
    ) -> Result<()> {
        self.placement.bind_for(small);
        let mut ex = self.exec.lock().unwrap_or_else(|p| p.into_inner());
        while ex.next != ticket && ex.broken.is_none() {
            ex.waiting += 1;
            ex = self.turn.wait(ex).unwrap_or_else(|p| p.into_inner());
            ex.waiting -= 1;
        }
        let result = match &ex.broken {
            Some(e) => Err(Error::new(
                e.status(),
                format!("the communicator failed earlier: {}", e.message()),
            )),
            None => {
                let mut ctx = Ctx::new(self, ex.gen, ex.settled, resume);
                let r = f(&mut ctx);
                ex.gen = ctx.gen;
                ex.settled = ctx.settled;
                r
            }
        };
        self.end(ex, ticket, result)
    }

    /// Runs operation `ticket` on the calling thread if it is its turn now (no earlier
    /// operation of the communicator is still to run), letting its agreement wait for peers
    /// at most `budget`. `None`: not its turn (nothing was done). `Some(Err(started))`: a peer
    /// had not arrived (or, for a small broadcast, its data or its room was not there): the
    /// operation stays the communicator's next and must be finished by [`run`](Self::run),
    /// with `resume` when its start was published (`started`). `Some(Ok(result))`: it ran.
    pub fn run_inline(
        &self,
        ticket: u64,
        budget: Duration,
        f: impl FnOnce(&mut Ctx<'_>) -> Result<()>,
    ) -> Option<std::result::Result<Result<()>, bool>> {
        let mut ex = self.exec.try_lock().ok()?;
        if ex.next != ticket || ex.broken.is_some() {
            return None;
        }
        let mut ctx = Ctx::new(self, ex.gen, ex.settled, false);
        ctx.budget = Some(budget);
        let r = f(&mut ctx);
        if ctx.pending {
            return Some(Err(ctx.started));
        }
        ex.gen = ctx.gen;
        ex.settled = ctx.settled;
        Some(Ok(self.end(ex, ticket, r)))
    }

    /// Records the end of operation `ticket` (its failure breaks the communicator) and lets
    /// the next one run.
    fn end(
        &self,
        mut ex: std::sync::MutexGuard<'_, Exec>,
        ticket: u64,
        result: Result<()>,
    ) -> Result<()> {
        if let Err(e) = &result {
            if ex.broken.is_none() {
                ex.broken = Some(e.clone());
                if e.status() != Status::ABORTED {
                    tracing::warn!(rank = self.rank, "host communicator failed: {e}");
                }
            }
        }
        ex.next = ex.next.max(ticket + 1);
        let wake = ex.waiting > 0;
        drop(ex);
        if wake {
            self.turn.notify_all();
        }
        result
    }
}

impl Drop for HostComm {
    fn drop(&mut self) {
        tracing::debug!(
            rank = self.rank,
            nranks = self.nranks,
            bytes = self.moved.load(Ordering::Relaxed),
            "host communicator: bytes read and written by the large collectives' copies and \
             reductions"
        );
    }
}
