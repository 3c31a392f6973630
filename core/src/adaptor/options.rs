//! Options from the configuration in the ABI's form, for `init` and `comm_init_rank`.

use std::ffi::CString;

use crate::abi::KeyValue;

/// `key = value` pairs as NUL-terminated strings and the `KeyValue` array that points at them.
/// The strings live on the heap, so the array stays valid while this value lives.
pub(crate) struct CallOptions {
    _strings: Vec<(CString, CString)>,
    kvs: Vec<KeyValue>,
}

impl CallOptions {
    /// Converts pairs; interior NULs (which C cannot see past) are dropped.
    pub(crate) fn new(options: &[(String, String)]) -> Self {
        let c = |s: &str| CString::new(s.replace('\0', "")).unwrap_or_default();
        let strings: Vec<(CString, CString)> = options.iter().map(|(k, v)| (c(k), c(v))).collect();
        let kvs = strings
            .iter()
            .map(|(k, v)| KeyValue {
                key: k.as_ptr(),
                value: v.as_ptr(),
            })
            .collect();
        CallOptions {
            _strings: strings,
            kvs,
        }
    }

    /// The array's first element (valid while `self` lives).
    pub(crate) fn as_ptr(&self) -> *const KeyValue {
        self.kvs.as_ptr()
    }

    /// Number of options.
    pub(crate) fn len(&self) -> usize {
        self.kvs.len()
    }
}
