//! Which cores a rank's collective work runs on, and how many threads it uses there.
//!
//! The cores are those the process may run on (`sched_getaffinity` when the communicator is
//! made), split evenly over the communicator's ranks (all on this host): rank `r` of `n` gets
//! the `r`-th share. Two settings, each an option of `comm_init_rank` or an environment
//! variable (the option wins):
//!
//! - `bind` / [`BIND_ENV`]: `auto` (the default) binds the thread that runs a small collective
//!   of this communicator (a stream's worker) to the rank's share when every rank gets at least
//!   one core of its own, and to core `rank mod cores` where ranks outnumber the cores, and lets
//!   it run on every allowed core again for a large one; `none` leaves every thread where it
//!   is. Unbound, ranks that outnumber the cores drift between them: on the 2-core development
//!   VM a run of 4-rank barriers settled at 4.2 µs a call (median of 16 runs) where the spread
//!   ranks took 1.9. Two ranks that poll for each other on one core wait for
//!   the scheduler to swap them, so a loaded machine turns microsecond calls into
//!   hundred-microsecond ones (Open MPI binds its ranks to cores by default for the same
//!   reason); a long copy, though, is better off free to move away from a core that other work
//!   has taken. The switch costs a system call only when it changes the mask. The caller's own
//!   thread and the helpers are never bound.
//! - `threads` / [`THREADS_ENV`]: threads per rank for the copies and reductions of large
//!   collectives, the stream's worker included; `auto` (the default) takes the rank's share of
//!   the cores, at most [`MAX_AUTO_THREADS`]. On a machine with no more cores than ranks that
//!   is 1 (no helpers).

use ferrocx_plugin_sdk::prelude::*;

/// Environment variable for the binding policy: `auto` or `none`.
pub const BIND_ENV: &str = "FERROCX_HOST_BIND";
/// Environment variable for the threads per rank: `auto` or a count of at least 1.
pub const THREADS_ENV: &str = "FERROCX_HOST_THREADS";
/// The most threads per rank `auto` chooses (memory bandwidth, not cores, limits beyond it).
pub const MAX_AUTO_THREADS: usize = 4;
/// The most threads per rank a setting may ask for.
pub const MAX_THREADS: usize = 64;

/// Where a rank's collective work runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    /// The cores to bind the thread running a small collective to (`None`: leave it unbound).
    pub bind: Option<Vec<usize>>,
    /// Every core the process may use (what a large collective runs on when `bind` is set).
    pub all: Vec<usize>,
    /// Threads per rank for large copies and reductions (at least 1: the worker itself).
    pub threads: usize,
}

/// The CPUs the calling thread may run on.
fn allowed_cpus() -> Vec<usize> {
    // SAFETY: `cpu_set_t` is plain data; all zeroes is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is writable and its size is passed.
    let r = unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    if r != 0 {
        return Vec::new();
    }
    (0..libc::CPU_SETSIZE as usize)
        // SAFETY: `i` is below CPU_SETSIZE; `set` is initialised.
        .filter(|&i| unsafe { libc::CPU_ISSET(i, &set) })
        .collect()
}

/// The setting `key` (a `comm_init_rank` option) or else the environment variable `env`.
fn setting(o: &Options, key: &str, env: &str) -> Option<String> {
    o.get(key)
        .map(str::to_owned)
        .or_else(|| std::env::var(env).ok())
        .map(|v| v.trim().to_ascii_lowercase())
}

/// The placement of rank `rank` of `nranks`, from the options, the environment and the cores
/// this process may use.
pub fn plan(o: &Options, rank: usize, nranks: usize) -> Result<Placement> {
    plan_on(&allowed_cpus(), o, rank, nranks)
}

/// [`plan`] over the CPUs `cpus`.
pub fn plan_on(cpus: &[usize], o: &Options, rank: usize, nranks: usize) -> Result<Placement> {
    let share = cpus.len() / nranks.max(1);
    let mine = || cpus[rank * share..(rank + 1) * share].to_vec();
    let bind = match setting(o, "bind", BIND_ENV).as_deref() {
        None | Some("auto") | Some("") if share >= 1 => Some(mine()),
        // More ranks than cores: rank r's on core r mod cores, so that the ranks spread
        // evenly and stay where they are.
        None | Some("auto") | Some("") => (!cpus.is_empty()).then(|| vec![cpus[rank % cpus.len()]]),
        Some("none") => None,
        Some(v) => {
            return Err(Error::invalid_argument(format!(
                "bind = {v:?} (option `bind` or {BIND_ENV}): expected auto or none"
            )))
        }
    };
    let threads = match setting(o, "threads", THREADS_ENV).as_deref() {
        None | Some("auto") | Some("") => share.clamp(1, MAX_AUTO_THREADS),
        Some(v) => match v.parse::<usize>() {
            Ok(t) if (1..=MAX_THREADS).contains(&t) => t,
            _ => {
                return Err(Error::invalid_argument(format!(
                    "threads = {v:?} (option `threads` or {THREADS_ENV}): expected auto or a \
                     count from 1 to {MAX_THREADS}"
                )))
            }
        },
    };
    Ok(Placement {
        bind,
        all: cpus.to_vec(),
        threads,
    })
}

