//! Safe calls through a CCL adaptor's table.

use std::sync::Arc;

use crate::abi::Status;
use crate::loader::CclTables;

use super::device::last_error;
use super::error::AdaptorError;

/// A CCL adaptor, ready to call. Cheap to clone.
#[derive(Clone)]
pub struct Ccl {
    tables: Arc<CclTables>,
}

impl Ccl {
    /// Wraps checked tables.
    pub fn new(tables: Arc<CclTables>) -> Self {
        Ccl { tables }
    }

    /// The adaptor's name.
    pub fn name(&self) -> &str {
        self.tables.root.name()
    }

    /// The tables, for callers that dispatch themselves.
    pub fn tables(&self) -> &CclTables {
        &self.tables
    }

    fn check(&self, op: &'static str, status: Status) -> Result<(), AdaptorError> {
        if status.is_success() {
            return Ok(());
        }
        Err(AdaptorError::Failed {
            adaptor: self.name().to_string(),
            op,
            status,
            message: last_error(self.tables.root.get().get_last_error),
        })
    }

    fn entry<T>(&self, op: &'static str, f: Option<T>) -> Result<T, AdaptorError> {
        f.ok_or_else(|| AdaptorError::Unsupported {
            adaptor: self.name().to_string(),
            op,
        })
    }

    /// `init` with no options.
    pub fn init(&self) -> Result<(), AdaptorError> {
        let f = self.entry("init", self.tables.root.get().init)?;
        // SAFETY: zero options: a null array is allowed.
        let status = unsafe { f(std::ptr::null(), 0) };
        self.check("init", status)
    }

    /// The vendor library's version.
    pub fn version(&self) -> Result<i32, AdaptorError> {
        let f = self.entry("get_version", self.tables.root.get().get_version)?;
        let mut v = 0;
        // SAFETY: a valid out-pointer.
        let status = unsafe { f(&mut v) };
        self.check("get_version", status)?;
        Ok(v)
    }

    /// A new unique id (variable length).
    pub fn unique_id(&self) -> Result<Vec<u8>, AdaptorError> {
        let f = self.entry("get_unique_id", self.tables.root.get().get_unique_id)?;
        let mut len = 0usize;
        // SAFETY: a null buffer queries the size into a valid `len`.
        let status = unsafe { f(std::ptr::null_mut(), &mut len) };
        self.check("get_unique_id", status)?;
        let mut buf = vec![0u8; len];
        // SAFETY: `buf` holds `len` writable bytes.
        let status = unsafe { f(buf.as_mut_ptr(), &mut len) };
        self.check("get_unique_id", status)?;
        buf.truncate(len);
        Ok(buf)
    }
}
