//! The outcome of a run: one [`Check`] per thing checked, rendered as a text table or JSON, and
//! merged across the processes of a run.

use std::fmt::Write as _;

use serde_json::{json, Value};

/// The reason prefix of a check skipped because an entry or table is absent (`None`).
const ABSENT: &str = "absent: ";
/// The reason prefix of a check skipped because it lies outside the CCL's declared limits.
const NOT_CLAIMED: &str = "not claimed: ";

/// How one check ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The adaptor did what the ABI says.
    Pass,
    /// It did not; the reason says what happened and what was expected.
    Fail(String),
    /// The check did not run: an entry is absent, the adaptor declined an optional feature at
    /// run time, or a check it depends on failed.
    Skip(String),
}

impl Outcome {
    /// A skip because the named entries or tables are absent.
    pub fn absent(what: &str) -> Outcome {
        Outcome::Skip(format!("{ABSENT}{what}"))
    }

    /// A skip because the check lies outside what the adaptor declares it supports (its CCL
    /// limits: world size, data type, reduction): "not claimed", which is not a failure.
    pub fn not_claimed(what: &str) -> Outcome {
        Outcome::Skip(format!("{NOT_CLAIMED}{what}"))
    }

    /// `true` for a skip outside the adaptor's declared limits.
    pub fn is_not_claimed(&self) -> bool {
        matches!(self, Outcome::Skip(r) if r.starts_with(NOT_CLAIMED))
    }

    /// `true` for a skip caused by an absent entry or table.
    pub fn is_absent(&self) -> bool {
        matches!(self, Outcome::Skip(r) if r.starts_with(ABSENT))
    }

    /// `true` for [`Outcome::Fail`].
    pub fn is_fail(&self) -> bool {
        matches!(self, Outcome::Fail(_))
    }

    /// The reason, empty for a pass.
    pub fn reason(&self) -> &str {
        match self {
            Outcome::Pass => "",
            Outcome::Fail(r) | Outcome::Skip(r) => r,
        }
    }

    /// The result column of the text table: `pass`, `FAIL`, `skipped (absent)`, `not claimed`
    /// or `skipped`.
    pub fn label(&self) -> &'static str {
        match self {
            Outcome::Pass => "pass",
            Outcome::Fail(_) => "FAIL",
            o if o.is_absent() => "skipped (absent)",
            o if o.is_not_claimed() => "not claimed",
            Outcome::Skip(_) => "skipped",
        }
    }

    fn kind(&self) -> &'static str {
        match self {
            Outcome::Pass => "pass",
            Outcome::Fail(_) => "fail",
            Outcome::Skip(_) => "skip",
        }
    }
}

/// One named check and how it ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Check {
    /// What part of the contract it covers: `abi`, `device`, `ccl` or `run`.
    pub group: String,
    /// What it checks, e.g. `all_reduce f32 sum`.
    pub name: String,
    /// How it ended.
    pub outcome: Outcome,
}

impl Check {
    /// A check of `group` named `name`.
    pub fn new(group: impl Into<String>, name: impl Into<String>, outcome: Outcome) -> Check {
        Check {
            group: group.into(),
            name: name.into(),
            outcome,
        }
    }

    /// The check as a JSON object: `{"group", "name", "outcome": "pass"|"fail"|"skip", "reason"}`.
    pub fn to_json(&self) -> Value {
        json!({
            "group": self.group,
            "name": self.name,
            "outcome": self.outcome.kind(),
            "absent": self.outcome.is_absent(),
            "not_claimed": self.outcome.is_not_claimed(),
            "reason": self.outcome.reason(),
        })
    }

    /// Reads a check written by [`Check::to_json`]; `None` for anything else.
    pub fn from_json(v: &Value) -> Option<Check> {
        let text = |k: &str| v.get(k).and_then(Value::as_str).map(str::to_string);
        let reason = text("reason").unwrap_or_default();
        let outcome = match text("outcome")?.as_str() {
            "pass" => Outcome::Pass,
            "fail" => Outcome::Fail(reason),
            "skip" => Outcome::Skip(reason),
            _ => return None,
        };
        Some(Check::new(text("group")?, text("name")?, outcome))
    }

