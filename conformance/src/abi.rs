//! The ABI part: each table's header (magic, version, `struct_size`, name), how the library's
//! types were checked, and that `get_last_error` answers with a string. Reading headers calls
//! nothing in the adaptor; `get_last_error` is the only entry called here.
//!
//! Two more ABI checks close each of the other parts, over every call that part made: no entry
//! panicked across the boundary, and every failure left a message in `get_last_error`.

use std::cmp::Ordering;
use std::mem::size_of;

use ferrocx::abi::{AbiHeader, AbiTable, ABI_MAGIC, ABI_MAJOR, ABI_MINOR};
use ferrocx::loader::{Checked, Table};
use ferrocx::registry::AdaptorEntry;

use crate::boundary::{ensure, last_error_is_non_null, Stop, Verdict};
use crate::report::{Outcome, Report};
use crate::runner::Runner;

/// Runs the ABI checks of an adaptor (headers of every table it exports).
pub fn check_abi(entry: &AdaptorEntry) -> Report {
    let mut r = Runner::new(None);
    run(&mut r, entry);
    r.finish()
}

/// The ABI checks, into `r`.
pub(crate) fn run(r: &mut Runner<'_>, entry: &AdaptorEntry) {
    let name = entry.name.as_str();
    let d = entry.device.as_deref();
    let c = entry.ccl.as_deref();
    table(r, name, d.map(|d| &d.root));
    table(r, name, d.and_then(|d| d.vmm.as_ref()));
    table(r, name, d.and_then(|d| d.flatmap.as_ref()));
    table(r, name, d.and_then(|d| d.multicast.as_ref()));
    table(r, name, d.and_then(|d| d.graph.as_ref()));
    table(r, name, d.and_then(|d| d.kernel.as_ref()));
    table(r, name, d.and_then(|d| d.memops.as_ref()));
    table(r, name, c.map(|c| &c.root));
    table(r, name, c.and_then(|c| c.window.as_ref()));
    let layout = match entry.checked {
        Checked::AbiStable => Outcome::Pass,
        Checked::HeaderOnly => Outcome::Skip(
            "a C/C++ plugin (no abi_stable root module): checked by its table headers only".into(),
        ),
        Checked::Builtin => Outcome::Skip("built in: compiled against this build's types".into()),
    };
    r.record("abi", "abi_stable layout check of the library", layout);
    r.check("abi", "get_last_error never returns null", || {
        let answers = [
            ("device", d.map(|d| d.root.get().get_last_error)),
            ("CCL", c.map(|c| c.root.get().get_last_error)),
        ];
        let mut any = false;
        for (which, f) in answers {
            let Some(f) = f else { continue };
            match last_error_is_non_null(f) {
                None => {
                    return Err(Stop(Outcome::Fail(format!(
                        "the {which} table has no get_last_error (required: every failure's \
                         message comes from it)"
                    ))))
                }
                Some(false) => {
                    return Err(Stop(Outcome::Fail(format!(
                        "the {which} table's get_last_error returned null"
                    ))))
                }
                Some(true) => any = true,
            }
        }
        ensure(any, || "the adaptor exports no root table".into())
    });
}

fn table<T: AbiTable>(r: &mut Runner<'_>, adaptor: &str, t: Option<&Table<T>>) {
    let name = format!("{} header", T::SYMBOL);
    match t {
        None => r.record("abi", name, Outcome::absent(T::SYMBOL)),
        Some(t) => {
            r.check("abi", name, || header(adaptor, t));
        }
    }
}

fn header<T: AbiTable>(adaptor: &str, t: &Table<T>) -> Verdict {
    let h = t.get().header();
    ensure(h.magic == ABI_MAGIC, || {
        format!("magic {:#010x}, expected {ABI_MAGIC:#010x}", h.magic)
    })?;
    ensure(h.abi_major == ABI_MAJOR, || {
        format!("ABI major {}, expected {ABI_MAJOR}", h.abi_major)
    })?;
    ensure(h.reserved == 0, || {
        format!("reserved is {:#x}, must be 0", h.reserved)
    })?;
    ensure(t.name() == adaptor, || {
        format!(
            "named {:?}, but the adaptor is {adaptor:?} (every table of a library carries one name)",
            t.name()
        )
    })?;
    ensure(!t.name().bytes().any(|b| b.is_ascii_uppercase()), || {
        format!("name {:?} must be lowercase", t.name())
    })?;
    let declared = h.struct_size as usize;
    let known = size_of::<T>();
    let hdr = size_of::<AbiHeader>();
    let word = size_of::<usize>();
    ensure((declared - hdr) % word == 0, || {
        format!(
            "struct_size {declared} is not the {hdr}-byte header plus whole {word}-byte entries"
        )
    })?;
    let minor = h.abi_minor;
    match minor.cmp(&ABI_MINOR) {
        Ordering::Equal => {
            ensure(declared == known, || {
                format!("struct_size {declared} for ABI {ABI_MAJOR}.{minor}, whose table is {known} bytes")
            })
        }
        Ordering::Less => ensure(declared <= known, || {
            format!(
                "struct_size {declared} for ABI {ABI_MAJOR}.{minor}, larger than this build's \
                 {ABI_MAJOR}.{ABI_MINOR} table ({known} bytes)"
            )
        }),
        Ordering::Greater => ensure(declared >= known, || {
            format!(
                "struct_size {declared} for ABI {ABI_MAJOR}.{minor}, smaller than this build's \
                 older {ABI_MAJOR}.{ABI_MINOR} table ({known} bytes)"
            )
        }),
    }
}
