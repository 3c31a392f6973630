//! Finding libnccl, resolving its entry points and probing the optional ones.
//!
//! The library is opened once per successful `init` and never unloaded (DESIGN: libraries are
//! never unloaded), so the resolved function pointers stay valid for the life of the process.

use std::ffi::{c_char, CStr};

use ferrocx_plugin_sdk::prelude::*;
use libloading::Library;

use crate::sys;

/// Environment variable naming the libnccl to load (after the `library` option).
pub const LIBRARY_ENV: &str = "FERROCX_NCCL_LIBRARY";
/// File names tried, in order, when neither the option nor the variable names a library.
pub const DEFAULT_LIBRARIES: [&str; 2] = ["libnccl.so.2", "libnccl.so"];

/// Where the library to load comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Candidates {
    /// Named explicitly (the `library` option or [`LIBRARY_ENV`]): that file only, no fallback,
    /// so a misspelt path is an error rather than a silently different NCCL.
    Explicit { source: &'static str, path: String },
    /// The default file names, first that loads wins.
    Default,
}

impl Candidates {
    /// The candidates from the adaptor's options and the environment.
    pub fn from(options: &Options) -> Self {
        if let Some(p) = options.get("library").filter(|p| !p.is_empty()) {
            return Candidates::Explicit {
                source: "option `library`",
                path: p.to_string(),
            };
        }
        match std::env::var(LIBRARY_ENV) {
            Ok(p) if !p.is_empty() => Candidates::Explicit {
                source: "FERROCX_NCCL_LIBRARY",
                path: p,
            },
            _ => Candidates::Default,
        }
    }

    fn paths(&self) -> Vec<(String, &'static str)> {
        match self {
            Candidates::Explicit { source, path } => vec![(path.clone(), *source)],
            Candidates::Default => DEFAULT_LIBRARIES
                .iter()
                .map(|p| (p.to_string(), "default"))
                .collect(),
        }
    }
}

/// libnccl's entry points: the required ones resolved, the optional ones probed.
#[allow(non_snake_case)]
pub struct Api {
    /// Path (or file name) the library was opened from.
    pub path: String,
    /// `ncclGetVersion`'s code.
    pub version: i32,
    pub ncclGetUniqueId: sys::GetUniqueId,
    pub ncclCommInitRank: sys::CommInitRank,
    pub ncclCommFinalize: sys::CommOp,
    pub ncclCommDestroy: sys::CommOp,
    pub ncclCommAbort: sys::CommOp,
    pub ncclCommGetAsyncError: sys::CommGetAsyncError,
    pub ncclCommCount: sys::CommQuery,
    pub ncclCommUserRank: sys::CommQuery,
    pub ncclCommCuDevice: sys::CommQuery,
    pub ncclAllReduce: sys::AllReduce,
    pub ncclAllGather: sys::AllGather,
    pub ncclReduceScatter: sys::ReduceScatter,
    pub ncclBroadcast: sys::Broadcast,
    pub ncclReduce: sys::Reduce,
    pub ncclSend: sys::Send,
    pub ncclRecv: sys::Recv,
    pub ncclGroupStart: sys::Group,
    pub ncclGroupEnd: sys::Group,
    pub ncclGetErrorString: sys::GetErrorString,
    pub ncclGetLastError: sys::GetLastError,
    pub ncclMemAlloc: Option<sys::MemAlloc>,
    pub ncclMemFree: Option<sys::MemFree>,
    pub ncclCommRegister: Option<sys::CommRegister>,
    pub ncclCommDeregister: Option<sys::CommDeregister>,
    /// Behind the window group's `window_register` (NCCL >= 2.27).
    pub ncclCommWindowRegister: Option<sys::CommWindowRegister>,
    /// Behind the window group's `window_deregister`.
    pub ncclCommWindowDeregister: Option<sys::CommWindowDeregister>,
    /// Probed and reported; not called (communicators are created with `ncclCommInitRank`).
    pub ncclCommInitRankConfig: Option<sys::CommInitRankConfig>,
}

/// The optional symbols, with the NCCL release that introduced each.
pub(crate) const OPTIONAL: [(&str, &str); 7] = [
    ("ncclMemAlloc", "2.19"),
    ("ncclMemFree", "2.19"),
    ("ncclCommRegister", "2.19"),
    ("ncclCommDeregister", "2.19"),
    ("ncclCommWindowRegister", "2.27"),
    ("ncclCommWindowDeregister", "2.27"),
    ("ncclCommInitRankConfig", "2.14"),
];