    fn key(&self) -> (&str, &str) {
        (&self.group, &self.name)
    }
}

/// The checks of a run, in the order they ran.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Report {
    /// Every check, in order.
    pub checks: Vec<Check>,
}

impl Report {
    /// An empty report.
    pub fn new() -> Report {
        Report::default()
    }

    /// Appends a check.
    pub fn push(&mut self, check: Check) {
        self.checks.push(check);
    }

    /// Appends every check of `other`.
    pub fn extend(&mut self, other: Report) {
        self.checks.extend(other.checks);
    }

    /// `true` when no check failed.
    pub fn passed(&self) -> bool {
        !self.checks.iter().any(|c| c.outcome.is_fail())
    }

    /// The failed checks.
    pub fn failures(&self) -> Vec<&Check> {
        self.checks.iter().filter(|c| c.outcome.is_fail()).collect()
    }

    /// The check of `group` named `name`, if one ran.
    pub fn find(&self, group: &str, name: &str) -> Option<&Check> {
        self.checks.iter().find(|c| c.key() == (group, name))
    }

    /// `(passed, failed, skipped)`.
    pub fn counts(&self) -> (usize, usize, usize) {
        let mut n = (0, 0, 0);
        for c in &self.checks {
            match c.outcome {
                Outcome::Pass => n.0 += 1,
                Outcome::Fail(_) => n.1 += 1,
                Outcome::Skip(_) => n.2 += 1,
            }
        }
        n
    }

    /// Merges the reports of several processes (`label` names each: `rank 2`, `device worker`)
    /// into one: checks of the same group and name become one, which fails if it failed in any
    /// process (the reason names where), passes if it passed in some and failed in none, and is
    /// skipped only when skipped everywhere.
    pub fn merge(parts: Vec<(String, Report)>) -> Report {
        let mut order: Vec<(String, String)> = Vec::new();
        let mut seen: Vec<Vec<(String, Outcome)>> = Vec::new();
        for (label, report) in parts {
            for c in report.checks {
                let key = (c.group.clone(), c.name.clone());
                let i = match order.iter().position(|k| *k == key) {
                    Some(i) => i,
                    None => {
                        order.push(key);
                        seen.push(Vec::new());
                        order.len() - 1
                    }
                };
                seen[i].push((label.clone(), c.outcome));
            }
        }
        let checks = order
            .into_iter()
            .zip(seen)
            .map(|((group, name), outcomes)| Check::new(group, name, combine(&outcomes)))
            .collect();
        Report { checks }
    }

    /// The text table: one line per check with its result and reason, then a summary line.
    pub fn to_text(&self) -> String {
        let gw = col_width(self.checks.iter().map(|c| c.group.len()), "GROUP");
        let nw = col_width(self.checks.iter().map(|c| c.name.len()), "CHECK");
        let rw = col_width(
            self.checks.iter().map(|c| c.outcome.label().len()),
            "RESULT",
        );
        let mut out = String::new();
        let _ = writeln!(
            out,
            "{:gw$}  {:nw$}  {:rw$}  REASON",
            "GROUP", "CHECK", "RESULT"
        );
        for c in &self.checks {
            let line = format!(
                "{:gw$}  {:nw$}  {:rw$}  {}",
                c.group,
                c.name,
                c.outcome.label(),
                c.outcome.reason().replace('\n', " ")
            );
            let _ = writeln!(out, "{}", line.trim_end());
        }
        let (p, f, s) = self.counts();
        let absent = self.checks.iter().filter(|c| c.outcome.is_absent()).count();
        let unclaimed = self
            .checks
            .iter()
            .filter(|c| c.outcome.is_not_claimed())
            .count();
        let _ = writeln!(
            out,
            "{p} passed, {f} failed, {s} skipped ({absent} absent, {unclaimed} not claimed): {}",
            if f == 0 {
                "CONFORMANT"
            } else {
                "NOT CONFORMANT"
            }
        );
        out
    }

