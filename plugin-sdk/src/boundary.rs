//! The boundary every trampoline goes through: panics are caught, errors become a status and a
//! thread-local message, and raw pointers are checked before they are used.

use std::panic::{catch_unwind, AssertUnwindSafe};

use ferrocx::abi::Status;

use crate::error::{set_last_error, Error, Result};

/// Runs `f`, turning its error or panic into a status (and a message for `get_last_error`).
#[inline]
pub fn guard(entry: &'static str, f: impl FnOnce() -> Result<Status>) -> Status {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(status)) => status,
        Ok(Err(e)) => {
            set_last_error(&format!("{entry}: {}", e.message()));
            e.status()
        }
        Err(payload) => {
            let what = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "non-string panic payload".to_string());
            set_last_error(&format!("{entry}: panic inside the adaptor: {what}"));
            Status::INTERNAL_ERROR
        }
    }
}

/// Runs `f` and reports plain success as [`Status::SUCCESS`].
#[inline]
pub fn call(entry: &'static str, f: impl FnOnce() -> Result<()>) -> Status {
    guard(entry, || f().map(|()| Status::SUCCESS))
}

/// Writes `value` through an out-pointer, refusing a null one.
///
/// # Safety
/// `out` must be null or valid for a write of `T`.
#[inline]
pub unsafe fn write_out<T>(out: *mut T, name: &str, value: T) -> Result<()> {
    if out.is_null() {
        return Err(Error::invalid_argument(format!("`{name}` is null")));
    }
    // SAFETY: non-null and, by the caller's contract, valid for writes.
    unsafe { out.write(value) };
    Ok(())
}

/// Copies `bytes` into a caller's buffer of `*len` bytes (variable-length outputs: unique ids,
/// IPC handles). A null `buf` or a too-small `*len` reports the size needed.
///
/// # Safety
/// `len` must be valid for reads and writes; `buf`, if not null, for `*len` bytes of writes.
pub unsafe fn write_bytes(buf: *mut u8, len: *mut usize, bytes: &[u8]) -> Result<Status> {
    if len.is_null() {
        return Err(Error::invalid_argument("`len` is null"));
    }
    // SAFETY: checked non-null; valid by the caller's contract.
    let cap = unsafe { *len };
    // SAFETY: as above.
    unsafe { *len = bytes.len() };
    if buf.is_null() {
        return Ok(Status::SUCCESS);
    }
    if cap < bytes.len() {
        return Err(Error::new(
            Status::BUFFER_TOO_SMALL,
            format!("buffer of {cap} bytes, {} needed", bytes.len()),
        ));
    }
    // SAFETY: `buf` holds at least `cap >= bytes.len()` writable bytes.
    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), buf, bytes.len()) };
    Ok(Status::SUCCESS)
}

/// Borrows `len` bytes at `ptr` (null only when `len` is 0).
///
/// # Safety
/// `ptr` must be valid for `len` bytes of reads for the duration of the call.
pub unsafe fn read_bytes<'a>(ptr: *const u8, len: usize, name: &str) -> Result<&'a [u8]> {
    if len == 0 {
        return Ok(&[]);
    }
    if ptr.is_null() {
        return Err(Error::invalid_argument(format!("`{name}` is null")));
    }
    // SAFETY: non-null, `len` readable bytes by the caller's contract.
    Ok(unsafe { std::slice::from_raw_parts(ptr, len) })
}
