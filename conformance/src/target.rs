//! What the suite runs against.

use ferrocx::adaptor::{Ccl, Device};
use ferrocx::registry::AdaptorEntry;

/// An adaptor under test: its tables (for the ABI checks), its device adaptor, and its CCL
/// adaptor with the device adaptor that CCL runs on.
#[derive(Clone, Copy)]
pub struct Target<'a> {
    entry: &'a AdaptorEntry,
    paired: Option<&'a Device>,
}

impl<'a> Target<'a> {
    /// The adaptor of `entry`; a CCL runs on the same adaptor's device.
    pub fn new(entry: &'a AdaptorEntry) -> Target<'a> {
        Target {
            entry,
            paired: None,
        }
    }

    /// For a CCL-only adaptor (as NCCL's pairs with CUDA's device adaptor): the device adaptor
    /// its CCL checks run on. The device checks still cover only the adaptor's own device table.
    pub fn with_device(self, device: &'a Device) -> Target<'a> {
        Target {
            paired: Some(device),
            ..self
        }
    }

    /// The adaptor's name.
    pub fn name(&self) -> &str {
        &self.entry.name
    }

    /// The registry entry.
    pub fn entry(&self) -> &'a AdaptorEntry {
        self.entry
    }

    /// The adaptor's own device adaptor, if it has one.
    pub fn device(&self) -> Option<Device> {
        self.entry.device()
    }

    /// Its CCL adaptor, if it has one.
    pub fn ccl(&self) -> Option<Ccl> {
        self.entry.ccl()
    }

    /// The device adaptor the CCL runs on: the one given to [`Target::with_device`], else the
    /// adaptor's own.
    pub fn ccl_device(&self) -> Option<Device> {
        self.paired.cloned().or_else(|| self.device())
    }
}
