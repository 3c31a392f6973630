//! Capabilities, probed once after `init` into plain structs that `ferrocx info`, the router and
//! the conformance kit all read: which tables and entries an adaptor exports, what each device
//! reports ([`Capabilities`] bits, architecture, kernel image formats), and which entries whose
//! support depends on the vendor runtime work with the library the CCL loaded.
//!
//! An absent entry is the only "unsupported" of the tables themselves; where support depends on
//! the vendor runtime (NCCL's window registration), the CCL answers `query_support` (ABI 1.2),
//! and a CCL of an older minor, which has no such entry, supports every entry it exports.
//!
//! ```no_run
//! # fn f(device: &ferrocx::adaptor::Device, ccl: &ferrocx::adaptor::Ccl) {
//! use ferrocx::abi::{Capabilities, ImageFormat};
//! let dev = device.caps(); // after `init`
//! let ordinal = dev.ordinal(0).expect("device 0");
//! let host = ordinal.capabilities().contains(Capabilities::HOST_ADDRESSABLE);
//! let cubin = ordinal.loads(ImageFormat::CUBIN);
//! let ccl = ccl.caps(); // after `init`
//! let windows = ccl.supports("window_register");
//! # }
//! ```

use std::sync::{Arc, Mutex};

use crate::abi::{AbiTable, Capabilities, ImageFormat};
use crate::adaptor::Properties;
use crate::loader::Table;

/// What one table of an adaptor provides.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TableCaps {
    /// The table's symbol (`ferrocx_device_kernel_v1`).
    pub symbol: &'static str,
    /// `(major, minor)` the table was built against.
    pub version: (u16, u16),
    /// Entries the table provides, in field order.
    pub present: Vec<&'static str>,
    /// Entries the table leaves `None` within its `struct_size`.
    pub absent: Vec<&'static str>,
    /// Entries past the table's `struct_size` (it is of an older minor): absent too.
    pub beyond: Vec<&'static str>,
}

impl TableCaps {
    /// The capabilities of a checked table.
    pub fn of<T: AbiTable>(table: &Table<T>) -> TableCaps {
        TableCaps {
            symbol: T::SYMBOL,
            version: table.version(),
            present: table.present(),
            absent: table.absent(),
            beyond: table.beyond_size(),
        }
    }

    /// `true` when the table provides `entry`.
    pub fn has(&self, entry: &str) -> bool {
        self.present.contains(&entry)
    }
}

/// What one device of a device adaptor reports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OrdinalCaps {
    /// The device's index (`set_device`'s argument).
    pub ordinal: i32,
    /// Vendor, name, [`crate::abi::Capabilities`] bits, memory, architecture (`None` when the
    /// adaptor has no `get_properties`).
    pub properties: Option<Properties>,
    /// The kernel image formats the device loads, best first (empty without the kernel group).
    pub image_formats: Vec<ImageFormat>,
}

impl OrdinalCaps {
    /// The device's capability bits (none without `get_properties`).
    pub fn capabilities(&self) -> Capabilities {
        self.properties
            .as_ref()
            .map_or(Capabilities(0), |p| p.capabilities)
    }

    /// The device's architecture number (0 when not applicable or unknown).
    pub fn arch(&self) -> u32 {
        self.properties.as_ref().map_or(0, |p| p.arch)
    }

    /// `true` when the device loads images of `format` through the kernel group.
    pub fn loads(&self, format: ImageFormat) -> bool {
        self.image_formats.contains(&format)
    }
}

