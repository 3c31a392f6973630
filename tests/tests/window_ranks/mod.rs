//! Runs the ranks of a window test as real processes: the test executable re-runs itself once
//! per rank (`--exact <test>`), with torchrun's variables, a job store hosted by the parent, a
//! config file of the test's own and a job id of its own (so what a job leaves in `/dev/shm` can
//! be checked exactly, and concurrent tests never share names).

#![allow(dead_code)]

pub mod all_gather;
pub mod all_reduce;

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use ferrocx::abi::DevicePtr;
use ferrocx::bootstrap::StoreServer;
use ferrocx::comm::Communicator;
pub use ferrocx_test_support::shm::segments_of_job;
use ferrocx_test_support::shm::JobCleanup;

/// Set in a rank: the test it runs.
const ROLE: &str = "FERROCX_WINDOW_TEST";
const TOKEN: &str = "window-test-token";
/// How long a job may take before its ranks are killed.
const LIMIT: Duration = Duration::from_secs(240);

/// This process's rank, when it is a rank of `test`.
pub fn rank_of(test: &str) -> Option<usize> {
    if std::env::var(ROLE).ok()? != test {
        return None;
    }
    std::env::var("RANK").ok()?.parse().ok()
}

/// The communicator of a rank, from the environment the parent set.
pub fn communicator() -> Communicator {
    ferrocx_adaptor_host::link();
    Communicator::from_env().unwrap_or_else(|e| panic!("communicator: {e}"))
}

/// What a rank printed and how it ended.
pub struct Finished {
    pub rank: usize,
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl Finished {
    /// What follows `prefix` on each line this rank printed with it (libtest may have put
    /// `test <name> ... ` before the first).
    pub fn lines(&self, prefix: &str) -> Vec<String> {
        self.stdout
            .lines()
            .filter_map(|l| l.find(prefix).map(|at| l[at + prefix.len()..].to_string()))
            .collect()
    }
}

/// A job of `world` ranks running test `test`.
pub struct Job {
    test: String,
    world: usize,
    multicast: String,
    window: String,
    env: Vec<(usize, String, String)>,
    /// More `key = value` lines of the cluster (TOML values, written as given).
    keys: Vec<(String, String)>,
    /// The cluster's device and CCL adaptors.
    adaptors: (String, String),
    /// Several clusters (name, ranks) instead of one, each with `adaptors` and `keys`.
    clusters: Vec<(String, String)>,
    /// `key = value` lines of a `[bridge]` table.
    bridge: Vec<(String, String)>,
    /// Clusters whose device and CCL adaptors differ from `adaptors`: (name, device, ccl).
    cluster_adaptors: Vec<(String, String, String)>,
    timeout_ms: u64,
    /// Ranks that may exit without `RANK OK` (killed by the test).
    may_die: Vec<usize>,
}

impl Job {
    /// `world` ranks of `test`, multicast `off` and window `auto` unless changed.
    pub fn new(test: &str, world: usize) -> Job {
        Job {
            test: test.to_string(),
            world,
            multicast: "off".into(),
            window: "auto".into(),
            env: Vec::new(),
            keys: Vec::new(),
            adaptors: ("host".into(), "host".into()),
            clusters: Vec::new(),
            bridge: Vec::new(),
            cluster_adaptors: Vec::new(),
            timeout_ms: 30000,
            may_die: Vec::new(),
        }
    }

    /// Clusters `(name, ranks)` instead of the one `local` cluster.
    pub fn clusters(mut self, clusters: &[(&str, &str)]) -> Job {
        self.clusters = clusters
            .iter()
            .map(|(n, r)| (n.to_string(), r.to_string()))
            .collect();
        self
    }

    /// Adds `key = value` to the `[bridge]` table (`value` is TOML).
    pub fn bridge_key(mut self, key: &str, value: &str) -> Job {
        self.bridge.push((key.into(), value.into()));
        self
    }

    /// `runtime.timeout_ms` (30000 unless changed).
    pub fn timeout_ms(mut self, ms: u64) -> Job {
        self.timeout_ms = ms;
        self
    }

    /// Lets `rank` end without `RANK OK` (a rank the test kills).
    pub fn may_die(mut self, rank: usize) -> Job {
        self.may_die.push(rank);
        self
    }

    /// The cluster's device and CCL adaptors (`host` and `host` unless changed).
    pub fn adaptors(mut self, device: &str, ccl: &str) -> Job {
        self.adaptors = (device.into(), ccl.into());
        self
    }

