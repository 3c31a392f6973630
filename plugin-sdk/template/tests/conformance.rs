//! The ferrocx conformance kit on this plugin, from `cargo test`: it builds the plugin's
//! library, loads it, and runs every check an adaptor runs (the ABI, the device, and the CCL on
//! `RANKS` processes). It passes while every entry is absent (nothing is claimed), and keeps
//! passing as each one is implemented and removed from the absent lists, as long as it
//! behaves as the ABI says. `cargo test -- --nocapture` prints the report: one line per check,
//! with the reason of each skip ("absent", "not claimed") or failure.
//!
//! The kit re-runs this test executable as its worker processes (one for the device part, one
//! per rank): keep this the only test of this file.

/// Ranks (processes) of the CCL checks; a CCL whose `LIMITS` declare fewer runs on its maximum.
const RANKS: usize = 2;

#[test]
fn conformance() {
    let plugin =
        ferrocx_conformance::build_plugin(env!("CARGO_MANIFEST_DIR"), env!("CARGO_PKG_NAME"))
            .unwrap_or_else(|e| panic!("{e}"));
    let report = ferrocx_conformance::run_plugin(&plugin, RANKS);
    println!("{}", report.to_text());
    assert!(report.passed(), "{}", report.to_text());
}
