//! The host backend: the algorithms in Rust, run in stream order by the host device's
//! `launch_host_func` (the call returns at once; the stream's worker runs the algorithm when
//! the work enqueued before it is done, as a CUDA kernel would).
//!
//! A host function cannot return an error, so a failure (a peer that does not signal within
//! the communicator's timeout) is kept here: the next window call and the communicator's
//! `synchronize` report it, and the calls enqueued after it do nothing (their rounds would be
//! out of step with the peers').

pub(crate) mod algo;

use std::ffi::{c_void, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use ferrocx::abi::Stream;
use ferrocx::adaptor::Device;
use ferrocx::window::collectives::{CollectiveError, WindowAlgo};

use algo::{Call, Ctx, Gather};

/// Polls before yielding when every rank can have a core.
const SPIN: u32 = 4_000;
/// Polls before yielding when ranks outnumber cores: a spinning rank would hold the core a
/// peer needs to arrive.
const SPIN_OVERSUBSCRIBED: u32 = 32;

/// The host backend of one communicator.
pub(crate) struct Host {
    shared: Arc<Shared>,
    device: Device,
}

struct Shared {
    ctx: Ctx,
    failed: AtomicBool,
    error: Mutex<Option<CollectiveError>>,
}

impl Shared {
    fn fail(&self, e: CollectiveError) {
        let mut slot = self.error.lock().unwrap_or_else(|p| p.into_inner());
        if slot.is_none() {
            tracing::error!("{e}");
            *slot = Some(e);
        }
        self.failed.store(true, Ordering::Release);
    }
}

/// One enqueued call.
/// What a task runs.
enum Job {
    /// An all-reduce with its algorithm.
    AllReduce(WindowAlgo, Call),
    /// An all-gather.
    AllGather(Gather),
}

struct Task {
    shared: Arc<Shared>,
    job: Job,
    epoch: u64,
}

impl Task {
    fn run(self) {
        let shared = &self.shared;
        if shared.failed.load(Ordering::Acquire) {
            return;
        }
        let ctx = &shared.ctx;
        let outcome = catch_unwind(AssertUnwindSafe(|| {
            // SAFETY: the caller of `all_reduce` keeps its buffers valid until the stream
            // reaches this call (the contract of every enqueued collective); the scratch
            // windows stay mapped while `shared` lives; every rank enqueues the same rounds.
            unsafe {
                match &self.job {
                    Job::AllReduce(WindowAlgo::OneShot, call) => {
                        algo::one_shot(ctx, call, self.epoch)
                    }
                    Job::AllReduce(WindowAlgo::TwoShot, call) => {
                        algo::two_shot(ctx, call, self.epoch)
                    }
                    Job::AllReduce(WindowAlgo::Ring, call) => algo::ring(ctx, call, self.epoch),
                    Job::AllGather(call) => algo::all_gather(ctx, call, self.epoch),
                }
            }
        }));
        match outcome {
            Ok(Ok(())) => {}
            Ok(Err(e)) => shared.fail(e),
            Err(panic) => shared.fail(CollectiveError::Failed {
                algo: match self.job {
                    Job::AllReduce(algo, _) => algo,
                    Job::AllGather(_) => WindowAlgo::OneShot,
                },
                message: format!("panicked: {}", panic_message(&panic)),
            }),
        }
    }
}

fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(no message)".into())
}

/// The host function: runs the task `launch` boxed.
unsafe extern "C" fn run_task(user: *mut c_void) {
    // SAFETY: `user` is the box `launch` leaked, and the stream runs each host function once.
    let task = unsafe { Box::from_raw(user.cast::<Task>()) };
    // `Task::run` catches panics itself; none may cross this boundary.
    let _ = catch_unwind(AssertUnwindSafe(move || task.run()));
}

impl Host {
    /// The backend over scratch windows at `peers` (this process's addresses of every rank's).
    pub(crate) fn new(
        device: Device,
        layout: crate::layout::Layout,
        rank: usize,
        peers: Vec<u64>,
        timeout: std::time::Duration,
    ) -> Host {
        let world = peers.len();
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let spin = if world > cores {
            SPIN_OVERSUBSCRIBED
        } else {
            SPIN
        };
        Host {
            shared: Arc::new(Shared {
                ctx: Ctx {
                    layout,
                    rank,
                    world,
                    peers,
                    timeout,
                    spin,
                    yields: algo::YIELDS,
                },
                failed: AtomicBool::new(false),
                error: Mutex::new(None),
            }),
            device,
        }
    }

    /// Enqueues one call of `algo` from round `epoch` on `stream`.
    pub(crate) fn enqueue(
        &self,
        stream: Stream,
        algo: WindowAlgo,
        call: Call,
        epoch: u64,
    ) -> Result<(), CollectiveError> {
        self.enqueue_job(stream, Job::AllReduce(algo, call), epoch)
            .map_err(|message| CollectiveError::Failed { algo, message })
    }

    /// Enqueues the all-gather `call` of round `epoch` on `stream`.
    pub(crate) fn enqueue_all_gather(
        &self,
        stream: Stream,
        call: Gather,
        epoch: u64,
    ) -> Result<(), CollectiveError> {
        self.enqueue_job(stream, Job::AllGather(call), epoch)
            .map_err(|message| CollectiveError::Failed {
                algo: WindowAlgo::OneShot,
                message: format!("all-gather: {message}"),
            })
    }

    /// Enqueues `job` of round `epoch` as a host function on `stream`.
    fn enqueue_job(&self, stream: Stream, job: Job, epoch: u64) -> Result<(), String> {
        let task = Box::new(Task {
            shared: self.shared.clone(),
            job,
            epoch,
        });
        launch(&self.device, stream, task)
    }

    /// The first failure of a call already run, if one.
    pub(crate) fn check(&self) -> Result<(), CollectiveError> {
        if !self.shared.failed.load(Ordering::Acquire) {
            return Ok(());
        }
        let slot = self.shared.error.lock().unwrap_or_else(|p| p.into_inner());
        Err(slot.clone().unwrap_or(CollectiveError::Unavailable(
            "an earlier call failed".into(),
        )))
    }
}

/// Enqueues `task` on `stream` through the device's `launch_host_func`.
fn launch(device: &Device, stream: Stream, task: Box<Task>) -> Result<(), String> {
    let root = device.tables().root.get();
    let f = root.launch_host_func.ok_or_else(|| {
        format!(
            "the device adaptor `{}` has no launch_host_func",
            device.name()
        )
    })?;
    let user = Box::into_raw(task).cast::<c_void>();
    // SAFETY: a stream of this device, a function that matches `HostFn`, and a pointer the
    // function takes back exactly once.
    let status = unsafe { f(stream, Some(run_task), user) };
    if status.is_success() {
        return Ok(());
    }
    // SAFETY: the adaptor refused the call, so it never runs the function: the box is still
    // ours to free.
    drop(unsafe { Box::from_raw(user.cast::<Task>()) });
    let message = match root.get_last_error {
        // SAFETY: the entry takes nothing and returns null or a NUL-terminated string that
        // stays valid until the next call on this thread.
        Some(get) => match unsafe { get() } {
            p if p.is_null() => String::new(),
            // SAFETY: non-null and NUL-terminated, as above.
            p => unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned(),
        },
        None => String::new(),
    };
    Err(format!(
        "{}: launch_host_func failed with {status}: {message}",
        device.name()
    ))
}
