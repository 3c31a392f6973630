//! The process's MPI: the library, its initialisation (thread level asked for and checked), the
//! lock every MPI call is made under, and waits on requests with a deadline.

use std::ffi::c_int;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use ferrocx_plugin_sdk::prelude::*;

use crate::library::{self, Abi, MpiLib, H};

/// The thread levels by index (the ABIs give them different values).
const LEVELS: [&str; 4] = ["SINGLE", "FUNNELED", "SERIALIZED", "MULTIPLE"];

/// The process's MPI, once `init` succeeded.
pub(crate) struct Mpi {
    pub lib: MpiLib,
    pub world_rank: i32,
    pub world_size: i32,
    /// This adaptor called `MPI_Init_thread` (and so calls `MPI_Finalize`).
    pub owns_init: bool,
    /// Set once a request was left pending (a timeout, an abort): `MPI_Finalize` could wait
    /// for it forever, so it is skipped.
    pub tainted: AtomicBool,
    /// `MPI_Finalize` was called.
    pub finalized: AtomicBool,
    /// Operations enqueued and not completed, over every communicator.
    pub active: AtomicUsize,
    /// The longest timeout of the communicators made (bounds the wait for MPI_Finalize at exit).
    pub longest_timeout_ms: AtomicU64,
}

static MPI: OnceLock<Mpi> = OnceLock::new();
static LOCK: Mutex<()> = Mutex::new(());

/// Every MPI call is made under this lock (the thread level is `MPI_THREAD_SERIALIZED`).
pub(crate) fn lock() -> MutexGuard<'static, ()> {
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

/// The initialised MPI, or `NOT_INITIALIZED`.
pub(crate) fn mpi() -> Result<&'static Mpi> {
    MPI.get().ok_or_else(|| {
        Error::new(
            Status::NOT_INITIALIZED,
            "the MPI CCL is not initialised (init was not called or failed)",
        )
    })
}

/// The index (0 single .. 3 multiple) of a thread level value of the library, if known.
fn level_index(lib: &MpiLib, v: c_int) -> Option<usize> {
    lib.c.thread.iter().position(|t| *t == v)
}

/// Checks the thread level the library provided against the one needed.
pub(crate) fn check_level(
    path: &str,
    needed: usize,
    provided: Option<usize>,
    raw: c_int,
) -> Result<()> {
    match provided {
        Some(p) if p >= needed => Ok(()),
        Some(p) => Err(Error::vendor(format!(
            "{path} provided the thread level MPI_THREAD_{}, below the MPI_THREAD_{} the MPI CCL \
             needs (its operations run on the host device's stream threads)",
            LEVELS[p], LEVELS[needed]
        ))),
        None => Err(Error::vendor(format!(
            "{path} provided the thread level {raw}, which is not a level of its ABI; \
             MPI_THREAD_{} is needed",
            LEVELS[needed]
        ))),
    }
}

/// Opens the library and initialises MPI (once per process).
pub(crate) fn init(options: &Options) -> Result<&'static Mpi> {
    if let Some(m) = MPI.get() {
        return Ok(m);
    }
    let _g = lock();
    if let Some(m) = MPI.get() {
        return Ok(m);
    }
    let explicit = options
        .get("library")
        .map(str::to_string)
        .or_else(|| std::env::var(library::ENV_LIBRARY).ok())
        .filter(|v| !v.trim().is_empty());
    let abi = options
        .get("abi")
        .map(Abi::parse)
        .transpose()
        .map_err(Error::invalid_argument)?;
    let needed = match options.get("thread_level").unwrap_or("serialized") {
        "serialized" => 2,
        "multiple" => 3,
        v => {
            return Err(Error::invalid_argument(format!(
                "thread_level = {v:?}: expected \"serialized\" or \"multiple\""
            )))
        }
    };
    let lib = library::load(explicit.as_deref(), abi).map_err(Error::vendor)?;
    let mut flag: c_int = 0;
    // SAFETY: MPI_Finalized and MPI_Initialized may be called at any time.
    unsafe {
        lib.api.finalized(&mut flag);
    }
    if flag != 0 {
        return Err(Error::vendor(format!(
            "{}: MPI was already finalised in this process",
            lib.path
        )));
    }
    // SAFETY: as above.
    unsafe {
        lib.api.initialized(&mut flag);
    }
    let owns_init = flag == 0;
    let mut provided: c_int = -1;
    if owns_init {
        // SAFETY: MPI is not initialised; null argc/argv are allowed.
        let rc = unsafe { lib.api.init_thread(lib.c.thread[needed], &mut provided) };
        if rc != 0 {
            return Err(Error::vendor(format!(
                "{}: MPI_Init_thread failed: {}",
                lib.path,
                lib.error_text(rc)
            )));
        }
    } else {
        // SAFETY: MPI is initialised.
        unsafe {
            lib.api.query_thread(&mut provided);
        }
    }
    check_level(&lib.path, needed, level_index(&lib, provided), provided)?;
    let (mut rank, mut size) = (0, 0);
    // SAFETY: MPI is initialised; the handles are the library's own constants.
    unsafe {
        lib.api
            .comm_set_errhandler(lib.c.comm_world, lib.c.errors_return);
        lib.api.comm_rank(lib.c.comm_world, &mut rank);
        lib.api.comm_size(lib.c.comm_world, &mut size);
    }
    // The launcher's rank must be a rank of this MPI world (a job started by another launcher,
    // or ranks of several `mpiexec`s, are separate MPI worlds).
    if let Ok(info) = ferrocx::bootstrap::RankInfo::from_env(|k| std::env::var(k).ok()) {
        if info.rank >= size as usize {
            return Err(Error::invalid_argument(format!(
                "rank {} of {} (from the launcher's variables) is outside the MPI world of {} \
                 ({size} rank{}): start every rank under that MPI's launcher (mpiexec -n {})",
                info.rank,
                info.world_size,
                lib.path,
                if size == 1 { "" } else { "s" },
                info.world_size
            )));
        }
    }
    tracing::debug!(library = %lib.path, abi = lib.abi.name(), version = %lib.version_text(), rank, size, "MPI initialised");
    let m = Mpi {
        lib,
        world_rank: rank,
        world_size: size,
        owns_init,
        tainted: AtomicBool::new(false),
        finalized: AtomicBool::new(false),
        active: AtomicUsize::new(0),
        longest_timeout_ms: AtomicU64::new(0),
    };
    let m = MPI.get_or_init(|| m);
    if m.owns_init {
        // A rank that exits without MPI_Finalize makes launchers (Hydra, Open MPI's) end the
        // whole job: finalise at exit, unless a request was left pending or work is queued.
        // SAFETY: registers a function of this library, run once at exit (or at unload).
        if unsafe { libc::atexit(finalize_at_exit) } != 0 {
            tracing::warn!("atexit failed: MPI_Finalize will not run at exit");
        }
    }
    Ok(m)
}

