//! The bridge on one host: one POSIX shared-memory segment per job and communicator that every
//! rank of the job maps, holding per rank its signal words and its staging slots.
//!
//! ```text
//! segment /ferrocx-<job>-bridge-<comm>          (made by rank 0, unlinked once all attached)
//! ├─ header (4 KiB): magic, world, depth, slot bytes, attached, failed (rank + 1), the
//! │                  failure's text, the count of ranks asleep in a wait
//! └─ rank r (stride = control + depth slots + p2p slot)
//!    ├─ control: pid, arrive[s], done[s] (s < depth, one cache line each), the call
//!    │           descriptors (two, by call parity), p2p sent[to] and acked[from], the
//!    │           call's buffer handles (two, by call parity: see `Bridge::set_handle`)
//!    ├─ slot 0 .. slot depth-1   staging of the pipeline slots (epoch % depth)
//!    └─ p2p slot                 staging of this rank's sends to ranks of other clusters
//! ```
//!
//! Every signal is a monotonic counter, never reset: `arrive[r][s]` holds the latest epoch rank
//! r published in slot s (plus one), `done[r][s]` counts the reads of slot s that finished (each
//! reader adds one), so a writer knows a slot is free when `done` reaches the reads it expects
//! (counted when the steps were planned, identically on every rank). A wait spins briefly, then
//! sleeps on the word (futex; a writer wakes sleepers only while the header's sleeper count
//! is not zero); every few milliseconds it looks at the failure word (set by the first rank
//! that gave up on a peer) and at the awaited rank's process; at the deadline (`timeout_ms`)
//! it sets the failure word and fails naming the rank and its cluster.

use std::ffi::CString;
use std::io;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::topo::Topology;
use super::HeteroError;

const MAGIC: u64 = 0x6665_7272_6f62_7231; // "ferrobr1"
const LINE: usize = 64;
const PAGE: usize = 4096;
const HEADER: usize = PAGE;
/// Bytes of the failure text kept in the header.
const TEXT: usize = 1024;
/// How long a reader of a claimed failure record waits for its text (see `Bridge::failure`).
const TEXT_WAIT: Duration = Duration::from_millis(200);
/// Header fields (byte offsets).
const H_MAGIC: usize = 0;
const H_WORLD: usize = 8;
const H_DEPTH: usize = 16;
const H_SLOT: usize = 24;
const H_ATTACHED: usize = LINE;
const H_FAILED: usize = 2 * LINE;
/// The earliest bridge step that failed on any rank, as `(epoch << 16 | rank) + 1` (0: none).
const H_FAILED_STEP: usize = 2 * LINE + 8;
const H_TEXT_LEN: usize = 3 * LINE;
const H_TEXT: usize = 4 * LINE;
/// Ranks asleep in a wait (on any word): a signal wakes sleepers only when there are some.
const H_SLEEPERS: usize = 4 * LINE + TEXT;

/// Control block of one rank (byte offsets from the rank's base).
const C_PID: usize = 0;
const C_ARRIVE: usize = LINE;
/// Two call descriptors of 4 words (tag, count, kind, spare), by call parity.
const C_DESC_LINES: usize = 2;

/// Bytes of one call's buffer handle record: its length (8 bytes), then the handle.
const HANDLE_RECORD: usize = 256;
/// The longest buffer handle a record holds.
pub const MAX_HANDLE: usize = HANDLE_RECORD - 8;

/// One rank's descriptor of a call: every rank of the job must give the same one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Descriptor {
    /// Elements (per rank, as the collective counts them).
    pub count: u64,
    /// The collective, dtype, op and root, packed by the caller.
    pub kind: u64,
}

/// The shared segment, mapped.
pub struct Bridge {
    base: *mut u8,
    len: usize,
    world: usize,
    depth: usize,
    slot_bytes: usize,
    control: usize,
    stride: usize,
    /// The name, while this process must unlink it (rank 0 until every rank attached).
    name: CString,
    timeout: Duration,
    /// Rank -> (cluster name) for errors.
    topo: Topology,
}

// SAFETY: the mapping is shared memory reached only through atomics (signals) or through the
// step protocol (staging bytes written by one rank before it publishes, read by others after);
// the pointer itself is never mutated after construction.
unsafe impl Send for Bridge {}
// SAFETY: as above.
unsafe impl Sync for Bridge {}

fn round_up(n: usize, to: usize) -> usize {
    n.div_ceil(to) * to
}

