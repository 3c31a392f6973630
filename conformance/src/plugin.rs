//! The kit from a plugin's own `cargo test`, in one call: build the crate's library, load it,
//! run every part (re-running the test executable as the workers), return the report.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

use ferrocx::registry::Registry;

use crate::driver::{run, Options, WorkerCommand};
use crate::report::Report;
use crate::target::Target;
use crate::worker::{run_worker, ENV_ROLE};

/// Builds the `cdylib` of the crate at `manifest_dir` (its `Cargo.toml`'s directory) whose
/// package is `package`, with the cargo running the test and into the test's own target
/// directory and profile, and returns the library's path
/// (`<target>/<profile>/libferrocx_adaptor_<name>.so`). `cargo test` does not build a
/// `cdylib`-only library itself, so a test that loads the plugin builds it first; an
/// up-to-date library costs one `cargo build` that does nothing.
///
/// Call it as `build_plugin(env!("CARGO_MANIFEST_DIR"), env!("CARGO_PKG_NAME"))`. In the
/// kit's worker processes it only returns the path (the driver built it).
pub fn build_plugin(manifest_dir: impl AsRef<Path>, package: &str) -> Result<PathBuf, String> {
    let exe = std::env::current_exe().map_err(|e| format!("the test's own path: {e}"))?;
    // <target>/<profile>/deps/<test>: the library goes to <target>/<profile>.
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .ok_or_else(|| format!("{} is not in <target>/<profile>/deps", exe.display()))?;
    let file = format!(
        "{}{}{}",
        std::env::consts::DLL_PREFIX,
        package.replace('-', "_"),
        std::env::consts::DLL_SUFFIX
    );
    let lib = profile_dir.join(file);
    if std::env::var_os(ENV_ROLE).is_some() {
        return Ok(lib);
    }
    let target_dir = profile_dir
        .parent()
        .ok_or_else(|| format!("{} has no parent", profile_dir.display()))?;
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(&cargo);
    cmd.arg("build")
        .arg("--lib")
        .arg("--manifest-path")
        .arg(manifest_dir.as_ref().join("Cargo.toml"))
        .arg("--target-dir")
        .arg(target_dir);
    match profile_dir.file_name().and_then(|n| n.to_str()) {
        Some("debug") | None => {}
        Some("release") => {
            cmd.arg("--release");
        }
        Some(other) => {
            cmd.args(["--profile", other]);
        }
    }
    let status = cmd
        .status()
        .map_err(|e| format!("could not run {}: {e}", Path::new(&cargo).display()))?;
    if !status.success() {
        return Err(format!(
            "`cargo build --lib` of {} failed ({status}); its errors are above",
            manifest_dir.as_ref().display()
        ));
    }
    if !lib.is_file() {
        return Err(format!(
            "`cargo build --lib` succeeded but {} is not there: is the library a `cdylib` named \
             after the package ({package})?",
            lib.display()
        ));
    }
    Ok(lib)
}

/// Loads the plugin library at `path` and runs the whole kit on it from a `#[test]`: the ABI
/// and device checks, then the CCL checks on `ranks` processes (fewer when the adaptor declares
/// a smaller maximum: the report then says so as "not claimed"). Returns the merged report;
/// assert on [`Report::passed`] and print [`Report::to_text`].
///
/// The kit runs each part in worker processes that re-run the test executable on the calling
/// test only (found by the test thread's name; a test file with this one test works under any
/// harness options). In such a worker this function runs the worker's part and exits the
/// process, so the test's code after it runs only in the driver.
///
/// Panics when the library does not load, with the loader's reason.
///
/// ```no_run
/// #[test]
/// fn conformance() {
///     let plugin = ferrocx_conformance::build_plugin(
///         env!("CARGO_MANIFEST_DIR"),
///         env!("CARGO_PKG_NAME"),
///     )
///     .expect("the plugin builds");
///     let report = ferrocx_conformance::run_plugin(&plugin, 2);
///     println!("{}", report.to_text());
///     assert!(report.passed(), "{}", report.to_text());
/// }
/// ```
pub fn run_plugin(path: impl AsRef<Path>, ranks: usize) -> Report {
    let path = path.as_ref();
    let mut registry = Registry::empty();
    let entry = registry
        .add_plugin(path)
        .unwrap_or_else(|e| panic!("the plugin {} does not load: {e}", path.display()));
    let target = Target::new(entry);
    if run_worker(&target).is_some() {
        // The worker's checks went to stdout, failures included: it ends as a test would.
        let _ = std::io::stdout().flush();
        std::process::exit(0);
    }
    let exe = std::env::current_exe().expect("the test's own path");
    let mut args: Vec<String> = Vec::new();
    if let Some(test) = std::thread::current().name().filter(|n| *n != "main") {
        args.extend([test.to_string(), "--exact".to_string()]);
    }
    args.extend(["--nocapture".to_string(), "--test-threads=1".to_string()]);
    let worker = WorkerCommand::new(exe, args);
    run(
        &target,
        &worker,
        &Options {
            ranks: ranks.max(1),
            ..Options::default()
        },
    )
}
