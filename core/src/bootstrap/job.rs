//! The job's identity: an id that names its files and a token that admits its ranks to the
//! store.

use std::fmt;

use super::{RankInfo, ENV_JOB_ID, ENV_JOB_TOKEN, ENV_MASTER_ADDR, ENV_MASTER_PORT};

/// Who this job is. `Debug` does not show the token.
#[derive(Clone, PartialEq, Eq)]
pub struct JobInfo {
    /// The job's id: only `[A-Za-z0-9_-]`, safe in file and shared-memory names.
    pub id: String,
    /// The secret every rank presents to the store; empty means none.
    pub token: String,
}

impl JobInfo {
    /// Longest job id kept: it goes into file and shared-memory names, next to other parts.
    /// The longest such name, the host CCL's `/ferrocx-<job>-<pid>-c<32 hex digits>`, is then
    /// 181 bytes, under `NAME_MAX` (255); the window sockets' abstract names (at most 107
    /// bytes) cut a longer id and append its hash themselves.
    pub const MAX_ID_LEN: usize = 128;

    /// A job with the given id (made safe with [`JobInfo::sanitize_id`]) and token.
    pub fn new(id: &str, token: impl Into<String>) -> JobInfo {
        JobInfo {
            id: JobInfo::sanitize_id(id),
            token: token.into(),
        }
    }

    /// Reads `FERROCX_JOB_ID` and `FERROCX_JOB_TOKEN` through `lookup` (empty values count as
    /// unset).
    ///
    /// The id defaults to one derived from `MASTER_ADDR:MASTER_PORT` (the same on every rank of
    /// the job), or for a lone process with no `MASTER_PORT` to `single-PID`. The token defaults
    /// to empty, with a warning when the job has more than one rank: then any process that can
    /// reach the store can join it.
    pub fn from_env(lookup: impl Fn(&str) -> Option<String>, rank: &RankInfo) -> JobInfo {
        let get = |var: &str| {
            lookup(var)
                .map(|v| v.trim().to_owned())
                .filter(|v| !v.is_empty())
        };
        let id = match (get(ENV_JOB_ID), get(ENV_MASTER_PORT)) {
            (Some(id), _) => id,
            (None, Some(port)) => {
                let addr = get(ENV_MASTER_ADDR).unwrap_or_else(|| "127.0.0.1".to_owned());
                format!("{addr}_{port}")
            }
            (None, None) if rank.world_size == 1 => format!("single-{}", std::process::id()),
            (None, None) => "ferrocx".to_owned(),
        };
        let token = lookup(ENV_JOB_TOKEN).unwrap_or_default();
        if token.is_empty() && rank.world_size > 1 {
            tracing::warn!(
                "{ENV_JOB_TOKEN} is not set: the store admits any process that can reach it \
                 (ferrocx launch sets a random one)"
            );
        }
        JobInfo::new(&id, token)
    }

    /// `raw` with every character outside `[A-Za-z0-9_-]` replaced by `_`, cut to
    /// [`JobInfo::MAX_ID_LEN`] characters; `job` if nothing is left. Every name made from a job id (the
    /// store's files, the host device's and host CCL's shared-memory segments, the launcher's
    /// cleanup of them) uses this one rule.
    pub fn sanitize_id(raw: &str) -> String {
        let id: String = raw
            .chars()
            .take(Self::MAX_ID_LEN)
            .map(
                |c| match c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                    true => c,
                    false => '_',
                },
            )
            .collect();
        match id.is_empty() {
            true => "job".to_owned(),
            false => id,
        }
    }
}

impl fmt::Debug for JobInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let token = match self.token.is_empty() {
            true => "<none>",
            false => "<redacted>",
        };
        f.debug_struct("JobInfo")
            .field("id", &self.id)
            .field("token", &token)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_made_safe_for_file_names() {
        assert_eq!(JobInfo::sanitize_id("10.0.0.1:29500"), "10_0_0_1_29500");
        assert_eq!(JobInfo::sanitize_id("../a b/é"), "___a_b__");
        assert_eq!(JobInfo::sanitize_id(""), "job");
        assert_eq!(
            JobInfo::sanitize_id(&"x".repeat(500)).len(),
            JobInfo::MAX_ID_LEN
        );
        // The launcher's ids are kept as they are: its cleanup matches them verbatim.
        assert_eq!(
            JobInfo::sanitize_id("launch-0123456789abcdef"),
            "launch-0123456789abcdef"
        );
        // The longest shared-memory name made from an id fits NAME_MAX.
        let longest = format!(
            "ferrocx-{}-{}-c{}",
            JobInfo::sanitize_id(&"é".repeat(500)),
            u32::MAX,
            "f".repeat(32)
        );
        assert!(longest.len() <= 255, "{}", longest.len());
    }

    #[test]
    fn debug_hides_the_token() {
        let s = format!("{:?}", JobInfo::new("j", "secret"));
        assert!(!s.contains("secret"), "{s}");
    }
}
