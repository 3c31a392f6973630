//! Options from the configuration, as a plugin receives them.

use std::ffi::CStr;

use ferrocx::abi::KeyValue;

use crate::error::{Error, Result};

/// The `key = value` options of one adaptor (`[cluster.options.<name>]` in the config).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Options(Vec<(String, String)>);

impl Options {
    /// Builds options from pairs.
    pub fn new(pairs: Vec<(String, String)>) -> Self {
        Options(pairs)
    }

    /// The value of `key`, if given.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// Every pair, in the order given.
    pub fn pairs(&self) -> &[(String, String)] {
        &self.0
    }

    /// Reads `n` options from the ABI's array.
    ///
    /// # Safety
    /// `ptr` must be null with `n == 0`, or point to `n` [`KeyValue`]s whose strings are valid
    /// NUL-terminated C strings.
    pub unsafe fn from_raw(ptr: *const KeyValue, n: usize) -> Result<Self> {
        if n == 0 {
            return Ok(Options::default());
        }
        if ptr.is_null() {
            return Err(Error::invalid_argument("`options` is null"));
        }
        // SAFETY: `n` elements by the caller's contract.
        let kvs = unsafe { std::slice::from_raw_parts(ptr, n) };
        let mut pairs = Vec::with_capacity(n);
        for kv in kvs {
            if kv.key.is_null() || kv.value.is_null() {
                return Err(Error::invalid_argument("option with a null key or value"));
            }
            // SAFETY: non-null NUL-terminated strings by the caller's contract.
            let (k, v) = unsafe { (CStr::from_ptr(kv.key), CStr::from_ptr(kv.value)) };
            pairs.push((
                k.to_string_lossy().into_owned(),
                v.to_string_lossy().into_owned(),
            ));
        }
        Ok(Options(pairs))
    }
}