    /// Gives cluster `name` its own device and CCL adaptors.
    pub fn cluster_adaptors(mut self, name: &str, device: &str, ccl: &str) -> Job {
        self.cluster_adaptors
            .push((name.into(), device.into(), ccl.into()));
        self
    }

    /// Adds `key = value` to the cluster (`value` is TOML: `"\"window\""`, `4096`).
    pub fn cluster_key(mut self, key: &str, value: &str) -> Job {
        self.keys.push((key.into(), value.into()));
        self
    }

    /// The cluster's `multicast` key.
    pub fn multicast(mut self, mode: &str) -> Job {
        self.multicast = mode.into();
        self
    }

    /// The cluster's `window` key.
    pub fn window(mut self, mode: &str) -> Job {
        self.window = mode.into();
        self
    }

    /// Sets `var` for `rank` only.
    pub fn env_of(mut self, rank: usize, var: &str, value: &str) -> Job {
        self.env.push((rank, var.into(), value.into()));
        self
    }

    /// Sets `var` for every rank.
    pub fn env(mut self, var: &str, value: &str) -> Job {
        for r in 0..self.world {
            self.env.push((r, var.into(), value.into()));
        }
        self
    }

    /// Runs the ranks; asserts that each exited 0 after printing `RANK OK`, and that the job
    /// left no shared-memory segment. Returns what each printed.
    pub fn run(self) -> Vec<Finished> {
        let dir = tempfile::tempdir().expect("tempdir");
        let config = dir.path().join("windows.toml");
        let keys: String = self
            .keys
            .iter()
            .map(|(k, v)| format!("{k} = {v}\n"))
            .collect();
        let clusters = match self.clusters.is_empty() {
            true => vec![("local".to_string(), None)],
            false => self
                .clusters
                .iter()
                .map(|(n, r)| (n.clone(), Some(r.clone())))
                .collect(),
        };
        let mut text = format!("[runtime]\ntimeout_ms = {}\n", self.timeout_ms);
        for (name, ranks) in clusters {
            let ranks = ranks
                .map(|r| format!("ranks = \"{r}\"\n"))
                .unwrap_or_default();
            let (device, ccl) = self
                .cluster_adaptors
                .iter()
                .find(|c| c.0 == name)
                .map_or((&self.adaptors.0, &self.adaptors.1), |c| (&c.1, &c.2));
            text.push_str(&format!(
                "\n[[cluster]]\nname = \"{name}\"\n{ranks}device = \"{}\"\nccl = \"{}\"\n\
                 multicast = \"{}\"\nwindow = \"{}\"\n{keys}",
                device, ccl, self.multicast, self.window
            ));
        }
        if !self.bridge.is_empty() {
            text.push_str("\n[bridge]\n");
            for (k, v) in &self.bridge {
                text.push_str(&format!("{k} = {v}\n"));
            }
        }
        std::fs::write(&config, text).expect("write the config");
        let server = StoreServer::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)), TOKEN.into())
            .expect("host the store");
        // The test's name, short, and a hash of all of it: tests of one executable run at once
        // and must not share a job (its segments), even where their names begin alike.
        let short: String = self
            .test
            .chars()
            .filter(char::is_ascii_alphanumeric)
            .take(16)
            .collect();
        let hash = self.test.bytes().fold(0x811c_9dc5u32, |h, b| {
            (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
        });
        let job = format!("wt{}{short}{hash:08x}", std::process::id());
        let _cleanup = JobCleanup(job.clone());
        let children: Vec<_> = (0..self.world)
            .map(|rank| {
                let mut c = ferrocx_test_support::procs::rerun(&self.test);
                c.env(ROLE, &self.test)
                    .env("RANK", rank.to_string())
                    .env("WORLD_SIZE", self.world.to_string())
                    .env("LOCAL_RANK", rank.to_string())
                    .env("LOCAL_WORLD_SIZE", self.world.to_string())
                    .env("MASTER_ADDR", "127.0.0.1")
                    .env("MASTER_PORT", server.local_addr().port().to_string())
                    .env("FERROCX_STORE_HOSTED", "1")
                    .env("FERROCX_JOB_ID", &job)
                    .env("FERROCX_JOB_TOKEN", TOKEN)
                    .env("FERROCX_CONFIG", &config)
                    .env_remove("FERROCX_MULTICAST")
                    .env_remove("NCCL_NVLS_ENABLE")
                    .env_remove("FERROCX_TIMEOUT_MS");
                for (_, k, v) in self.env.iter().filter(|(r, _, _)| *r == rank) {
                    c.env(k, v);
                }
                c.spawn().expect("spawn a rank")
            })
            .collect();
        let finished = wait(children);
        let failed: Vec<String> = finished
            .iter()
            .filter(|f| !self.may_die.contains(&f.rank))
            .filter(|f| f.code != Some(0) || !f.stdout.contains("RANK OK"))
            .map(|f| {
                format!(
                    "--- rank {} exited {:?}\n--- stdout\n{}\n--- stderr\n{}",
                    f.rank, f.code, f.stdout, f.stderr
                )
            })
            .collect();
        assert!(failed.is_empty(), "{}", failed.join("\n"));
        assert_eq!(
            segments_of_job(&job),
            Vec::<String>::new(),
            "the job left shared memory behind"
        );
        finished
    }
}

