//! Fixtures for the workspace integration tests: the real plugin libraries the tests load.
//!
//! The C plugins are built by this package's build script; the Rust plugin is the cdylib of
//! `ferrocx-testplugin`, which cargo builds next to the test executables as a dependency.

use std::path::{Path, PathBuf};

/// The C plugin variants (see `plugins/c/testplugin.c`).
pub const C_VARIANTS: &[&str] = &[
    "testc",
    "newmajor",
    "v2only",
    "oldminor",
    "badmagic",
    "nosymbols",
    "undefined",
    "oddsize",
    "hugesize",
    "oddgroup",
    "negcount",
    "initcrash",
    "initexit",
    "initloop",
];

/// The file name of adaptor `name`'s plugin.
pub fn file_name(name: &str) -> String {
    format!("libferrocx_adaptor_{name}.so")
}

/// Path of a C plugin variant built by the build script.
pub fn c_plugin(variant: &str) -> PathBuf {
    assert!(
        C_VARIANTS.contains(&variant),
        "unknown C plugin variant {variant}"
    );
    Path::new(env!("FERROCX_TEST_C_PLUGINS")).join(file_name(variant))
}

/// Path of the Rust test plugin (`testrust`), built by cargo beside the running executable.
pub fn rust_plugin() -> PathBuf {
    beside_exe("testrust")
}

/// Path of the `offhost` test plugin (a device the host cannot address), built by cargo beside
/// the running executable.
pub fn offhost_plugin() -> PathBuf {
    beside_exe("offhost")
}

/// Path of the host adaptor's drop-in plugin, built by cargo beside the running executable.
pub fn host_plugin() -> PathBuf {
    beside_exe("host")
}

/// Path of the MPI CCL's drop-in plugin (with the host device it runs on), built by cargo beside
/// the running executable.
pub fn mpi_plugin() -> PathBuf {
    beside_exe("mpi")
}

fn beside_exe(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let dir = exe.parent().expect("executable has a directory");
    let candidates = [dir.to_path_buf(), dir.join("deps"), dir.join("../deps")];
    for c in &candidates {
        let p = c.join(file_name(name));
        if p.is_file() {
            return p;
        }
    }
    panic!(
        "{} not found beside {} (it is built as a dependency of ferrocx-tests)",
        file_name(name),
        exe.display()
    );
}

/// A temporary plugin directory holding copies of the given plugin files (under their own file
/// names) and, for each `(name, bytes)` in `raw`, a file with those contents.
pub fn plugin_dir(plugins: &[PathBuf], raw: &[(&str, &[u8])]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    for p in plugins {
        let name = p.file_name().expect("plugin file name");
        std::fs::copy(p, dir.path().join(name)).expect("copy plugin");
    }
    for (name, bytes) in raw {
        std::fs::write(dir.path().join(name), bytes).expect("write file");
    }
    dir
}