/// Looks up `name` in `lib` as a function pointer of type `T`.
///
/// # Safety
/// `T` must be the symbol's true C signature (a plain `unsafe extern "C" fn`).
unsafe fn sym<T: Copy>(lib: &'static Library, name: &str) -> Option<T> {
    let mut c = Vec::with_capacity(name.len() + 1);
    c.extend_from_slice(name.as_bytes());
    c.push(0);
    // SAFETY: by the caller's contract on `T`; the library is never unloaded ('static).
    unsafe { lib.get::<T>(&c).ok().map(|s| *s) }
}

/// Opens the first loadable candidate.
fn open(candidates: &Candidates) -> Result<(&'static Library, String)> {
    let mut tried = Vec::new();
    for (path, source) in candidates.paths() {
        // SAFETY: loading libnccl runs its initialisers, which are sound to run at any time;
        // the handle is leaked on purpose (never unloaded).
        match unsafe { Library::new(&path) } {
            Ok(lib) => return Ok((Box::leak(Box::new(lib)), path)),
            Err(e) => tried.push(format!("{path} ({source}): {e}")),
        }
    }
    Err(Error::new(
        Status::UNSUPPORTED,
        format!(
            "libnccl not found; tried {} (set the `library` option or {LIBRARY_ENV})",
            tried.join("; ")
        ),
    ))
}

impl Api {
    /// Opens libnccl from `candidates` and resolves its entry points.
    #[allow(non_snake_case)] // the bindings carry NCCL's names
    pub fn load(candidates: &Candidates) -> Result<Api> {
        let (lib, path) = open(candidates)?;
        let mut missing = Vec::new();
        macro_rules! required {
            ($name:ident) => {
                // SAFETY: the type is the declaration of `nccl.h` (see `sys`).
                match unsafe { sym(lib, stringify!($name)) } {
                    Some(f) => Some(f),
                    None => {
                        missing.push(stringify!($name));
                        None
                    }
                }
            };
        }
        macro_rules! optional {
            ($name:ident) => {
                // SAFETY: the type is the declaration of `nccl.h` (see `sys`).
                unsafe { sym(lib, stringify!($name)) }
            };
        }
        let get_version: Option<sys::GetVersion> = required!(ncclGetVersion);
        let get_unique_id = required!(ncclGetUniqueId);
        let init_rank = required!(ncclCommInitRank);
        let finalize = required!(ncclCommFinalize);
        let destroy = required!(ncclCommDestroy);
        let abort = required!(ncclCommAbort);
        let async_error = required!(ncclCommGetAsyncError);
        let count = required!(ncclCommCount);
        let user_rank = required!(ncclCommUserRank);
        let cu_device = required!(ncclCommCuDevice);
        let all_reduce = required!(ncclAllReduce);
        let all_gather = required!(ncclAllGather);
        let reduce_scatter = required!(ncclReduceScatter);
        let broadcast = required!(ncclBroadcast);
        let reduce = required!(ncclReduce);
        let send = required!(ncclSend);
        let recv = required!(ncclRecv);
        let group_start = required!(ncclGroupStart);
        let group_end = required!(ncclGroupEnd);
        let error_string = required!(ncclGetErrorString);
        let last_error = required!(ncclGetLastError);
        let unresolved = || {
            Error::new(
                Status::VENDOR_ERROR,
                format!(
                    "{path} is not a usable libnccl: missing {}",
                    missing.join(", ")
                ),
            )
        };
        // `missing` is empty exactly when every `Option` above is `Some`.
        let (
            Some(ncclGetVersion),
            Some(ncclGetUniqueId),
            Some(ncclCommInitRank),
            Some(ncclCommFinalize),
            Some(ncclCommDestroy),
            Some(ncclCommAbort),
            Some(ncclCommGetAsyncError),
            Some(ncclCommCount),
            Some(ncclCommUserRank),
            Some(ncclCommCuDevice),
            Some(ncclAllReduce),
            Some(ncclAllGather),
            Some(ncclReduceScatter),
            Some(ncclBroadcast),
            Some(ncclReduce),
            Some(ncclSend),
            Some(ncclRecv),
            Some(ncclGroupStart),
            Some(ncclGroupEnd),
            Some(ncclGetErrorString),
            Some(ncclGetLastError),
        ) = (
            get_version,
            get_unique_id,
            init_rank,
            finalize,
            destroy,
            abort,
            async_error,
            count,
            user_rank,
            cu_device,
            all_reduce,
            all_gather,
            reduce_scatter,
            broadcast,
            reduce,
            send,
            recv,
            group_start,
            group_end,
            error_string,
            last_error,
        )
        else {
            return Err(unresolved());
        };
        let mut version = 0;
        // SAFETY: a valid out-pointer.
        let rc = unsafe { ncclGetVersion(&mut version) };
        if rc != sys::NCCL_SUCCESS {
            return Err(Error::new(
                Status::VENDOR_ERROR,
                format!("{path}: ncclGetVersion failed with ncclResult {rc}"),
            ));
        }
        let api = Api {
            path,
            version,
            ncclGetUniqueId,
            ncclCommInitRank,
            ncclCommFinalize,
            ncclCommDestroy,
            ncclCommAbort,
            ncclCommGetAsyncError,
            ncclCommCount,
            ncclCommUserRank,
            ncclCommCuDevice,
            ncclAllReduce,
            ncclAllGather,
            ncclReduceScatter,
            ncclBroadcast,
            ncclReduce,
            ncclSend,
            ncclRecv,
            ncclGroupStart,
            ncclGroupEnd,
            ncclGetErrorString,
            ncclGetLastError,
            ncclMemAlloc: optional!(ncclMemAlloc),
            ncclMemFree: optional!(ncclMemFree),
            ncclCommRegister: optional!(ncclCommRegister),
            ncclCommDeregister: optional!(ncclCommDeregister),
            ncclCommWindowRegister: optional!(ncclCommWindowRegister),
            ncclCommWindowDeregister: optional!(ncclCommWindowDeregister),
            ncclCommInitRankConfig: optional!(ncclCommInitRankConfig),
        };
        let (found, missing): (Vec<_>, Vec<_>) = api.optional().into_iter().partition(|s| s.1);
        let names = |v: Vec<(&str, bool)>| v.iter().map(|s| s.0).collect::<Vec<_>>().join(", ");
        tracing::debug!(
            path = %api.path,
            version = %api.version_string(),
            found = %names(found),
            missing = %names(missing),
            "nccl: loaded libnccl, optional symbols probed"
        );
        Ok(api)
    }