impl Bridge {
    /// The segment name of communicator `comm` of job `job`: found by the launcher's cleanup
    /// (`ferrocx-<job>-` prefix), never parsed as a host-adaptor segment (no pid field).
    pub fn name_of(job: &str, comm: u64) -> String {
        format!("/ferrocx-{job}-bridge-{comm}")
    }

    /// Bytes of the control block of one rank.
    fn control_bytes(world: usize, depth: usize) -> usize {
        round_up(
            LINE * (1 + 2 * depth + C_DESC_LINES) + 16 * world + 2 * HANDLE_RECORD,
            PAGE,
        )
    }

    /// Creates (rank 0) or opens (others) the segment and attaches; returns once every rank of
    /// the job has attached, and the name is unlinked (so nothing is left in /dev/shm whatever
    /// happens next).
    pub fn attach(
        name: &str,
        topo: Topology,
        depth: usize,
        slot_bytes: usize,
        timeout: Duration,
    ) -> Result<Bridge, HeteroError> {
        let world = topo.world();
        let me = topo.me;
        let slot_bytes = round_up(slot_bytes, PAGE);
        let control = Self::control_bytes(world, depth);
        let stride = control + (depth + 1) * slot_bytes;
        let len = HEADER + world * stride;
        let cname = CString::new(name)
            .map_err(|_| HeteroError::Bridge(format!("segment name {name:?} has a NUL")))?;
        let deadline = Instant::now() + timeout;
        let fd = if me == 0 {
            create(&cname, len)?
        } else {
            open(&cname, len, deadline, name)?
        };
        // SAFETY: a fresh shared mapping of an fd we own, of the size the segment has.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            )
        };
        // SAFETY: our descriptor; the mapping (if any) keeps the memory.
        unsafe { libc::close(fd) };
        if base == libc::MAP_FAILED {
            let e = io::Error::last_os_error();
            if me == 0 {
                // SAFETY: a NUL-terminated name.
                unsafe { libc::shm_unlink(cname.as_ptr()) };
            }
            return Err(HeteroError::Bridge(format!(
                "mmap of {name} ({len} bytes): {e}"
            )));
        }
        let bridge = Bridge {
            base: base.cast(),
            len,
            world,
            depth,
            slot_bytes,
            control,
            stride,
            name: cname,
            timeout,
            topo,
        };
        if me == 0 {
            bridge
                .u64_at(H_WORLD)
                .store(world as u64, Ordering::Relaxed);
            bridge
                .u64_at(H_DEPTH)
                .store(depth as u64, Ordering::Relaxed);
            bridge
                .u64_at(H_SLOT)
                .store(slot_bytes as u64, Ordering::Relaxed);
            bridge.u64_at(H_MAGIC).store(MAGIC, Ordering::Release);
        } else {
            bridge.wait_header(deadline)?;
        }
        bridge.pid(me).store(std::process::id(), Ordering::Release);
        bridge.u64_at(H_ATTACHED).fetch_add(1, Ordering::AcqRel);
        let all = bridge.wait_all_attached(deadline);
        if me == 0 || all.is_err() {
            // SAFETY: a NUL-terminated name; ENOENT (someone else unlinked it) is fine.
            unsafe { libc::shm_unlink(bridge.name.as_ptr()) };
        }
        all?;
        Ok(bridge)
    }

    fn wait_header(&self, deadline: Instant) -> Result<(), HeteroError> {
        while self.u64_at(H_MAGIC).load(Ordering::Acquire) != MAGIC {
            if Instant::now() > deadline {
                return Err(self.absent(0, "the bridge's creation"));
            }
            std::thread::sleep(Duration::from_micros(100));
        }
        let (w, d, s) = (
            self.u64_at(H_WORLD).load(Ordering::Relaxed),
            self.u64_at(H_DEPTH).load(Ordering::Relaxed),
            self.u64_at(H_SLOT).load(Ordering::Relaxed),
        );
        if (w, d, s) != (self.world as u64, self.depth as u64, self.slot_bytes as u64) {
            return Err(HeteroError::Bridge(format!(
                "the bridge of rank 0 has world {w}, depth {d}, slots of {s} bytes; this rank \
                 expects {}, {}, {}: every rank must read the same [bridge] and clusters",
                self.world, self.depth, self.slot_bytes
            )));
        }
        Ok(())
    }

    fn wait_all_attached(&self, deadline: Instant) -> Result<(), HeteroError> {
        loop {
            if self.u64_at(H_ATTACHED).load(Ordering::Acquire) >= self.world as u64 {
                return Ok(());
            }
            if Instant::now() > deadline {
                let missing = (0..self.world)
                    .find(|&r| self.pid(r).load(Ordering::Acquire) == 0)
                    .unwrap_or(0);
                return Err(self.absent(missing, "the bridge's attach"));
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }

    /// The world.
    pub fn world(&self) -> usize {
        self.world
    }
    /// Pipeline slots per rank.
    pub fn depth(&self) -> usize {
        self.depth
    }
    /// Bytes of one staging slot.
    pub fn slot_bytes(&self) -> usize {
        self.slot_bytes
    }
    /// The topology the bridge names ranks with.
    pub fn topo(&self) -> &Topology {
        &self.topo
    }

    fn u64_at(&self, off: usize) -> &AtomicU64 {
        debug_assert!(off + 8 <= self.len && off % 8 == 0);
        // SAFETY: inside the mapping, 8-aligned (the mapping is page-aligned); the segment
        // lives as long as `self`; shared words are only accessed atomically.
        unsafe { &*self.base.add(off).cast::<AtomicU64>() }
    }

    fn rank_base(&self, r: usize) -> usize {
        HEADER + r * self.stride
    }

    fn pid(&self, r: usize) -> &AtomicU32 {
        // SAFETY: as `u64_at`, 4-aligned.
        unsafe { &*self.base.add(self.rank_base(r) + C_PID).cast::<AtomicU32>() }
    }

    /// `arrive[r][slot]`: the latest epoch rank r published in `slot`, plus one.
    pub fn arrive(&self, r: usize, slot: usize) -> &AtomicU64 {
        self.u64_at(self.rank_base(r) + C_ARRIVE + slot * LINE)
    }

    /// `done[r][slot]`: reads of rank r's `slot` that have finished.
    pub fn done(&self, r: usize, slot: usize) -> &AtomicU64 {
        self.u64_at(self.rank_base(r) + C_ARRIVE + (self.depth + slot) * LINE)
    }

    /// Word `i` (< 4) of rank r's call descriptor of `parity`.
    fn desc(&self, r: usize, parity: usize, i: usize) -> &AtomicU64 {
        self.u64_at(self.rank_base(r) + C_ARRIVE + (2 * self.depth + parity) * LINE + 8 * i)
    }

    /// Chunks rank `from` sent to rank `to` through its p2p slot.
    pub fn p2p_sent(&self, from: usize, to: usize) -> &AtomicU64 {
        self.u64_at(self.rank_base(from) + LINE * (1 + 2 * self.depth + C_DESC_LINES) + 8 * to)
    }

    /// Chunks rank `to` finished reading from rank `from`'s p2p slot.
    pub fn p2p_acked(&self, to: usize, from: usize) -> &AtomicU64 {
        self.u64_at(
            self.rank_base(to)
                + LINE * (1 + 2 * self.depth + C_DESC_LINES)
                + 8 * (self.world + from),
        )
    }

    /// Rank r's buffer handle record of call parity `parity`.
    fn handle_record(&self, r: usize, parity: usize) -> *mut u8 {
        let at = self.rank_base(r)
            + LINE * (1 + 2 * self.depth + C_DESC_LINES)
            + 16 * self.world
            + parity * HANDLE_RECORD;
        // SAFETY: inside rank r's control block (`control_bytes` counts both records).
        unsafe { self.base.add(at) }
    }

    /// Sets this rank's buffer handle of call `call` (empty: none), for the ranks that read
    /// its input where it lies. Written before the call's descriptor is published
    /// ([`Bridge::check_call`]), so a rank that has seen the descriptor reads the handle;
    /// rewritten two calls later, once every rank is past this call's first step. A handle
    /// longer than [`MAX_HANDLE`] is refused (`false`; the caller publishes its data instead).
    pub fn set_handle(&self, call: u64, handle: &[u8]) -> bool {
        if handle.len() > MAX_HANDLE {
            return false;
        }
        let rec = self.handle_record(self.topo.me, (call % 2) as usize);
        // SAFETY: the record holds 8 + MAX_HANDLE bytes and is this rank's to write until its
        // descriptor is published; nobody reads it before that (the descriptor's release
        // orders these writes).
        unsafe {
            std::ptr::copy_nonoverlapping((handle.len() as u64).to_ne_bytes().as_ptr(), rec, 8);
            std::ptr::copy_nonoverlapping(handle.as_ptr(), rec.add(8), handle.len());
        }
        true
    }

    /// Rank r's buffer handle of call `call` (empty: none); read after [`Bridge::check_call`]
    /// returned for the call.
    pub fn handle(&self, r: usize, call: u64) -> Vec<u8> {
        let rec = self.handle_record(r, (call % 2) as usize);
        let mut len = [0u8; 8];
        // SAFETY: the record's 8 + MAX_HANDLE bytes lie in the mapping; rank r wrote them
        // before publishing the descriptor this rank has acquired.
        unsafe { std::ptr::copy_nonoverlapping(rec, len.as_mut_ptr(), 8) };
        let len = (u64::from_ne_bytes(len) as usize).min(MAX_HANDLE);
        let mut h = vec![0u8; len];
        // SAFETY: as above, `len` <= MAX_HANDLE bytes after the length.
        unsafe { std::ptr::copy_nonoverlapping(rec.add(8), h.as_mut_ptr(), len) };
        h
    }

    /// The address of rank r's staging `slot` (`slot == depth`: its p2p slot).
    pub fn slot(&self, r: usize, slot: usize) -> *mut u8 {
        debug_assert!(slot <= self.depth);
        // SAFETY: inside the mapping.
        unsafe {
            self.base
                .add(self.rank_base(r) + self.control + slot * self.slot_bytes)
        }
    }

    /// The rank named with its cluster: `rank 3 (cluster "cpu")`.
    pub fn who(&self, r: usize) -> String {
        self.topo.who(r)
    }

    fn absent(&self, r: usize, what: &str) -> HeteroError {
        HeteroError::Absent {
            rank: r,
            cluster: self.topo.cluster_name_of(r).to_string(),
            what: what.to_string(),
            waited: self.timeout,
        }
    }

    /// The failure another rank recorded, if one.
    ///
    /// The recording rank claims the record before it writes the text: a reader that finds it
    /// claimed waits (briefly: the text is a copy of at most 1024 bytes) until the text is
    /// published, so that it never reports an empty message. If the recorder died in between,
    /// the failure is reported without its text after 200 ms.
    pub fn failure(&self) -> Option<HeteroError> {
        let failed = self.u64_at(H_FAILED).load(Ordering::Acquire);
        if failed == 0 {
            return None;
        }
        let rank = (failed - 1) as usize;
        let published = || match self.u64_at(H_TEXT_LEN).load(Ordering::Acquire) {
            0 => None,
            n => Some((n as usize - 1).min(TEXT)),
        };
        let start = Instant::now();
        let len = loop {
            if let Some(len) = published() {
                break Some(len);
            }
            if start.elapsed() >= TEXT_WAIT {
                break None;
            }
            std::thread::yield_now();
        };
        let message = match len {
            Some(len) => {
                let mut text = vec![0u8; len];
                // SAFETY: the text area lies in the header; written once, before its length
                // was published (Release), which the load above acquired.
                unsafe {
                    std::ptr::copy_nonoverlapping(self.base.add(H_TEXT), text.as_mut_ptr(), len)
                };
                String::from_utf8_lossy(&text).into_owned()
            }
            None => format!(
                "{} recorded a failure of the job but not its message",
                self.who(rank)
            ),
        };
        Some(HeteroError::PeerFailed {
            rank,
            cluster: self.topo.cluster_name_of(rank).to_string(),
            message,
        })
    }

    /// Notes that this rank's bridge step of `epoch` failed (its later steps do not run): the
    /// rank's later in-cluster stages gather its share unreduced, so every rank that took part
    /// in that epoch must not report its call done ([`Bridge::failed_step`]). The earliest such
    /// step is kept.
    pub fn mark_failed_step(&self, epoch: u64) {
        let me = (self.topo.me as u64).min(0xffff);
        let word = ((epoch << 16) | me) + 1;
        let _ =
            self.u64_at(H_FAILED_STEP)
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |cur| {
                    (cur == 0 || word < cur).then_some(word)
                });
    }

    /// The earliest failed bridge step of the job, as (epoch, rank), if one.
    pub fn failed_step(&self) -> Option<(u64, usize)> {
        match self.u64_at(H_FAILED_STEP).load(Ordering::Acquire) {
            0 => None,
            w => Some(((w - 1) >> 16, ((w - 1) & 0xffff) as usize)),
        }
    }

    /// Records `e` (about rank `r`) as the job's failure, unless one is recorded already.
    pub fn record_failure(&self, r: usize, e: &HeteroError) {
        if self
            .u64_at(H_FAILED)
            .compare_exchange(0, r as u64 + 1, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            let text = e.to_string();
            let bytes = &text.as_bytes()[..text.len().min(TEXT)];
            // SAFETY: the text area lies in the header; only the winner of the exchange
            // writes it, before publishing its length.
            unsafe {
                std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.base.add(H_TEXT), bytes.len())
            };
            // The length plus one: 0 means "not yet written" to a reader (see `failure`).
            self.u64_at(H_TEXT_LEN)
                .store(bytes.len() as u64 + 1, Ordering::Release);
        }
    }

    /// `true` unless rank r's process is known to be gone.
    pub fn alive(&self, r: usize) -> bool {
        let pid = self.pid(r).load(Ordering::Acquire);
        if pid == 0 {
            return true;
        }
        // SAFETY: signal 0 only checks that the process exists.
        if unsafe { libc::kill(pid as i32, 0) } == 0 {
            return true;
        }
        io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
    }

    /// The deadline of a wait on a peer.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The error for rank r not arriving at `what`: it died, or it is late.
    pub fn absent_or_dead(&self, r: usize, what: &str) -> HeteroError {
        match self.first_dead() {
            Some(d) => HeteroError::Died {
                rank: d,
                cluster: self.topo.cluster_name_of(d).to_string(),
                what: what.to_string(),
            },
            None => self.absent(r, what),
        }
    }

    /// The first rank whose process is gone, if one.
    pub fn first_dead(&self) -> Option<usize> {
        (0..self.world).find(|&r| !self.alive(r))
    }

    /// Stores `value` in `word` (a signal word of this rank's) and wakes the ranks asleep on
    /// it, if any.
    pub fn publish(&self, word: &AtomicU64, value: u64) {
        word.store(value, Ordering::SeqCst);
        self.wake(word);
    }

    /// Adds one to `word` (a signal word of another rank's) and wakes the ranks asleep on it,
    /// if any.
    pub fn add_one(&self, word: &AtomicU64) {
        word.fetch_add(1, Ordering::SeqCst);
        self.wake(word);
    }

    /// Wakes the sleepers of `word` when any rank sleeps: a sleeper counts itself before it
    /// looks at its word a last time, and the writer looks at the count after its store (both
    /// sequentially consistent), so one of the two sees the other.
    fn wake(&self, word: &AtomicU64) {
        if self.u64_at(H_SLEEPERS).load(Ordering::SeqCst) > 0 {
            crate::futex::wake_low(word);
        }
    }

    /// Waits until `word` (of rank `whom`) reaches `target`, for `what`: spins briefly, then
    /// sleeps on the word (woken by [`Bridge::publish`] and [`Bridge::add_one`]), looking at
    /// the failure word and the awaited rank's process every few milliseconds.
    pub fn wait(
        &self,
        word: &AtomicU64,
        target: u64,
        whom: usize,
        what: &str,
    ) -> Result<(), HeteroError> {
        if word.load(Ordering::Acquire) >= target {
            return Ok(());
        }
        for _ in 0..2_000 {
            std::hint::spin_loop();
            if word.load(Ordering::Acquire) >= target {
                return Ok(());
            }
        }
        let start = Instant::now();
        let mut last_check = start;
        let sleepers = self.u64_at(H_SLEEPERS);
        loop {
            sleepers.fetch_add(1, Ordering::SeqCst);
            let seen = word.load(Ordering::SeqCst);
            if seen < target {
                crate::futex::wait_low(word, seen, Duration::from_millis(2));
            }
            sleepers.fetch_sub(1, Ordering::SeqCst);
            if word.load(Ordering::Acquire) >= target {
                return Ok(());
            }
            let now = Instant::now();
            if now.duration_since(last_check) >= Duration::from_millis(5) {
                last_check = now;
                if let Some(e) = self.failure() {
                    super::ring::dump(&format!("{what}: {e}"));
                    return Err(e);
                }
                let dead = if self.alive(whom) {
                    self.first_dead()
                } else {
                    Some(whom)
                };
                if dead.is_some() || now.duration_since(start) >= self.timeout {
                    let e = self.absent_or_dead(dead.unwrap_or(whom), what);
                    let about = match &e {
                        HeteroError::Died { rank, .. } => *rank,
                        _ => whom,
                    };
                    self.record_failure(about, &e);
                    super::ring::dump(&format!(
                        "waiting on rank {whom} for {what} (word at {target} wanted, {} seen)",
                        word.load(Ordering::Acquire)
                    ));
                    return Err(e);
                }
            }
        }
    }

    /// Publishes this rank's descriptor of call `call` and checks it against every rank's:
    /// a barrier of the job. A mismatch gives the same error on every rank (the lowest rank
    /// that differs from rank 0, and rank 0).
    pub fn check_call(
        &self,
        call: u64,
        mine: Descriptor,
        describe: &dyn Fn(Descriptor) -> String,
    ) -> Result<(), HeteroError> {
        let me = self.topo.me;
        let parity = (call % 2) as usize;
        self.desc(me, parity, 1)
            .store(mine.count, Ordering::Relaxed);
        self.desc(me, parity, 2).store(mine.kind, Ordering::Relaxed);
        self.publish(self.desc(me, parity, 0), call + 1);
        let mut all = Vec::with_capacity(self.world);
        for r in 0..self.world {
            self.wait(self.desc(r, parity, 0), call + 1, r, "a collective")?;
            all.push(Descriptor {
                count: self.desc(r, parity, 1).load(Ordering::Relaxed),
                kind: self.desc(r, parity, 2).load(Ordering::Relaxed),
            });
        }
        if let Some(r) = (1..self.world).find(|&r| all[r] != all[0]) {
            // Bits 24..31 of the kind: the all-reduce's plan (see the hetero module).
            let plan_only =
                all[r].count == all[0].count && (all[r].kind ^ all[0].kind) & !(0xff << 24) == 0;
            let rule = if plan_only {
                "every rank must take the same all-reduce plan (FERROCX_BRIDGE_PLAN and \
                 FERROCX_BRIDGE_DIRECT the same on every rank)"
            } else {
                "every rank of every cluster must call the same collective with the same \
                 count and dtype"
            };
            return Err(HeteroError::Mismatch(format!(
                "{} called {} but {} called {}: {rule}",
                self.who(0),
                describe(all[0]),
                self.who(r),
                describe(all[r])
            )));
        }
        Ok(())
    }
}

