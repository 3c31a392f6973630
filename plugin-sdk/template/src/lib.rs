//! The ferrocx adaptor plugin for myvendor.
//!
//! [`VendorDevice`] (the device adaptor: memory, streams, events) and [`VendorCcl`] (the
//! collective library: communicators, collectives, point-to-point) implement every required
//! method of the SDK's traits. Each one still returns `UNSUPPORTED` with a message that names
//! the vendor call to make: `grep -rn 'TODO(vendor)' src/` lists them. README.md says what to
//! implement first and how to add the optional groups.

mod ccl;
mod device;

pub use ccl::VendorCcl;
pub use device::VendorDevice;

// The exported tables. An optional group is one more key, e.g. `device_vmm: VendorDevice`
// once `VendorDevice` implements `DeviceVmm` (see README.md for every key).
ferrocx_plugin_sdk::export_plugin! {
    name: "myvendor",
    device: VendorDevice,
    ccl: VendorCcl,
}

#[cfg(test)]
mod tests {
    use std::ffi::CStr;

    #[test]
    fn the_library_is_named_for_the_adaptor() {
        // SAFETY: the header's name is a static NUL-terminated string.
        let name = unsafe { CStr::from_ptr(super::ferrocx_device_adaptor_v1.header.name.0) };
        assert_eq!(
            env!("CARGO_CRATE_NAME").strip_prefix("ferrocx_adaptor_"),
            name.to_str().ok(),
            "the name in export_plugin! and the package name in Cargo.toml must agree: the \
             loader finds libferrocx_adaptor_<name>.so by the adaptor's name"
        );
    }
}
