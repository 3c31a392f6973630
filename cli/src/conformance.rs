//! `ferrocx conformance`: the conformance kit against one adaptor, in-tree or not.
//!
//! `--plugin PATH` loads that library into an empty registry (a plugin named like a built-in is
//! tested, not the built-in); `--adaptor NAME` takes a registered adaptor (built-in, or a plugin
//! of `FERROCX_PLUGIN_PATH` / the configuration). The checks run in worker processes: this same
//! executable re-run as `ferrocx conformance --worker ...`, with the part, rank and unique ids
//! in the `FERROCX_CONFORMANCE_*` variables. Prints a pass/fail table (or `--json`); exits 0
//! when no check failed, 1 otherwise (a plugin that does not load is a failure, with the
//! loader's reason), 2 for usage errors.

use std::ffi::OsString;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::ArgGroup;
use ferrocx::adaptor::Device;
use ferrocx::registry::{AdaptorEntry, Registry, Source};
use ferrocx_conformance::{
    run, run_worker, Check, Options, Outcome, Report, Target, WorkerCommand,
};

/// Exit code of invalid arguments (as clap's own usage errors).
const USAGE_EXIT: u8 = 2;

/// Arguments of `ferrocx conformance`.
#[derive(clap::Args, Debug, Clone)]
#[command(group(ArgGroup::new("under_test").required(true).args(["plugin", "adaptor"])))]
pub struct ConformanceArgs {
    /// The plugin library to test (`libferrocx_adaptor_<name>.so`), loaded on its own.
    #[arg(long, value_name = "PATH")]
    pub plugin: Option<PathBuf>,
    /// A registered adaptor to test: built in, or found through FERROCX_PLUGIN_PATH or the
    /// configuration.
    #[arg(long, value_name = "NAME")]
    pub adaptor: Option<String>,
    /// For an adaptor with a CCL but no device table: the registered device adaptor its CCL
    /// runs on (as NCCL's runs on CUDA's).
    #[arg(long, value_name = "NAME")]
    pub device: Option<String>,
    /// Ranks (processes) of the CCL checks.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub ranks: u32,
    /// Deadline of every wait on a peer, in milliseconds.
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub timeout_ms: u64,
    /// Print a JSON document instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Run as a worker of a run (what `ferrocx conformance` starts).
    #[arg(long, hide = true)]
    pub worker: bool,
}

fn usage_error(msg: &str) -> ExitCode {
    let _ = writeln!(std::io::stderr(), "ferrocx conformance: {msg}");
    ExitCode::from(USAGE_EXIT)
}

/// Runs `ferrocx conformance`.
pub fn run_command(args: ConformanceArgs) -> Result<ExitCode, Box<dyn std::error::Error>> {
    let mut registry = Registry::empty();
    let discovered;
    let entry: &AdaptorEntry = match (&args.plugin, &args.adaptor) {
        (Some(path), _) => match registry.add_plugin(path) {
            Ok(e) => e,
            Err(e) => {
                if args.worker {
                    return Ok(usage_error(&format!("the plugin does not load: {e}")));
                }
                let report = Report {
                    checks: vec![Check::new(
                        "load",
                        "the plugin loads",
                        Outcome::Fail(e.to_string()),
                    )],
                };
                print(&args, &report, "?", &path.display().to_string(), "?");
                return Ok(ExitCode::FAILURE);
            }
        },
        (None, Some(name)) => {
            discovered = match discover() {
                Ok(r) => r,
                Err(msg) => return Ok(usage_error(&msg)),
            };
            match discovered.entries().iter().find(|e| &e.name == name) {
                Some(e) => e,
                None => {
                    let names: Vec<&str> = discovered
                        .entries()
                        .iter()
                        .map(|e| e.name.as_str())
                        .collect();
                    return Ok(usage_error(&format!(
                        "no adaptor named {name:?} is registered ({}); available: {}",
                        discovered.why_missing(name),
                        names.join(", ")
                    )));
                }
            }
        }
        (None, None) => return Ok(usage_error("give --plugin PATH or --adaptor NAME")),
    };
    let paired: Option<Device> = match &args.device {
        None => None,
        Some(name) => {
            let found = discover().map_err(|m| m.to_string()).and_then(|r| {
                r.device(name)
                    .and_then(AdaptorEntry::device)
                    .ok_or_else(|| format!("no device adaptor named {name:?} is registered"))
            });
            match found {
                Ok(d) => Some(d),
                Err(msg) => return Ok(usage_error(&msg)),
            }
        }
    };
    let mut target = Target::new(entry);
    if let Some(d) = &paired {
        target = target.with_device(d);
    }

    if args.worker {
        return Ok(match run_worker(&target) {
            // The checks went to stdout; the driver judges them.
            Some(_) => ExitCode::SUCCESS,
            None => usage_error("--worker is for the processes `ferrocx conformance` starts"),
        });
    }

    let exe = std::env::current_exe()?;
    let worker = WorkerCommand::new(exe, worker_args(&args));
    let options = Options {
        ranks: args.ranks as usize,
        timeout: Duration::from_millis(args.timeout_ms),
    };
    let report = run(&target, &worker, &options);
    let source = match &entry.source {
        Source::Builtin => "built-in".to_string(),
        Source::Plugin(p) => p.display().to_string(),
    };
    let (major, minor) = entry.abi_version();
    print(
        &args,
        &report,
        &entry.name,
        &source,
        &format!("{major}.{minor}"),
    );
    Ok(if report.passed() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// The registry `--adaptor` and `--device` look in: built-ins and the configured plugins.
fn discover() -> Result<Registry, String> {
    let config = crate::load_config(None).map_err(|e| e.to_string())?;
    Ok(Registry::discover(&config.runtime))
}

/// The arguments a worker gets (after the executable): the same adaptor, loaded the same way.
fn worker_args(args: &ConformanceArgs) -> Vec<OsString> {
    let mut a: Vec<OsString> = vec!["conformance".into(), "--worker".into()];
    if let Some(p) = &args.plugin {
        a.push("--plugin".into());
        a.push(absolute(p).into_os_string());
    }
    if let Some(n) = &args.adaptor {
        a.push("--adaptor".into());
        a.push(n.into());
    }
    if let Some(d) = &args.device {
        a.push("--device".into());
        a.push(d.into());
    }
    a
}

fn absolute(p: &Path) -> PathBuf {
    std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf())
}

fn print(args: &ConformanceArgs, report: &Report, name: &str, source: &str, abi: &str) {
    let text = if args.json {
        let mut doc = report.to_json();
        doc["source"] = source.into();
        doc["abi"] = abi.into();
        doc["ranks"] = args.ranks.into();
        doc["timeout_ms"] = args.timeout_ms.into();
        doc["adaptor"] = name.into();
        format!("{doc:#}\n")
    } else {
        format!(
            "ferrocx conformance: adaptor {name:?} ({source}), ABI {abi}, {} rank(s), timeout {} ms\n\n{}",
            args.ranks,
            args.timeout_ms,
            report.to_text()
        )
    };
    let _ = std::io::stdout().lock().write_all(text.as_bytes());
}
