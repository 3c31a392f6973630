//! Calls across the ABI boundary, each failure observed on the way.
//!
//! Every call the kit makes goes through [`DeviceApi`] or [`CclApi`]: the safe handles of the
//! core for the entries they cover, the raw table (with a `// SAFETY:` line) for the others.
//! Each failure is recorded process-wide, so the end of a part can report whether any entry
//! panicked across the boundary (`INTERNAL_ERROR` with "panic" in its message) and whether
//! every failure left a message in `get_last_error`.

use std::ffi::{c_char, CStr};
use std::sync::{Mutex, MutexGuard};

use ferrocx::abi::{CclAdaptorV1, DeviceAdaptorV1, Status};
use ferrocx::adaptor::{AdaptorError, Ccl, Device};

use crate::report::Outcome;

/// The result of one call.
pub(crate) type Res<T> = Result<T, AdaptorError>;

/// Failures seen in this process.
#[derive(Default)]
struct Observed {
    /// `entry: message` of every failure whose message reports a panic.
    panics: Vec<String>,
    /// Entries that failed with an empty `get_last_error`.
    silent: Vec<String>,
    /// Number of failures seen.
    failures: usize,
}

fn observed() -> MutexGuard<'static, Observed> {
    static OBSERVED: Mutex<Observed> = Mutex::new(Observed {
        panics: Vec::new(),
        silent: Vec::new(),
        failures: 0,
    });
    OBSERVED.lock().unwrap_or_else(|p| p.into_inner())
}

/// `true` when a failure is a panic the adaptor caught at its boundary.
pub(crate) fn is_panic(status: Status, message: &str) -> bool {
    status == Status::INTERNAL_ERROR && message.to_ascii_lowercase().contains("panic")
}

/// Records a failure (absent entries are not failures).
fn observe(e: &AdaptorError) {
    if let AdaptorError::Failed {
        op,
        status,
        message,
        ..
    } = e
    {
        let mut o = observed();
        o.failures += 1;
        if is_panic(*status, message) {
            o.panics.push(format!("{op}: {message}"));
        }
        if message.trim().is_empty() {
            o.silent.push((*op).to_string());
        }
    }
}

/// Where the observations stood at the start of a part.
#[derive(Clone, Copy)]
pub(crate) struct Mark {
    panics: usize,
    silent: usize,
    failures: usize,
}

impl Mark {
    /// The observations so far.
    pub(crate) fn now() -> Mark {
        let o = observed();
        Mark {
            panics: o.panics.len(),
            silent: o.silent.len(),
            failures: o.failures,
        }
    }

    /// Whether an entry panicked across the boundary since the mark.
    pub(crate) fn panics_since(self) -> Outcome {
        let o = observed();
        let new = &o.panics[self.panics.min(o.panics.len())..];
        if new.is_empty() {
            return Outcome::Pass;
        }
        Outcome::Fail(format!(
            "{} call(s) returned INTERNAL_ERROR reporting a panic: {}",
            new.len(),
            shorten(&new.join("; "))
        ))
    }

    /// Whether every failure since the mark left a message in `get_last_error`.
    pub(crate) fn messages_since(self) -> Outcome {
        let o = observed();
        let failures = o.failures.saturating_sub(self.failures);
        let new = &o.silent[self.silent.min(o.silent.len())..];
        if failures == 0 {
            return Outcome::Skip("no call failed, so no message could be checked".into());
        }
        if new.is_empty() {
            return Outcome::Pass;
        }
        let mut names: Vec<&str> = new.iter().map(String::as_str).collect();
        names.dedup();
        Outcome::Fail(format!(
            "get_last_error was empty after {} of {failures} failed call(s): {}",
            new.len(),
            names.join(", ")
        ))
    }
}

