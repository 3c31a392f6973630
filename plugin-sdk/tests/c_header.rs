//! The C header is generated from the Rust ABI types and must be current.

use std::path::PathBuf;

#[test]
fn c_header_is_current() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let abi = root.join("../core/src/abi");
    let config = cbindgen::Config::from_file(root.join("cbindgen.toml")).expect("cbindgen.toml");
    let mut builder = cbindgen::Builder::new().with_config(config);
    for file in ["types.rs", "header.rs", "device.rs", "ccl.rs"] {
        builder = builder.with_src(abi.join(file));
    }
    let mut generated = Vec::new();
    builder
        .generate()
        .expect("cbindgen failed on the ABI types")
        .write(&mut generated);
    let generated = String::from_utf8(generated).expect("utf-8");
    let path = root.join("include/ferrocx_plugin.h");
    if std::env::var_os("FERROCX_BLESS").is_some() {
        std::fs::write(&path, &generated).expect("write header");
        return;
    }
    let current = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        current == generated,
        "plugin-sdk/include/ferrocx_plugin.h is out of date with core/src/abi/: regenerate it with \
         `FERROCX_BLESS=1 cargo test -p ferrocx-plugin-sdk --test c_header` and commit it"
    );
}
