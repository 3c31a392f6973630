//! Runs checks one at a time: a panic inside a check (a bug of the kit, or a panic that unwound
//! out of an adaptor) ends that check only, and a listener hears each check begin and end (the
//! worker streams them to the driver, so a crash is pinned to the check it happened in).

use std::panic::{catch_unwind, AssertUnwindSafe};

use crate::boundary::{Mark, Verdict};
use crate::report::{Check, Outcome, Report};

/// Hears each check begin and end.
pub(crate) trait Listener {
    /// A check is about to run.
    fn begin(&mut self, group: &str, name: &str);
    /// A check ended.
    fn done(&mut self, check: &Check);
}

/// Runs checks into a report.
pub(crate) struct Runner<'l> {
    report: Report,
    listener: Option<&'l mut dyn Listener>,
}

impl<'l> Runner<'l> {
    /// A runner that reports to `listener`, if one.
    pub(crate) fn new(listener: Option<&'l mut dyn Listener>) -> Runner<'l> {
        Runner {
            report: Report::new(),
            listener,
        }
    }

    /// Runs one check; returns how it ended.
    pub(crate) fn check(
        &mut self,
        group: &str,
        name: impl Into<String>,
        body: impl FnOnce() -> Verdict,
    ) -> Outcome {
        let name = name.into();
        if let Some(l) = self.listener.as_deref_mut() {
            l.begin(group, &name);
        }
        let outcome = match catch_unwind(AssertUnwindSafe(body)) {
            Ok(Ok(())) => Outcome::Pass,
            Ok(Err(stop)) => stop.0,
            Err(payload) => {
                let what = payload
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| payload.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "a non-string payload".to_string());
                Outcome::Fail(format!("the check panicked: {what}"))
            }
        };
        self.record(group, name, outcome.clone());
        outcome
    }

    /// Records a check that was decided without running anything (a skip).
    pub(crate) fn record(&mut self, group: &str, name: impl Into<String>, outcome: Outcome) {
        let check = Check::new(group, name, outcome);
        if let Some(l) = self.listener.as_deref_mut() {
            l.done(&check);
        }
        self.report.push(check);
    }

    /// The two boundary checks of a part (`device`, `ccl`): no panic crossed it, and every
    /// failure since `mark` left a message in `get_last_error`.
    pub(crate) fn boundary(&mut self, part: &str, mark: Mark) {
        self.record(
            "abi",
            format!("no panic across the boundary ({part})"),
            mark.panics_since(),
        );
        self.record(
            "abi",
            format!("get_last_error set after each failure ({part})"),
            mark.messages_since(),
        );
    }

    /// The report so far.
    pub(crate) fn finish(self) -> Report {
        self.report
    }
}