/// At exit: [`Mpi::finalize_bounded`], unless work is still queued.
extern "C" fn finalize_at_exit() {
    let Some(m) = MPI.get() else {
        return;
    };
    if m.active.load(Ordering::Acquire) != 0 {
        return;
    }
    if let Err(e) = m.finalize_bounded() {
        eprintln!("ferrocx: {}; exiting without it", e.message());
    }
}

impl Mpi {
    /// `MPI_Finalize`, if this adaptor initialised MPI and no request was left pending.
    pub fn finalize(&self) -> Result<()> {
        if !self.owns_init
            || self.tainted.load(Ordering::Acquire)
            || self.finalized.swap(true, Ordering::AcqRel)
        {
            return Ok(());
        }
        let _g = lock();
        // SAFETY: MPI is initialised and not finalised; no request of ours is pending.
        let rc = unsafe { self.lib.api.finalize() };
        self.check(rc, "MPI_Finalize")
    }

    /// [`Mpi::finalize`] (which waits for every process of the job) on a helper thread, given
    /// up after the longest timeout of this process's communicators (`TIMEOUT`): a peer that
    /// died or skipped it must not keep this process waiting.
    pub fn finalize_bounded(&'static self) -> Result<()> {
        let limit =
            Duration::from_millis(self.longest_timeout_ms.load(Ordering::Acquire).max(1000));
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::Builder::new()
            .name("ferrocx-mpi-finalize".into())
            .spawn(move || {
                let _ = tx.send(self.finalize());
            })
            .map_err(|e| Error::system("spawn the MPI_Finalize thread", e))?;
        match rx.recv_timeout(limit) {
            Ok(r) => r,
            Err(_) => Err(Error::new(
                Status::TIMEOUT,
                format!(
                    "MPI_Finalize did not return within {} ms (a peer is gone?)",
                    limit.as_millis()
                ),
            )),
        }
    }

    /// `Ok` for `MPI_SUCCESS`, else a vendor error naming the call and the library.
    pub fn check(&self, rc: c_int, what: &str) -> Result<()> {
        if rc == 0 {
            return Ok(());
        }
        Err(Error::vendor(format!(
            "{what} failed in {}: {}",
            self.lib.path,
            self.lib.error_text(rc)
        )))
    }
}

/// Why a wait ended early.
pub(crate) enum WaitEnd {
    /// The deadline passed.
    Timeout,
    /// The abort flag was raised.
    Aborted,
    /// `MPI_Test` failed (the library detected a failed peer).
    Failed(String),
}

/// Tests `reqs` until all are complete (`MPI_REQUEST_NULL`), the deadline passes, or `abort`
/// is raised. The lock is taken per round of tests, never held while waiting.
pub(crate) fn wait(
    m: &Mpi,
    reqs: &mut [H],
    deadline: Instant,
    abort: Option<&AtomicBool>,
) -> std::result::Result<(), WaitEnd> {
    let null = m.lib.c.request_null;
    let mut round: u32 = 0;
    loop {
        {
            let _g = lock();
            for r in reqs.iter_mut().filter(|r| **r != null) {
                let mut flag: c_int = 0;
                // SAFETY: `r` is a live request of this library.
                let rc = unsafe { m.lib.api.test(r, &mut flag) };
                if rc != 0 {
                    m.tainted.store(true, Ordering::Release);
                    return Err(WaitEnd::Failed(m.lib.error_text(rc)));
                }
                if flag != 0 {
                    *r = null;
                }
            }
        }
        if reqs.iter().all(|r| *r == null) {
            return Ok(());
        }
        if abort.is_some_and(|a| a.load(Ordering::Acquire)) {
            m.tainted.store(true, Ordering::Release);
            return Err(WaitEnd::Aborted);
        }
        if Instant::now() >= deadline {
            m.tainted.store(true, Ordering::Release);
            return Err(WaitEnd::Timeout);
        }
        // MPI progresses only inside its calls: test often at first, then back off to sleeps
        // of at most 200 µs (a long wait costs little CPU, a short one little latency).
        round = round.saturating_add(1);
        if round < 32 {
            std::hint::spin_loop();
        } else if round < 2048 {
            std::thread::yield_now();
        } else {
            let us = u64::from((round - 2048).min(190)) + 10;
            std::thread::sleep(Duration::from_micros(us));
        }
    }
}