impl Drop for Bridge {
    fn drop(&mut self) {
        // SAFETY: our mapping, unused from here on (the communicator's streams are drained
        // before its bridge is dropped).
        unsafe { libc::munmap(self.base.cast(), self.len) };
    }
}

fn create(name: &CString, len: usize) -> Result<libc::c_int, HeteroError> {
    let open = || {
        // SAFETY: a NUL-terminated name; O_EXCL makes it a new segment.
        unsafe {
            libc::shm_open(
                name.as_ptr(),
                libc::O_RDWR | libc::O_CREAT | libc::O_EXCL | libc::O_CLOEXEC,
                0o600 as libc::mode_t,
            )
        }
    };
    let mut fd = open();
    if fd < 0 && io::Error::last_os_error().raw_os_error() == Some(libc::EEXIST) {
        // Left by an earlier job of the same id whose rank 0 died before unlinking it.
        tracing::warn!(segment = %name.to_string_lossy(), "removing a stale bridge segment");
        // SAFETY: a NUL-terminated name.
        unsafe { libc::shm_unlink(name.as_ptr()) };
        fd = open();
    }
    if fd < 0 {
        return Err(HeteroError::Bridge(format!(
            "shm_open({}): {}",
            name.to_string_lossy(),
            io::Error::last_os_error()
        )));
    }
    // SAFETY: our descriptor; the size fits off_t on 64-bit Linux.
    if unsafe { libc::ftruncate(fd, len as libc::off_t) } != 0 {
        let e = io::Error::last_os_error();
        // SAFETY: our descriptor and name.
        unsafe {
            libc::close(fd);
            libc::shm_unlink(name.as_ptr());
        }
        return Err(HeteroError::Bridge(format!(
            "sizing the bridge segment to {len} bytes: {e}"
        )));
    }
    Ok(fd)
}