impl Placement {
    /// Binds the calling thread as a collective needs it: to the rank's cores for a small one
    /// (`small`), to every allowed core for a large one; nothing when binding is off.
    pub fn bind_for(&self, small: bool) {
        if let Some(mine) = &self.bind {
            bind_once(if small { mine } else { &self.all });
        }
    }
}

thread_local! {
    /// The cores this thread was bound to by [`bind_once`] (none: never).
    static BOUND: std::cell::RefCell<Option<Vec<usize>>> = const { std::cell::RefCell::new(None) };
}

/// Binds the calling thread to `cpus` unless it already is (one comparison per call).
pub fn bind_once(cpus: &[usize]) {
    BOUND.with(|b| {
        let mut b = b.borrow_mut();
        if b.as_deref() != Some(cpus) {
            bind_current(cpus);
            *b = Some(cpus.to_vec());
        }
    });
}

/// Binds the calling thread to `cpus` (best effort: a failure leaves it where it was).
fn bind_current(cpus: &[usize]) {
    if cpus.is_empty() {
        return;
    }
    // SAFETY: `cpu_set_t` is plain data; all zeroes is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &c in cpus.iter().filter(|&&c| c < libc::CPU_SETSIZE as usize) {
        // SAFETY: `c` is below CPU_SETSIZE; `set` is initialised.
        unsafe { libc::CPU_SET(c, &mut set) };
    }
    // SAFETY: `set` is initialised and its size is passed; 0 is the calling thread.
    let r = unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) };
    if r != 0 {
        tracing::debug!(
            "binding a collective thread to cores {cpus:?} failed: {}",
            std::io::Error::last_os_error()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(kv: &[(&str, &str)]) -> Options {
        Options::new(
            kv.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        )
    }

    #[test]
    fn each_rank_gets_its_share_of_the_cores() {
        let cpus: Vec<usize> = (0..16).collect();
        let p = plan_on(&cpus, &opts(&[]), 2, 4).unwrap();
        assert_eq!(p.bind, Some(vec![8, 9, 10, 11]));
        assert_eq!(p.all, cpus);
        assert_eq!(p.threads, 4);
        let p = plan_on(&[0, 1], &opts(&[]), 1, 2).unwrap();
        assert_eq!(p.bind, Some(vec![1]));
        assert_eq!(p.threads, 1);
        // More ranks than cores: spread round robin, one core each, no helpers.
        let p = plan_on(&[0, 1], &opts(&[]), 3, 4).unwrap();
        assert_eq!(p.bind, Some(vec![1]));
        let p = plan_on(&[4, 6], &opts(&[]), 2, 5).unwrap();
        assert_eq!(p.bind, Some(vec![4]));
        assert_eq!(plan_on(&[], &opts(&[]), 2, 5).unwrap().bind, None);
        assert_eq!(p.threads, 1);
        // Odd counts: the remainder is left out, shares stay disjoint.
        let p = plan_on(&[0, 2, 4, 6, 8, 10, 12], &opts(&[]), 2, 3).unwrap();
        assert_eq!(p.bind, Some(vec![8, 10]));
    }

    #[test]
    fn options_override_and_bad_values_are_named() {
        let cpus: Vec<usize> = (0..16).collect();
        let p = plan_on(&cpus, &opts(&[("bind", "none"), ("threads", "3")]), 0, 2).unwrap();
        assert_eq!(p.bind, None);
        assert_eq!(p.threads, 3);
        let e = plan_on(&cpus, &opts(&[("threads", "0")]), 0, 2).unwrap_err();
        assert!(e.message().contains("threads = \"0\""), "{}", e.message());
        let e = plan_on(&cpus, &opts(&[("bind", "always")]), 0, 2).unwrap_err();
        assert!(
            e.message().contains("expected auto or none"),
            "{}",
            e.message()
        );
    }
}