    /// Each optional symbol of [`OPTIONAL`] and whether this libnccl has it.
    pub(crate) fn optional(&self) -> Vec<(&'static str, bool)> {
        let has = [
            self.ncclMemAlloc.is_some(),
            self.ncclMemFree.is_some(),
            self.ncclCommRegister.is_some(),
            self.ncclCommDeregister.is_some(),
            self.ncclCommWindowRegister.is_some(),
            self.ncclCommWindowDeregister.is_some(),
            self.ncclCommInitRankConfig.is_some(),
        ];
        OPTIONAL.iter().zip(has).map(|(s, h)| (s.0, h)).collect()
    }

    /// `X.Y.Z` of the loaded library.
    pub fn version_string(&self) -> String {
        let (major, minor, patch) = crate::conv::decode_version(self.version);
        format!("{major}.{minor}.{patch}")
    }

    /// The error for an optional symbol this libnccl lacks: "libnccl 2.26.5 lacks
    /// ncclCommWindowRegister (needs 2.27)".
    pub(crate) fn lacks(&self, symbol: &str) -> Error {
        Error::unsupported(lacks_message(&self.version_string(), symbol))
    }

    /// `Ok` for `ncclSuccess`, else the error with NCCL's own words for it.
    pub(crate) fn check(
        &self,
        op: &str,
        rc: sys::ncclResult_t,
        comm: sys::ncclComm_t,
    ) -> Result<()> {
        if rc == sys::NCCL_SUCCESS {
            return Ok(());
        }
        // SAFETY: both return static (or thread-local) NUL-terminated strings, or null; a null
        // comm is allowed by `ncclGetLastError`.
        let (what, last) = unsafe {
            (
                text((self.ncclGetErrorString)(rc)),
                text((self.ncclGetLastError)(comm)),
            )
        };
        let mut message = format!("{op}: {what} (ncclResult {rc})");
        if !last.is_empty() {
            message.push_str(": ");
            message.push_str(&last);
        }
        Err(Error::new(crate::conv::status(rc), message))
    }
}

/// The words of [`Api::lacks`].
pub(crate) fn lacks_message(version: &str, symbol: &str) -> String {
    match OPTIONAL.iter().find(|s| s.0 == symbol) {
        Some((_, since)) => format!("libnccl {version} lacks {symbol} (needs {since})"),
        None => format!("libnccl {version} lacks {symbol}"),
    }
}

/// A C string from NCCL, or `""` for null.
///
/// # Safety
/// `p` is null or a NUL-terminated string valid for the call.
unsafe fn text(p: *const c_char) -> String {
    if p.is_null() {
        return String::new();
    }
    // SAFETY: non-null and NUL-terminated by the caller's contract.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_symbol_names_the_release_that_has_it() {
        assert_eq!(
            lacks_message("2.26.5", "ncclCommWindowRegister"),
            "libnccl 2.26.5 lacks ncclCommWindowRegister (needs 2.27)"
        );
        assert_eq!(
            lacks_message("2.18.1", "ncclMemAlloc"),
            "libnccl 2.18.1 lacks ncclMemAlloc (needs 2.19)"
        );
        assert_eq!(
            lacks_message("2.18.1", "ncclOther"),
            "libnccl 2.18.1 lacks ncclOther"
        );
    }
}
