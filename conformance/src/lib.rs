//! The ferrocx conformance kit: one suite of checks that any adaptor, in-tree or not, runs to
//! show it keeps the ABI's contract.
//!
//! - **ABI**: every table's header (magic, version, `struct_size`, name), how the library was
//!   checked, `get_last_error`; and, over every call the other parts make, that no entry
//!   panicked across the boundary (`INTERNAL_ERROR` whose message says "panic") and that every
//!   failure left a message in `get_last_error`.
//! - **device**: memory round trips of every kind, `mem_set`, stream ordering of asynchronous
//!   copies and memsets, host functions, the event semantics of DESIGN.md (a wait follows the
//!   most recent record made before it; re-recording does not redirect it; an event never
//!   recorded is complete), `event_elapsed_ms`, the VMM, flat-map, multicast and graph groups
//!   when present, IPC between processes, and the error codes for bad arguments.
//! - **CCL**: every collective of the table against a reference on reproducible random data
//!   across N processes (sizes 0, 1, odd and about 1 MiB; several types and reductions),
//!   grouped point-to-point, buffer and window registration, bad arguments, and abort.
//!
//! An entry that is absent (`None`) makes its checks "skipped (absent)", not failures, except
//! the entries the suite needs to run at all: [`device::REQUIRED_ENTRIES`] for the device
//! checks, [`REQUIRED_DEVICE_ENTRIES`] and [`REQUIRED_CCL_ENTRIES`] for the CCL checks. A present
//! entry that returns `UNSUPPORTED` fails (the ABI's one way to say "not supported" is an
//! absent entry), except where support depends on what the vendor runtime offers at run time
//! (HOST/PINNED memory, IPC export, VMM allocation, flat reservation, the CCL's own memory,
//! registration, windows, timed events): there it is a skip.
//!
//! [`run`] drives a whole run, each part in worker processes (so a crash or hang of the adaptor
//! is reported against the check it happened in); [`check_abi`], [`check_device`] and
//! [`check_ccl_rank`] run one part in the calling process. `ferrocx conformance` is the
//! command-line front.
//!
//! From a plugin's own `cargo test`, one call builds the library, loads it and runs the kit
//! ([`build_plugin`], [`run_plugin`]; the SDK template's `tests/conformance.rs` is this):
//!
//! ```no_run
//! let plugin = ferrocx_conformance::build_plugin(env!("CARGO_MANIFEST_DIR"), env!("CARGO_PKG_NAME"))
//!     .expect("the plugin builds");
//! let report = ferrocx_conformance::run_plugin(&plugin, 2);
//! assert!(report.passed(), "{}", report.to_text());
//! ```
//!
//! The same by hand, for an adaptor already in a registry: the test re-runs its own executable
//! as the workers:
//!
//! ```no_run
//! use ferrocx::registry::Registry;
//! use ferrocx_conformance::{run, run_worker, Options, Target, WorkerCommand};
//!
//! #[test]
//! fn conformance() {
//!     let mut registry = Registry::empty();
//!     let entry = registry
//!         .add_plugin("target/debug/libferrocx_adaptor_myvendor.so".as_ref())
//!         .expect("the plugin loads");
//!     let target = Target::new(entry);
//!     if run_worker(&target).is_some() {
//!         return; // this process was one of the workers
//!     }
//!     let worker = WorkerCommand::this_test("conformance").expect("current_exe");
//!     let report = run(&target, &worker, &Options { ranks: 3, ..Options::default() });
//!     assert!(report.passed(), "{}", report.to_text());
//! }
//! ```

#![warn(missing_docs)]

mod abi;
mod boundary;
mod buffer;
mod ccl;
pub mod device;
mod driver;
mod plugin;
mod reference;
mod report;
mod runner;
mod target;
pub mod values;
mod worker;

pub use abi::check_abi;
pub use ccl::{check_ccl_rank, UniqueIds, REQUIRED_CCL_ENTRIES, REQUIRED_DEVICE_ENTRIES};
pub use device::check_device;
pub use driver::{run, Options, WorkerCommand};
pub use plugin::{build_plugin, run_plugin};
pub use report::{Check, Outcome, Report};
pub use target::Target;
pub use worker::{run_worker, Role, ENV_RANK, ENV_ROLE, ENV_TIMEOUT_MS, ENV_UNIQUE_IDS, ENV_WORLD};
