//! `ferrocx`: the command-line front of ferrocx.
//!
//! - `ferrocx info [--config FILE] [--json]`: every adaptor found (built-in or plugin path), its
//!   ABI version, groups, capabilities, and whether each cluster selected it or why not; every
//!   plugin refused, with the reason.
//! - `ferrocx config check FILE [--json]`: validates a configuration and prints what each
//!   cluster would use.
//! - `ferrocx launch -n N [--master-addr A] [--master-port P] [--timeout-s S] -- CMD ARGS...`:
//!   N ranks of CMD on this host with torchrun's environment and a job store.
//! - `ferrocx bench [-n N] [--op OP|all] [-b MIN] [-e MAX] [-f F] ...`: an nccl-tests-style
//!   table (or `--json`, `--plot FILE.svg`) of each collective's time and bandwidth.

mod bench;
mod check;
mod conformance;
mod info;
mod launch;
mod probe;
mod report;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use ferrocx::config::{Config, ConfigError};

#[derive(Parser)]
#[command(
    name = "ferrocx",
    version,
    about = "ferrocx: vendor-neutral collective communication"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// List every adaptor found (built-in and plugins), their groups and capabilities, which
    /// cluster selects each, and every plugin refused with the reason.
    Info {
        /// Configuration file (default: $FERROCX_CONFIG, else the built-in local config).
        #[arg(long)]
        config: Option<PathBuf>,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
        /// Probe only this adaptor and print its JSON (the child process `info` runs per
        /// adaptor).
        #[arg(long, hide = true, value_name = "NAME")]
        probe: Option<String>,
    },
    /// Work with configuration files.
    Config {
        #[command(subcommand)]
        command: ConfigCommand,
    },
    /// Start N ranks of a command on this host, with torchrun's environment (RANK, WORLD_SIZE,
    /// LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT) and a job store the launcher
    /// hosts.
    Launch(launch::LaunchArgs),
    /// Measure the collectives, as nccl-tests: time, algorithm and bus bandwidth per size,
    /// every result checked (`-n N` starts N ranks through `ferrocx launch`).
    Bench(bench::BenchArgs),
    /// Run the conformance kit against an adaptor (`--plugin PATH` or `--adaptor NAME`): ABI,
    /// device and CCL checks on `--ranks N` processes; a pass/fail table, exit 1 on a failure.
    Conformance(conformance::ConformanceArgs),
}

#[derive(Subcommand)]
enum ConfigCommand {
    /// Validate a configuration and print what each cluster would use.
    Check {
        /// The TOML file.
        file: PathBuf,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
        /// Also print the clusters, the bridge and the all-reduce plan of a job of N ranks.
        #[arg(long, value_name = "N")]
        world: Option<usize>,
    },
}

/// The configuration `--config` names, else `FERROCX_CONFIG`, else the local default, with the
/// environment's overrides applied. Warnings (e.g. a kill-switch overriding the file) are logged.
pub(crate) fn load_config(path: Option<&PathBuf>) -> Result<Config, ConfigError> {
    let lookup = |k: &str| std::env::var(k).ok();
    let (config, warnings) = match path {
        Some(p) => {
            let mut c = Config::load(p)?;
            let w = c.apply_env(lookup)?;
            (c, w)
        }
        None => Config::from_env(lookup)?,
    };
    for w in warnings {
        tracing::warn!("{w}");
    }
    Ok(config)
}

fn init_logging() {
    use tracing_subscriber::EnvFilter;
    // FERROCX_LOG takes a level (error|warn|info|debug|trace) or a full filter; WARN by default
    // so refused plugins and fallbacks are seen.
    let filter = std::env::var("FERROCX_LOG")
        .ok()
        .and_then(|v| EnvFilter::try_new(v).ok())
        .unwrap_or_else(|| EnvFilter::new("warn"));
    use std::io::IsTerminal;
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_target(false)
        .without_time()
        .init();
}

fn main() -> ExitCode {
    // The host backend is built in: it runs on any machine.
    ferrocx_adaptor_host::link();
    // The MPI CCL is built in too: it opens an MPI library only when a cluster uses it.
    ferrocx_adaptor_mpi::link();
    // The window collectives (`Communicator::all_reduce_window`, `bench --algo window`).
    ferrocx_kernels::link();
    #[cfg(feature = "cuda")]
    ferrocx_adaptor_cuda::link();
    #[cfg(feature = "cuda")]
    ferrocx_adaptor_nccl::link();
    let cli = Cli::parse();
    init_logging();
    let result = match cli.command {
        Command::Info {
            config,
            probe: Some(name),
            ..
        } => probe::child(config.as_ref(), &name),
        Command::Info { config, json, .. } => info::run(config.as_ref(), json),
        Command::Config {
            command: ConfigCommand::Check { file, json, world },
        } => check::run(&file, json, world),
        Command::Launch(args) => launch::run(args),
        Command::Bench(args) => bench::run(args),
        Command::Conformance(args) => conformance::run_command(args),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("ferrocx: {e}");
            ExitCode::FAILURE
        }
    }
}
