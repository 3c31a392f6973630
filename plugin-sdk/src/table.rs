//! Const helpers the table builders and export macros use.

/// `true` when `name` is one of `list` (usable in a `static` initializer).
pub const fn listed(list: &[&str], name: &str) -> bool {
    let mut i = 0;
    while i < list.len() {
        if eq(list[i].as_bytes(), name.as_bytes()) {
            return true;
        }
        i += 1;
    }
    false
}

const fn eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}

/// A `&'static CStr` from a literal that ends in `"\0"` (compile-time checked).
pub const fn cstr(with_nul: &'static str) -> &'static std::ffi::CStr {
    match std::ffi::CStr::from_bytes_with_nul(with_nul.as_bytes()) {
        Ok(c) => c,
        Err(_) => panic!("adaptor name must not contain NUL"),
    }
}