/// Waits for every rank, killing the ones still running after [`LIMIT`].
fn wait(children: Vec<std::process::Child>) -> Vec<Finished> {
    ferrocx_test_support::procs::wait(children, LIMIT)
        .into_iter()
        .map(|o| Finished {
            rank: o.rank,
            code: o.code,
            stdout: o.stdout,
            stderr: o.stderr,
        })
        .collect()
}

/// What a process holds: open descriptors, mappings, and the segments it made.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Usage {
    pub fds: usize,
    pub maps: usize,
    pub segments: Vec<String>,
}

/// This process's [`Usage`].
pub fn usage() -> Usage {
    let job = std::env::var("FERROCX_JOB_ID").expect("a rank has a job id");
    Usage {
        fds: std::fs::read_dir("/proc/self/fd")
            .expect("/proc/self/fd")
            .count(),
        maps: std::fs::read_to_string("/proc/self/maps")
            .expect("/proc/self/maps")
            .lines()
            .count(),
        // This process's own: `ferrocx-<job>-<pid>-<seq>`.
        segments: segments_of_job(&job)
            .into_iter()
            .filter(|n| n.starts_with(&format!("ferrocx-{job}-{}-", std::process::id())))
            .collect(),
    }
}

/// The device address of host memory (the host device's addresses are the process's).
pub fn host_ptr<T>(v: &[T]) -> DevicePtr {
    DevicePtr(v.as_ptr() as u64)
}

/// The device address of host memory the device writes.
pub fn host_ptr_mut<T>(v: &mut [T]) -> DevicePtr {
    DevicePtr(v.as_mut_ptr() as u64)
}

/// Writes `data` at `dst` of the communicator's device.
///
/// # Safety
///
/// `dst` is writable for `data`'s bytes (a valid range, as `Device::mem_copy` requires).
pub unsafe fn upload(comm: &Communicator, dst: DevicePtr, data: &[u64]) {
    // SAFETY: `dst` by the caller's contract; `data` is live host memory.
    unsafe {
        comm.device()
            .mem_copy(dst, host_ptr(data), std::mem::size_of_val(data))
    }
    .expect("upload");
}

/// Reads `n` words at `src` of the communicator's device.
///
/// # Safety
///
/// `src` is readable for `n` words (a valid range, as `Device::mem_copy` requires).
pub unsafe fn download(comm: &Communicator, src: DevicePtr, n: usize) -> Vec<u64> {
    let mut out = vec![0u64; n];
    // SAFETY: `src` by the caller's contract; `out` holds `n` words.
    unsafe { comm.device().mem_copy(host_ptr_mut(&mut out), src, n * 8) }.expect("download");
    out
}

/// The word rank `rank` writes at index `i` of window `w` (distinct across all three).
pub fn pattern(w: u64, rank: usize, i: usize) -> u64 {
    (w << 48) ^ ((rank as u64 + 1) << 32) ^ (i as u64).wrapping_mul(0x9e37_79b9)
}

/// The `collective` spans of the calls a closure makes (`ferrocx::route=debug`, one line per
/// span as it opens), for tests that check which route a call took.
#[derive(Clone, Default)]
pub struct RouteLog(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for RouteLog {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl RouteLog {
    /// Runs `f` with the spans it opens written here; returns what `f` returned.
    pub fn capture<R>(&self, f: impl FnOnce() -> R) -> R {
        let writer = self.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_env_filter("ferrocx::route=debug")
            .with_span_events(tracing_subscriber::fmt::format::FmtSpan::NEW)
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .finish();
        tracing::subscriber::with_default(subscriber, f)
    }

    /// Everything written so far.
    pub fn text(&self) -> String {
        String::from_utf8(self.0.lock().unwrap().clone()).expect("utf-8 log")
    }
}