/// The capabilities of a device adaptor, from [`crate::adaptor::Device::caps`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceCaps {
    /// The adaptor's name.
    pub adaptor: String,
    /// `ferrocx_device_adaptor_v1`.
    pub root: TableCaps,
    /// `ferrocx_device_vmm_v1`, if exported.
    pub vmm: Option<TableCaps>,
    /// `ferrocx_device_flatmap_v1`, if exported.
    pub flatmap: Option<TableCaps>,
    /// `ferrocx_device_multicast_v1`, if exported.
    pub multicast: Option<TableCaps>,
    /// `ferrocx_device_graph_v1`, if exported.
    pub graph: Option<TableCaps>,
    /// `ferrocx_device_kernel_v1`, if exported (ABI 1.2).
    pub kernel: Option<TableCaps>,
    /// `ferrocx_device_memops_v1`, if exported (ABI 1.3).
    pub memops: Option<TableCaps>,
    /// Every device the adaptor sees, or why they could not be listed (before `init`, or its
    /// failure: then these capabilities are not cached, and the next call probes again).
    pub ordinals: Result<Vec<OrdinalCaps>, String>,
    /// What went wrong probing a device that did list (a failing `kernel_image_formats`).
    pub notes: Vec<String>,
}

impl DeviceCaps {
    /// The optional groups exported, in field order.
    pub fn groups(&self) -> Vec<&TableCaps> {
        [
            &self.vmm,
            &self.flatmap,
            &self.multicast,
            &self.graph,
            &self.kernel,
            &self.memops,
        ]
        .into_iter()
        .flatten()
        .collect()
    }

    /// What device `ordinal` reports, if it was listed.
    pub fn ordinal(&self, ordinal: i32) -> Option<&OrdinalCaps> {
        self.ordinals
            .as_ref()
            .ok()?
            .iter()
            .find(|o| o.ordinal == ordinal)
    }

    /// `true` when the memops group (ABI 1.3) is exported with both entries:
    /// [`Device::stream_write_value32`](crate::adaptor::Device::stream_write_value32) and
    /// [`Device::stream_wait_value32`](crate::adaptor::Device::stream_wait_value32) work.
    pub fn has_memops(&self) -> bool {
        self.memops
            .as_ref()
            .is_some_and(|m| m.has("stream_write_value32") && m.has("stream_wait_value32"))
    }

    /// `true` when the kernel group is exported with every entry a launch needs.
    pub fn has_kernels(&self) -> bool {
        self.kernel.as_ref().is_some_and(|k| {
            ["module_load", "module_get_function", "launch_kernel"]
                .iter()
                .all(|e| k.has(e))
        })
    }
}

/// Whether an entry whose support depends on the vendor library the CCL's `init` loaded (NCCL's
/// window registration needs `ncclCommWindowRegister`, 2.27) works with that library.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RuntimeSupport {
    /// The entry is absent from the table.
    Absent,
    /// Present, and the adaptor's `query_support` said yes (or the table predates it).
    Supported,
    /// Present, but the loaded library lacks what it needs: the adaptor's reason.
    Unsupported(String),
}

impl RuntimeSupport {
    /// `true` for [`RuntimeSupport::Supported`].
    pub fn is_supported(&self) -> bool {
        *self == RuntimeSupport::Supported
    }
}

/// The CCL entries whose support the core asks the adaptor about (`query_support`).
pub const RUNTIME_DEPENDENT: [&str; 2] = ["window_register", "mem_register"];

/// The collectives of the CCL table, in field order.
pub const COLLECTIVES: [&str; 9] = [
    "all_reduce",
    "all_gather",
    "reduce_scatter",
    "broadcast",
    "reduce",
    "gather",
    "scatter",
    "all_to_all",
    "all_to_allv",
];

