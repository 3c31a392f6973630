//! The worker side of a run: the driver starts a process with the `FERROCX_CONFORMANCE_*`
//! variables set; the process builds the same [`Target`] its parent tested and calls
//! [`run_worker`], which runs its part and writes each check to stdout as one marked JSON line
//! (other output on stdout is ignored by the driver).

use std::io::Write;
use std::time::Duration;

use ferrocx::abi::{AbiTable, DeviceAdaptorV1};
use serde_json::json;

use crate::boundary::{Stop, Verdict};
use crate::ccl::UniqueIds;
use crate::report::{Check, Outcome};
use crate::runner::{Listener, Runner};
use crate::target::Target;

/// Which part a worker runs: `device` (the ABI and device checks) or `rank` (one rank of the
/// CCL checks).
pub const ENV_ROLE: &str = "FERROCX_CONFORMANCE_ROLE";
/// The rank of a `rank` worker.
pub const ENV_RANK: &str = "FERROCX_CONFORMANCE_RANK";
/// The number of ranks.
pub const ENV_WORLD: &str = "FERROCX_CONFORMANCE_WORLD";
/// The unique ids, `main:abort` in hexadecimal.
pub const ENV_UNIQUE_IDS: &str = "FERROCX_CONFORMANCE_UNIQUE_IDS";
/// The communicators' timeout in milliseconds.
pub const ENV_TIMEOUT_MS: &str = "FERROCX_CONFORMANCE_TIMEOUT_MS";

/// Marks a line announcing a check (JSON `{"group", "name"}` follows).
pub(crate) const BEGIN: &str = "FERROCX_CONFORMANCE_BEGIN ";
/// Marks a line carrying a finished check (JSON of [`Check::to_json`] follows).
pub(crate) const CHECK: &str = "FERROCX_CONFORMANCE_CHECK ";
/// Marks the end of a worker's checks.
pub(crate) const END: &str = "FERROCX_CONFORMANCE_END";

/// A worker's part.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Role {
    /// The ABI and device checks.
    Device,
    /// One rank of the CCL checks.
    Rank {
        /// This process's rank.
        rank: usize,
        /// Number of ranks.
        world: usize,
        /// The communicators' unique ids.
        ids: UniqueIds,
        /// The communicators' timeout.
        timeout: Duration,
    },
}

impl Role {
    /// The role the environment gives this process: `Ok(None)` when it is not a worker.
    pub fn from_env() -> Result<Option<Role>, String> {
        let var = |k: &str| std::env::var(k).ok();
        let Some(role) = var(ENV_ROLE) else {
            return Ok(None);
        };
        match role.as_str() {
            "device" => Ok(Some(Role::Device)),
            "rank" => {
                let num = |k: &str| -> Result<usize, String> {
                    var(k)
                        .and_then(|v| v.parse().ok())
                        .ok_or_else(|| format!("{k} is missing or not a number"))
                };
                let (rank, world) = (num(ENV_RANK)?, num(ENV_WORLD)?);
                if rank >= world {
                    return Err(format!("{ENV_RANK}={rank} is not a rank of {world}"));
                }
                let ids = var(ENV_UNIQUE_IDS)
                    .and_then(|v| UniqueIds::from_hex(&v))
                    .ok_or_else(|| format!("{ENV_UNIQUE_IDS} is missing or malformed"))?;
                let timeout = Duration::from_millis(num(ENV_TIMEOUT_MS)? as u64);
                Ok(Some(Role::Rank {
                    rank,
                    world,
                    ids,
                    timeout,
                }))
            }
            other => Err(format!("{ENV_ROLE}={other:?}: expected device or rank")),
        }
    }

