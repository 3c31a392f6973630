//! Builds the C test plugins from `plugins/c/testplugin.c` (loader tests) and
//! `plugins/c/abiplugin.c` (ABI evolution tests) and the generated header, with the system C
//! compiler, one `.so` per variant, into `$OUT_DIR/c-plugins`.

use std::path::PathBuf;
use std::process::Command;

const VARIANTS: &[(&str, &[&str])] = &[
    ("testc", &[]),
    ("newmajor", &["-DFX_MAJOR=2", "-DFX_NAME=\"newmajor\""]),
    ("v2only", &["-DFX_ONLY_V2", "-DFX_NAME=\"v2only\""]),
    ("oldminor", &["-DFX_OLD_MINOR", "-DFX_NAME=\"oldminor\""]),
    ("badmagic", &["-DFX_BAD_MAGIC", "-DFX_NAME=\"badmagic\""]),
    ("nosymbols", &["-DFX_NO_SYMBOLS"]),
    ("undefined", &["-DFX_UNDEFINED", "-DFX_NAME=\"undefined\""]),
    // Hostile inputs: table sizes that are not whole entries or absurdly large, and `init`s
    // that crash, exit or never return.
    (
        "oddsize",
        &["-DFX_DEVICE_SIZE_BYTES=52", "-DFX_NAME=\"oddsize\""],
    ),
    (
        "hugesize",
        &["-DFX_DEVICE_SIZE_BYTES=1048576", "-DFX_NAME=\"hugesize\""],
    ),
    (
        "oddgroup",
        &["-DFX_GROUP_SIZE_BYTES=36", "-DFX_NAME=\"oddgroup\""],
    ),
    (
        "negcount",
        &["-DFX_DEVICE_COUNT=-5", "-DFX_NAME=\"negcount\""],
    ),
    ("initcrash", &["-DFX_INIT_CRASH", "-DFX_NAME=\"initcrash\""]),
    ("initexit", &["-DFX_INIT_EXIT", "-DFX_NAME=\"initexit\""]),
    ("initloop", &["-DFX_INIT_LOOP", "-DFX_NAME=\"initloop\""]),
];

/// Variants of `plugins/c/abiplugin.c`: one table per ABI version.
const ABI_VARIANTS: &[(&str, &[&str])] = &[
    ("abi10", &["-DFX_ABI_1_0", "-DFX_NAME=\"abi10\""]),
    ("abi11", &["-DFX_NAME=\"abi11\""]),
    ("abi17", &["-DFX_ABI_1_7", "-DFX_NAME=\"abi17\""]),
    ("twomajors", &["-DFX_TWO_MAJORS", "-DFX_NAME=\"twomajors\""]),
];

fn main() {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let source = manifest.join("plugins/c/testplugin.c");
    let abi_source = manifest.join("plugins/c/abiplugin.c");
    let include = manifest.join("../plugin-sdk/include");
    println!("cargo:rerun-if-changed={}", source.display());
    println!("cargo:rerun-if-changed={}", abi_source.display());
    println!(
        "cargo:rerun-if-changed={}",
        include.join("ferrocx_plugin.h").display()
    );
    println!("cargo:rerun-if-env-changed=CC");

    let out = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR")).join("c-plugins");
    std::fs::create_dir_all(&out).expect("create c-plugins dir");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_string());
    let builds = VARIANTS
        .iter()
        .map(|v| (&source, v))
        .chain(ABI_VARIANTS.iter().map(|v| (&abi_source, v)));
    for (source, (name, defines)) in builds {
        let so = out.join(format!("libferrocx_adaptor_{name}.so"));
        let status = Command::new(&cc)
            .args([
                "-std=c11", "-Wall", "-Wextra", "-Werror", "-shared", "-fPIC", "-O1",
            ])
            .args(*defines)
            .arg("-I")
            .arg(&include)
            .arg(source)
            .arg("-o")
            .arg(&so)
            .status()
            .unwrap_or_else(|e| panic!("could not run the C compiler `{cc}`: {e}"));
        assert!(
            status.success(),
            "`{cc}` failed on {} ({name})",
            source.display()
        );
    }
    println!("cargo:rustc-env=FERROCX_TEST_C_PLUGINS={}", out.display());
}
