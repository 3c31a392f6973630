//! The error a plugin's trait methods return, and the thread-local "last error" behind
//! `get_last_error`.

use std::cell::RefCell;
use std::ffi::{c_char, CString};
use std::fmt;

use ferrocx::abi::Status;

/// A failure inside a plugin: the status code the entry returns and the message
/// `get_last_error` reports.
#[derive(Clone, PartialEq, Eq)]
pub struct Error {
    status: Status,
    message: String,
}

/// Result of every SDK trait method.
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// An error with an explicit status.
    pub fn new(status: Status, message: impl Into<String>) -> Self {
        Error {
            status,
            message: message.into(),
        }
    }

    /// The operation (or this variant of it) is not supported by the adaptor.
    pub fn unsupported(what: impl Into<String>) -> Self {
        Self::new(Status::UNSUPPORTED, what)
    }

    /// An argument was out of range or inconsistent.
    pub fn invalid_argument(what: impl Into<String>) -> Self {
        Self::new(Status::INVALID_ARGUMENT, what)
    }

    /// A handle is unknown or already released.
    pub fn invalid_handle(what: impl Into<String>) -> Self {
        Self::new(Status::INVALID_HANDLE, what)
    }

    /// Memory could not be allocated.
    pub fn out_of_memory(what: impl Into<String>) -> Self {
        Self::new(Status::OUT_OF_MEMORY, what)
    }

    /// The vendor runtime reported an error.
    pub fn vendor(what: impl Into<String>) -> Self {
        Self::new(Status::VENDOR_ERROR, what)
    }

    /// An operating-system call failed.
    pub fn system(what: impl Into<String>, err: std::io::Error) -> Self {
        Self::new(Status::SYSTEM_ERROR, format!("{}: {err}", what.into()))
    }

    /// A bug in the adaptor.
    pub fn internal(what: impl Into<String>) -> Self {
        Self::new(Status::INTERNAL_ERROR, what)
    }

    /// The status the entry returns.
    pub fn status(&self) -> Status {
        self.status
    }

    /// The message `get_last_error` returns.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}: {}", self.status, self.message)
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({:?})", self.message, self.status)
    }
}

impl std::error::Error for Error {}

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

/// Stores `message` as this thread's last error.
pub fn set_last_error(message: &str) {
    // An interior NUL would truncate the C string; replace it rather than lose the message.
    let c = CString::new(message.replace('\0', "\\0")).unwrap_or_default();
    LAST_ERROR.with(|e| *e.borrow_mut() = c);
}

/// This thread's last error as a C string, valid until the next failing call on this thread.
pub fn last_error_ptr() -> *const c_char {
    LAST_ERROR.with(|e| e.borrow().as_ptr())
}