    /// The environment that gives a process this role.
    pub(crate) fn env(&self) -> Vec<(&'static str, String)> {
        match self {
            Role::Device => vec![(ENV_ROLE, "device".into())],
            Role::Rank {
                rank,
                world,
                ids,
                timeout,
            } => vec![
                (ENV_ROLE, "rank".into()),
                (ENV_RANK, rank.to_string()),
                (ENV_WORLD, world.to_string()),
                (ENV_UNIQUE_IDS, ids.to_hex()),
                (ENV_TIMEOUT_MS, timeout.as_millis().to_string()),
            ],
        }
    }
}

/// Writes each check to stdout as it begins and ends.
struct Stdout;

impl Stdout {
    fn line(text: &str) {
        // A closed stdout must not stop the worker (println! would panic); the driver then
        // sees a missing end marker.
        let mut out = std::io::stdout().lock();
        // A leading newline keeps the marker at the start of a line whatever the adaptor
        // printed before it.
        let _ = out.write_all(format!("\n{text}\n").as_bytes());
        let _ = out.flush();
    }
}

impl Listener for Stdout {
    fn begin(&mut self, group: &str, name: &str) {
        Stdout::line(&format!("{BEGIN}{}", json!({"group": group, "name": name})));
    }
    fn done(&mut self, check: &Check) {
        Stdout::line(&format!("{CHECK}{}", check.to_json()));
    }
}

/// If the environment makes this process a worker, runs its part against `target`, writes
/// the checks to stdout and returns `Some(true)` when none failed; returns `None` at once in
/// any other process.
///
/// A test that drives the suite calls it first, so the same test function is the driver in
/// the parent process and the worker in the processes the driver starts:
///
/// ```no_run
/// # fn entry() -> &'static ferrocx::registry::AdaptorEntry { unimplemented!() }
/// use ferrocx_conformance::{run, run_worker, Options, Target, WorkerCommand};
///
/// #[test]
/// fn conformance() {
///     let target = Target::new(entry());
///     if run_worker(&target).is_some() {
///         return;
///     }
///     let worker = WorkerCommand::this_test("conformance").expect("current_exe");
///     let report = run(&target, &worker, &Options::default());
///     assert!(report.passed(), "{}", report.to_text());
/// }
/// ```
pub fn run_worker(target: &Target<'_>) -> Option<bool> {
    let role = match Role::from_env() {
        Ok(None) => return None,
        Ok(Some(role)) => role,
        Err(e) => {
            let c = Check::new("run", "worker environment", Outcome::Fail(e));
            Stdout.done(&c);
            Stdout::line(END);
            return Some(false);
        }
    };
    let mut listener = Stdout;
    let mut r = Runner::new(Some(&mut listener));
    match role {
        Role::Device => {
            crate::abi::run(&mut r, target.entry());
            match target.device() {
                Some(dev) => {
                    crate::device::run(&mut r, &dev);
                    r.check("device", "finalize", || finalize_device(&dev));
                }
                None => r.record(
                    "device",
                    "device checks",
                    Outcome::absent(DeviceAdaptorV1::SYMBOL),
                ),
            }
        }
        Role::Rank {
            rank,
            world,
            ids,
            timeout,
        } => match (target.ccl_device(), target.ccl()) {
            (Some(dev), Some(ccl)) => {
                crate::ccl::run(&mut r, &dev, &ccl, rank, world, &ids, timeout);
                r.check("ccl", "finalize", || {
                    let api = crate::boundary::CclApi::new(&ccl);
                    crate::boundary::raw_call!(api, api.root(), finalize()).map_err(Stop::from)
                });
                r.check("device", "finalize", || finalize_device(&dev));
            }
            _ => r.record(
                "ccl",
                "CCL checks",
                Outcome::Fail("this worker's target has no CCL or no device to run it on".into()),
            ),
        },
    }
    let report = r.finish();
    Stdout::line(END);
    Some(report.passed())
}

fn finalize_device(dev: &ferrocx::adaptor::Device) -> Verdict {
    let api = crate::boundary::DeviceApi::new(dev);
    crate::boundary::raw_call!(api, api.root(), finalize())?;
    Ok(())
}