/// Cuts a long reason to a readable length.
pub(crate) fn shorten(s: &str) -> String {
    const MAX: usize = 400;
    if s.len() <= MAX {
        return s.to_string();
    }
    let mut end = MAX;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

/// Why a check stopped early: the outcome it ends with.
#[derive(Debug)]
pub(crate) struct Stop(pub Outcome);

/// Result of a check body.
pub(crate) type Verdict = Result<(), Stop>;

/// Ends a check as failed.
pub(crate) fn fail(reason: impl Into<String>) -> Stop {
    Stop(Outcome::Fail(reason.into()))
}

/// Ends a check as skipped.
pub(crate) fn skip(reason: impl Into<String>) -> Stop {
    Stop(Outcome::Skip(reason.into()))
}

/// Fails unless `cond`.
pub(crate) fn ensure(cond: bool, reason: impl FnOnce() -> String) -> Verdict {
    if cond {
        Ok(())
    } else {
        Err(fail(reason()))
    }
}

impl From<AdaptorError> for Stop {
    /// An absent entry skips the check; `UNSUPPORTED` from a present entry fails it (the ABI has
    /// one way to say "not supported": an absent entry); any other failure fails it.
    fn from(e: AdaptorError) -> Stop {
        match &e {
            AdaptorError::Unsupported { op, .. } => Stop(Outcome::absent(&format!("`{op}`"))),
            AdaptorError::Failed {
                op,
                status: Status::UNSUPPORTED,
                message,
                ..
            } => fail(format!(
                "{op} returned UNSUPPORTED ({message}); an operation the adaptor does not \
                 support must be an absent entry"
            )),
            _ => fail(e.to_string()),
        }
    }
}

/// For entries that may depend on what the vendor runtime offers (probed at run time):
/// `UNSUPPORTED` skips the check instead of failing it.
pub(crate) fn optional<T>(r: Res<T>) -> Result<T, Stop> {
    match r {
        Err(AdaptorError::Failed {
            op,
            status: Status::UNSUPPORTED,
            message,
            ..
        }) => Err(skip(format!(
            "not supported at run time: {op} returned UNSUPPORTED ({message})"
        ))),
        r => r.map_err(Stop::from),
    }
}

/// Checks that a call made with a bad argument failed with one of `allowed`, with a message.
pub(crate) fn refused(what: &str, r: Res<()>, allowed: &[Status]) -> Verdict {
    let want = allowed
        .iter()
        .map(|s| s.to_string())
        .collect::<Vec<_>>()
        .join(" or ");
    match r {
        Ok(()) => Err(fail(format!("{what} succeeded; expected {want}"))),
        Err(AdaptorError::Unsupported { op, .. }) => Err(Stop(Outcome::absent(&format!("`{op}`")))),
        Err(AdaptorError::Failed {
            op,
            status,
            message,
            ..
        }) => {
            if !allowed.contains(&status) {
                return Err(fail(format!(
                    "{what}: {op} returned {status} ({message}); expected {want}"
                )));
            }
            ensure(!message.trim().is_empty(), || {
                format!("{what}: {op} returned {status} but get_last_error is empty")
            })
        }
    }
}

/// Reads `get_last_error`, tolerating its absence or a null return.
fn last_error(f: Option<unsafe extern "C" fn() -> *const c_char>) -> String {
    let Some(f) = f else {
        return "(the adaptor has no get_last_error)".to_string();
    };
    // SAFETY: the entry takes no argument and returns null or a NUL-terminated string valid until
    // the next call on this thread.
    let p = unsafe { f() };
    if p.is_null() {
        return String::new();
    }
    // SAFETY: non-null and NUL-terminated by the ABI's contract.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

/// `true` when `get_last_error` returns non-null (the ABI: "never null"); `None` when absent.
pub(crate) fn last_error_is_non_null(
    f: Option<unsafe extern "C" fn() -> *const c_char>,
) -> Option<bool> {
    // SAFETY: as in `last_error`.
    f.map(|f| !unsafe { f() }.is_null())
}

/// Calls a raw entry of a table: absent is `AdaptorError::Unsupported`, a failure status is
/// `AdaptorError::Failed` with the adaptor's message (observed).
macro_rules! raw_call {
    ($api:expr, $table:expr, $op:ident ( $($arg:expr),* $(,)? )) => {{
        match $table.$op {
            None => Err($api.absent(stringify!($op))),
            Some(f) => {
                // SAFETY: the table was checked by the loader; the kit passes arguments of the
                // entry's ABI signature: live handles of this adaptor, valid out-pointers and
                // buffers that outlive the call (asynchronous work is synchronised before the
                // buffers are dropped).
                let status = unsafe { f($($arg),*) };
                $api.status(stringify!($op), status)
            }
        }
    }};
}
pub(crate) use raw_call;

/// Like [`raw_call!`] but returns the raw status (for entries where `NOT_READY` is an answer).
macro_rules! raw_status {
    ($api:expr, $table:expr, $op:ident ( $($arg:expr),* $(,)? )) => {{
        match $table.$op {
            None => Err($api.absent(stringify!($op))),
            // SAFETY: as in `raw_call!`.
            Some(f) => Ok(unsafe { f($($arg),*) }),
        }
    }};
}
pub(crate) use raw_status;

/// The device adaptor, every call observed.
#[derive(Clone)]
pub(crate) struct DeviceApi {
    /// The safe handle.
    pub dev: Device,
}

impl DeviceApi {
    pub(crate) fn new(dev: &Device) -> DeviceApi {
        DeviceApi { dev: dev.clone() }
    }

    /// The root table.
    pub(crate) fn root(&self) -> &DeviceAdaptorV1 {
        self.dev.tables().root.get()
    }

    /// An absent entry.
    pub(crate) fn absent(&self, op: &'static str) -> AdaptorError {
        AdaptorError::Unsupported {
            adaptor: self.dev.name().to_string(),
            op,
        }
    }

    /// `Ok` for success, else the failure with the adaptor's message (observed).
    pub(crate) fn status(&self, op: &'static str, status: Status) -> Res<()> {
        if status.is_success() {
            return Ok(());
        }
        Err(self.failure(op, status))
    }

    /// The failure of `op` with `status` and the adaptor's message (observed).
    pub(crate) fn failure(&self, op: &'static str, status: Status) -> AdaptorError {
        let e = AdaptorError::Failed {
            adaptor: self.dev.name().to_string(),
            op,
            status,
            message: last_error(self.root().get_last_error),
        };
        observe(&e);
        e
    }

    /// Observes the result of a call through the safe handle.
    pub(crate) fn seen<T>(&self, r: Res<T>) -> Res<T> {
        if let Err(e) = &r {
            observe(e);
        }
        r
    }
}

/// The CCL adaptor, every call observed.
#[derive(Clone)]
pub(crate) struct CclApi {
    /// The safe handle.
    pub ccl: Ccl,
}

impl CclApi {
    pub(crate) fn new(ccl: &Ccl) -> CclApi {
        CclApi { ccl: ccl.clone() }
    }

    /// The root table.
    pub(crate) fn root(&self) -> &CclAdaptorV1 {
        self.ccl.tables().root.get()
    }

    /// An absent entry.
    pub(crate) fn absent(&self, op: &'static str) -> AdaptorError {
        AdaptorError::Unsupported {
            adaptor: self.ccl.name().to_string(),
            op,
        }
    }

    /// `Ok` for success, else the failure with the adaptor's message (observed).
    pub(crate) fn status(&self, op: &'static str, status: Status) -> Res<()> {
        if status.is_success() {
            return Ok(());
        }
        let e = AdaptorError::Failed {
            adaptor: self.ccl.name().to_string(),
            op,
            status,
            message: last_error(self.root().get_last_error),
        };
        observe(&e);
        Err(e)
    }

    /// Observes the result of a call through the safe handle.
    pub(crate) fn seen<T>(&self, r: Res<T>) -> Res<T> {
        if let Err(e) = &r {
            observe(e);
        }
        r
    }
}