fn open(
    name: &CString,
    len: usize,
    deadline: Instant,
    shown: &str,
) -> Result<libc::c_int, HeteroError> {
    loop {
        // SAFETY: a NUL-terminated name; no O_CREAT.
        let fd = unsafe { libc::shm_open(name.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC, 0) };
        if fd >= 0 {
            let mut st = std::mem::MaybeUninit::<libc::stat>::zeroed();
            // SAFETY: our descriptor and a stat buffer.
            let ok = unsafe { libc::fstat(fd, st.as_mut_ptr()) } == 0;
            // SAFETY: fstat filled it (zeroed before).
            let size = unsafe { st.assume_init() }.st_size as usize;
            if ok && size >= len {
                return Ok(fd);
            }
            // SAFETY: our descriptor.
            unsafe { libc::close(fd) };
        }
        if Instant::now() > deadline {
            return Err(HeteroError::Bridge(format!(
                "the bridge segment {shown} did not appear (rank 0 of the job never made it)"
            )));
        }
        std::thread::sleep(Duration::from_micros(200));
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::config::Config;

    /// A bridge of one rank (rank 0 of a one-cluster job), its segment named for this test.
    fn one_rank_bridge(tag: &str) -> Bridge {
        let text = "[[cluster]]\nname = \"a\"\nranks = \"0\"\ndevice = \"host\"\nccl = \"host\"\n";
        let config = Config::parse(text, Path::new("t.toml")).expect("config");
        let topo = Topology::new(&config, 1, 0).expect("topology");
        let name = Bridge::name_of(&format!("unit-{}-{tag}", std::process::id()), 0);
        Bridge::attach(&name, topo, 1, 4096, Duration::from_secs(5)).expect("attach")
    }

    #[test]
    fn buffer_handles_read_back_by_call_parity_and_a_long_one_is_refused() {
        let b = one_rank_bridge("handles");
        assert!(b.set_handle(4, b"handle of call four"));
        assert!(b.set_handle(5, b""));
        assert_eq!(b.handle(0, 4), b"handle of call four");
        assert!(b.handle(0, 5).is_empty());
        // Call 6 rewrites call 4's record (same parity), in full.
        assert!(b.set_handle(6, b"six"));
        assert_eq!(b.handle(0, 6), b"six");
        let long = vec![7u8; MAX_HANDLE + 1];
        assert!(
            !b.set_handle(8, &long),
            "a handle past the record is refused"
        );
        assert_eq!(b.handle(0, 8), b"six", "and leaves the record as it was");
        let longest = vec![9u8; MAX_HANDLE];
        assert!(b.set_handle(8, &longest));
        assert_eq!(b.handle(0, 8), longest);
        assert!(b.handle(0, 9).is_empty());
    }

    #[test]
    fn a_recorded_failure_reads_back_with_its_text() {
        let b = one_rank_bridge("recorded");
        assert!(b.failure().is_none());
        b.record_failure(0, &HeteroError::Bridge("the first one".into()));
        b.record_failure(0, &HeteroError::Bridge("a later one".into()));
        let e = b.failure().expect("a failure").to_string();
        assert!(e.contains("the first one"), "{e}");
    }

    /// The record is claimed before its text is written: a reader in between waits for the
    /// text instead of reporting an empty message, and names the rank if the text never comes.
    #[test]
    fn a_failure_read_while_it_is_being_recorded_is_never_empty() {
        let b = one_rank_bridge("racing");
        b.u64_at(H_FAILED).store(1, Ordering::Release);
        std::thread::scope(|s| {
            s.spawn(|| {
                std::thread::sleep(Duration::from_millis(30));
                let text = b"rank 0 (cluster \"a\") died before a collective";
                // SAFETY: the header's text area, written by this thread only.
                unsafe {
                    std::ptr::copy_nonoverlapping(text.as_ptr(), b.base.add(H_TEXT), text.len())
                };
                b.u64_at(H_TEXT_LEN)
                    .store(text.len() as u64 + 1, Ordering::Release);
            });
            let e = b.failure().expect("a failure").to_string();
            assert_eq!(e, "rank 0 (cluster \"a\") died before a collective");
        });
        let silent = one_rank_bridge("silent");
        silent.u64_at(H_FAILED).store(1, Ordering::Release);
        let start = Instant::now();
        let e = silent.failure().expect("a failure").to_string();
        assert!(start.elapsed() >= TEXT_WAIT, "it waited for the text");
        assert!(
            e.contains("rank 0 (cluster \"a\") recorded a failure of the job but not its message"),
            "{e}"
        );
    }
}