/// The capabilities of a CCL adaptor, from [`crate::adaptor::Ccl::caps`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CclCaps {
    /// The adaptor's name.
    pub adaptor: String,
    /// `ferrocx_ccl_adaptor_v1`.
    pub root: TableCaps,
    /// `ferrocx_ccl_window_v1`, if exported.
    pub window: Option<TableCaps>,
    /// The vendor library's version (`get_version`), if it answered.
    pub version: Option<i32>,
    /// The collectives present ([`COLLECTIVES`] the table provides).
    pub collectives: Vec<&'static str>,
    /// `send` and `recv` both present.
    pub p2p: bool,
    /// `group_start` and `group_end` both present.
    pub group: bool,
    /// `mem_register` and `mem_deregister` both present.
    pub registration: bool,
    /// `window_register` and `window_deregister` both present.
    pub windows: bool,
    /// Each of [`RUNTIME_DEPENDENT`] with its support by the loaded library.
    pub runtime: Vec<(&'static str, RuntimeSupport)>,
    /// The adaptor's declared limits (ABI 1.3's `get_limits`; none for an older table).
    pub limits: crate::abi::CclLimits,
}

impl CclCaps {
    /// `true` when the CCL tables provide `entry` (of the root table or the window group).
    pub fn has(&self, entry: &str) -> bool {
        self.root.has(entry) || self.window.as_ref().is_some_and(|w| w.has(entry))
    }

    /// How `entry` is supported: for the [`RUNTIME_DEPENDENT`] entries, the adaptor's answer;
    /// for every other, present or absent.
    pub fn support(&self, entry: &str) -> RuntimeSupport {
        if let Some((_, s)) = self.runtime.iter().find(|(e, _)| *e == entry) {
            return s.clone();
        }
        if self.has(entry) {
            RuntimeSupport::Supported
        } else {
            RuntimeSupport::Absent
        }
    }

    /// `true` when `entry` is present and supported by the loaded library.
    pub fn supports(&self, entry: &str) -> bool {
        self.support(entry).is_supported()
    }
}

/// A value probed once: kept after the first complete probe, probed again until then.
pub(crate) struct Cached<T>(Mutex<Option<Arc<T>>>);

impl<T> Default for Cached<T> {
    fn default() -> Self {
        Cached(Mutex::new(None))
    }
}

impl<T> Cached<T> {
    /// The cached value, or `probe`'s; `probe` says whether its value is complete (then kept).
    pub(crate) fn get_or_probe(&self, probe: impl FnOnce() -> (T, bool)) -> Arc<T> {
        let mut slot = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(v) = slot.as_ref() {
            return v.clone();
        }
        let (value, complete) = probe();
        let value = Arc::new(value);
        if complete {
            *slot = Some(value.clone());
        }
        value
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(present: &[&'static str]) -> TableCaps {
        TableCaps {
            symbol: "t",
            version: (1, 2),
            present: present.to_vec(),
            absent: Vec::new(),
            beyond: Vec::new(),
        }
    }

    #[test]
    fn support_answers_from_the_query_or_the_table() {
        let caps = CclCaps {
            adaptor: "x".into(),
            root: table(&["all_reduce", "mem_register"]),
            window: Some(table(&["window_register", "window_deregister"])),
            version: None,
            collectives: vec!["all_reduce"],
            p2p: false,
            group: false,
            registration: false,
            windows: true,
            limits: crate::abi::CclLimits::NONE,
            runtime: vec![
                ("window_register", RuntimeSupport::Unsupported("old".into())),
                ("mem_register", RuntimeSupport::Supported),
            ],
        };
        assert!(caps.has("window_deregister"));
        assert!(!caps.supports("window_register"));
        assert_eq!(
            caps.support("window_register"),
            RuntimeSupport::Unsupported("old".into())
        );
        assert!(caps.supports("mem_register"));
        assert!(caps.supports("all_reduce"));
        assert_eq!(caps.support("send"), RuntimeSupport::Absent);
    }

    #[test]
    fn an_incomplete_probe_is_not_kept() {
        let c: Cached<u32> = Cached::default();
        assert_eq!(*c.get_or_probe(|| (1, false)), 1);
        assert_eq!(*c.get_or_probe(|| (2, true)), 2);
        assert_eq!(
            *c.get_or_probe(|| (3, true)),
            2,
            "kept after a complete probe"
        );
    }
}
