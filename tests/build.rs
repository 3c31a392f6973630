//! Builds the C test plugins from `plugins/c/testplugin.c` and the generated header, with the
//! system C compiler, one `.so` per variant, into `$OUT_DIR/c-plugins`.

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
];

fn main() {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let source = manifest.join("plugins/c/testplugin.c");
    let include = manifest.join("../plugin-sdk/include");
    println!("cargo:rerun-if-changed={}", source.display());
    println!(
        "cargo:rerun-if-changed={}",
        include.join("ferrocx_plugin.h").display()
    );
    println!("cargo:rerun-if-env-changed=CC");

    let out = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR")).join("c-plugins");
    std::fs::create_dir_all(&out).expect("create c-plugins dir");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_string());
    for (name, defines) in VARIANTS {
        let so = out.join(format!("libferrocx_adaptor_{name}.so"));
        let status = Command::new(&cc)
            .args([
                "-std=c11", "-Wall", "-Wextra", "-Werror", "-shared", "-fPIC", "-O1",
            ])
            .args(*defines)
            .arg("-I")
            .arg(&include)
            .arg(&source)
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
