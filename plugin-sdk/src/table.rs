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

/// The entries of the device adaptor table that an adaptor may export as absent, in field order
/// (every entry but `get_last_error`, which the SDK always provides).
pub const DEVICE_ENTRIES: &[&str] = &[
    "init",
    "finalize",
    "device_count",
    "set_device",
    "get_device",
    "get_properties",
    "mem_alloc",
    "mem_free",
    "mem_copy",
    "mem_copy_async",
    "mem_set",
    "mem_set_async",
    "stream_create",
    "stream_wrap",
    "stream_destroy",
    "stream_synchronize",
    "stream_query",
    "stream_wait_event",
    "event_create",
    "event_destroy",
    "event_record",
    "event_synchronize",
    "event_query",
    "event_elapsed_ms",
    "launch_host_func",
    "ipc_export",
    "ipc_import",
    "ipc_close",
    "mem_get_info",
];

/// `DeviceAdaptor` methods whose ABI entry has another name: `(method, entry)`.
pub const DEVICE_ALIASES: &[(&str, &str)] = &[("properties", "get_properties")];

/// The entries of the CCL adaptor table that an adaptor may export as absent, in field order
/// (every entry but `get_last_error`).
pub const CCL_ENTRIES: &[&str] = &[
    "init",
    "finalize",
    "get_version",
    "get_unique_id",
    "comm_init_rank",
    "comm_finalize",
    "comm_destroy",
    "comm_abort",
    "comm_get_async_error",
    "comm_count",
    "comm_user_rank",
    "comm_device",
    "all_reduce",
    "all_gather",
    "reduce_scatter",
    "broadcast",
    "reduce",
    "gather",
    "scatter",
    "all_to_all",
    "all_to_allv",
    "send",
    "recv",
    "group_start",
    "group_end",
    "mem_alloc",
    "mem_free",
    "mem_register",
    "mem_deregister",
    "query_support",
    "get_limits",
];

/// `CclAdaptor` methods whose ABI entry has another name: `(method, entry)`.
pub const CCL_ALIASES: &[(&str, &str)] = &[
    ("version", "get_version"),
    ("unique_id", "get_unique_id"),
    ("comm_async_error", "comm_get_async_error"),
];

/// `true` when `entry` is named in `absent`, by its entry name or by the trait method that
/// implements it (`aliases`).
pub const fn is_absent(absent: &[&str], entry: &str, aliases: &[(&str, &str)]) -> bool {
    if listed(absent, entry) {
        return true;
    }
    let mut i = 0;
    while i < aliases.len() {
        if eq(aliases[i].1.as_bytes(), entry.as_bytes()) && listed(absent, aliases[i].0) {
            return true;
        }
        i += 1;
    }
    false
}

/// `true` when `name` is an entry of `entries` or a method of `aliases`.
pub const fn is_known(name: &str, entries: &[&str], aliases: &[(&str, &str)]) -> bool {
    if listed(entries, name) {
        return true;
    }
    let mut i = 0;
    while i < aliases.len() {
        if eq(aliases[i].0.as_bytes(), name.as_bytes()) {
            return true;
        }
        i += 1;
    }
    false
}

/// Fails compilation (in a `const` or `static` initializer) with `message` unless `name` is
/// known ([`is_known`]).
pub const fn must_be_known(
    name: &str,
    entries: &[&str],
    aliases: &[(&str, &str)],
    message: &'static str,
) {
    if !is_known(name, entries, aliases) {
        panic!("{}", message);
    }
}

/// Fails compilation unless every name of `absent` is known: the check of a table builder
/// called directly (the [`export_plugin!`](crate::export_plugin) keys check each name on its
/// own, with a message naming it).
pub const fn all_known(absent: &[&str], entries: &[&str], aliases: &[(&str, &str)]) {
    let mut i = 0;
    while i < absent.len() {
        if !is_known(absent[i], entries, aliases) {
            panic!("an absent name is neither an entry of the table nor a method of the trait (the export_plugin! error above names it)");
        }
        i += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferrocx::abi::{AbiTable, CclAdaptorV1, DeviceAdaptorV1};

    fn names<T: AbiTable>() -> Vec<&'static str> {
        T::entries()
            .iter()
            .map(|(n, _)| *n)
            .filter(|n| *n != "get_last_error")
            .collect()
    }

    #[test]
    fn the_lists_are_the_tables_entries() {
        assert_eq!(DEVICE_ENTRIES, names::<DeviceAdaptorV1>());
        assert_eq!(CCL_ENTRIES, names::<CclAdaptorV1>());
        for (_, entry) in DEVICE_ALIASES {
            assert!(DEVICE_ENTRIES.contains(entry));
        }
        for (_, entry) in CCL_ALIASES {
            assert!(CCL_ENTRIES.contains(entry));
        }
    }

    #[test]
    fn a_method_name_marks_its_entry_absent() {
        assert!(is_absent(&["properties"], "get_properties", DEVICE_ALIASES));
        assert!(is_absent(
            &["get_properties"],
            "get_properties",
            DEVICE_ALIASES
        ));
        assert!(!is_absent(&["properties"], "mem_alloc", DEVICE_ALIASES));
        assert!(is_known("version", CCL_ENTRIES, CCL_ALIASES));
        assert!(!is_known("stream_wrapp", DEVICE_ENTRIES, DEVICE_ALIASES));
    }
}
