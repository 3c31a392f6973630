//! Hostile and careless inputs to the library (issue 17): each test here failed before its fix.
//! The inputs that go through the `ferrocx` command are in `cli/tests/hostile.rs`.
//!
//! - Loader: a table's `struct_size` that is not whole entries, or larger than any table of its
//!   minor can be, is refused with path, symbol, size and rule, for every table and group.
//! - Store: a client that drips its hello is dropped at the handshake's deadline, and
//!   unauthenticated connections are capped while a real rank still gets in.
//! - Config: one pass for positions, bounded regular-file reads, named duplicate keys, located
//!   too-deep headers, control characters in names, and plugin dirs that do not exist.

use ferrocx::loader::LoadErrorKind;
use ferrocx::registry::Registry;
use ferrocx_tests::c_plugin;

// ---- 2. Loader: table sizes ----

#[test]
fn a_table_size_that_is_not_whole_entries_is_refused_with_path_symbol_and_rule() {
    let mut r = Registry::empty();
    let path = c_plugin("oddsize");
    let e = r.add_plugin(&path).err().expect("refused");
    assert_eq!(e.kind, LoadErrorKind::BadHeader);
    assert_eq!(e.path, path);
    assert_eq!(e.symbol.as_deref(), Some("ferrocx_device_adaptor_v1"));
    assert!(
        e.reason
            .contains("struct_size 52 (ABI 1.1) refused: a table is the 24-byte header plus whole 8-byte entries"),
        "{e}"
    );
}

#[test]
fn an_absurd_table_size_of_a_known_minor_is_refused() {
    let mut r = Registry::empty();
    let e = r.add_plugin(&c_plugin("hugesize")).err().expect("refused");
    assert_eq!(e.kind, LoadErrorKind::BadHeader);
    assert_eq!(e.symbol.as_deref(), Some("ferrocx_device_adaptor_v1"));
    assert!(e.reason.contains("struct_size 1048576"), "{e}");
    assert!(e.reason.contains("is at most this build's"), "{e}");
}

#[test]
fn a_group_whose_size_is_not_whole_entries_is_dropped_with_the_rule() {
    let mut r = Registry::empty();
    let entry = r.add_plugin(&c_plugin("oddgroup")).expect("the plugin loads");
    let device = entry.device.as_ref().expect("a device");
    assert!(device.flatmap.is_none(), "the broken group was kept");
    let note = entry
        .notes
        .iter()
        .find(|n| n.contains("ferrocx_device_flatmap_v1"))
        .unwrap_or_else(|| panic!("no note about the group: {:?}", entry.notes));
    assert!(note.contains("struct_size 36"), "{note}");
    assert!(note.contains("whole 8-byte entries"), "{note}");
}
