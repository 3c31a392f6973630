//! The driver other adaptors reach through `ferrocx_adaptor_cuda::shared` is the device
//! adaptor's own load: a library named before the first load is the one both use, with the
//! same outcome and message, and it cannot be changed afterwards. Runs the same with or without
//! a GPU (the named library wins over the system's driver).

use ferrocx_adaptor_cuda::shared::{self, Driver};
use ferrocx_adaptor_cuda::CudaDevice;
use ferrocx_plugin_sdk::abi::Status;
use ferrocx_plugin_sdk::{DeviceAdaptor, Options};

const MISSING: &str = "/nonexistent/ferrocx-test/libcuda.so.1";

#[test]
fn a_library_named_first_is_the_one_load_for_both() {
    shared::use_library(MISSING.as_ref()).expect("named before any load");

    let shared_err = Driver::get().expect_err("no library there");
    assert_eq!(shared_err.status(), Status::VENDOR_ERROR);
    assert!(
        shared_err
            .message()
            .starts_with(&format!("{MISSING} not found: ")),
        "{shared_err}"
    );
    // The device adaptor went through the same load: same failure, same words.
    let device_err = CudaDevice::instance()
        .init(&Options::default())
        .expect_err("no library there");
    assert_eq!(device_err.status(), shared_err.status());
    assert_eq!(device_err.message(), shared_err.message());
    assert!(!ferrocx_adaptor_cuda::is_present());

    // Decided once: a second name is refused, and the outcome stays.
    let again = shared::use_library("/elsewhere/libcuda.so.1".as_ref()).expect_err("too late");
    assert_eq!(again.status(), Status::INVALID_ARGUMENT);
    assert!(
        again.message().contains("/elsewhere/libcuda.so.1"),
        "{again}"
    );
    assert_eq!(
        Driver::get().expect_err("still missing").message(),
        shared_err.message()
    );
}