    /// The report as JSON: `{"checks": [...], "passed", "failed", "skipped", "ok"}`.
    pub fn to_json(&self) -> Value {
        let (p, f, s) = self.counts();
        json!({
            "checks": self.checks.iter().map(Check::to_json).collect::<Vec<_>>(),
            "passed": p,
            "failed": f,
            "skipped": s,
            "ok": f == 0,
        })
    }
}

fn col_width(lens: impl Iterator<Item = usize>, title: &str) -> usize {
    lens.max().unwrap_or(0).max(title.len())
}

/// One outcome for a check seen in several processes.
fn combine(outcomes: &[(String, Outcome)]) -> Outcome {
    let single = outcomes.len() == 1;
    let fails: Vec<(&str, &str)> = outcomes
        .iter()
        .filter(|(_, o)| o.is_fail())
        .map(|(l, o)| (l.as_str(), o.reason()))
        .collect();
    if !fails.is_empty() {
        if single {
            return outcomes[0].1.clone();
        }
        return Outcome::Fail(group_reasons(&fails));
    }
    if outcomes.iter().any(|(_, o)| *o == Outcome::Pass) {
        return Outcome::Pass;
    }
    // Skipped everywhere: the reasons usually agree; keep the last (a part that ran later,
    // as the CCL part's IPC check after the device part's placeholder row, knows more).
    outcomes
        .last()
        .map(|(_, o)| o.clone())
        .unwrap_or(Outcome::Skip("not run".into()))
}

/// `rank 0, rank 2: reason; rank 1: other reason` — identical reasons are listed once.
fn group_reasons(fails: &[(&str, &str)]) -> String {
    let mut groups: Vec<(Vec<&str>, &str)> = Vec::new();
    for (label, reason) in fails {
        match groups.iter_mut().find(|(_, r)| r == reason) {
            Some((labels, _)) => labels.push(label),
            None => groups.push((vec![label], reason)),
        }
    }
    groups
        .iter()
        .map(|(labels, reason)| format!("{}: {reason}", labels.join(", ")))
        .collect::<Vec<_>>()
        .join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(checks: &[(&str, Outcome)]) -> Report {
        Report {
            checks: checks
                .iter()
                .map(|(n, o)| Check::new("ccl", *n, o.clone()))
                .collect(),
        }
    }

    #[test]
    fn a_check_failed_on_any_rank_fails_and_names_the_ranks() {
        let a = report(&[
            ("x", Outcome::Pass),
            ("y", Outcome::Fail("bad".into())),
            ("z", Outcome::absent("`send`")),
        ]);
        let b = report(&[
            ("x", Outcome::Fail("wrong".into())),
            ("y", Outcome::Fail("bad".into())),
            ("z", Outcome::absent("`send`")),
        ]);
        let m = Report::merge(vec![("rank 0".into(), a), ("rank 1".into(), b)]);
        assert_eq!(m.checks.len(), 3);
        assert_eq!(m.checks[0].outcome, Outcome::Fail("rank 1: wrong".into()));
        assert_eq!(
            m.checks[1].outcome,
            Outcome::Fail("rank 0, rank 1: bad".into())
        );
        assert!(m.checks[2].outcome.is_absent());
        assert!(!m.passed());
        assert_eq!(m.counts(), (0, 2, 1));
    }

    #[test]
    fn text_and_json_carry_every_check() {
        let r = report(&[
            ("all_reduce f32 sum", Outcome::Pass),
            ("send", Outcome::absent("`send`")),
            ("abort", Outcome::Fail("hung".into())),
            ("all_reduce f64 sum", Outcome::not_claimed("f64")),
        ]);
        let t = r.to_text();
        assert!(t.contains("skipped (absent)"), "{t}");
        assert!(t.contains("not claimed       not claimed: f64"), "{t}");
        assert!(t.contains("FAIL"), "{t}");
        assert!(
            t.contains("1 passed, 1 failed, 2 skipped (1 absent, 1 not claimed)"),
            "{t}"
        );
        let j = r.to_json();
        assert_eq!(j["failed"], 1);
        let back: Vec<Check> = j["checks"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(Check::from_json)
            .collect();
        assert_eq!(back, r.checks);
    }
}
