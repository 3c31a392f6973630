//! `ferrocx launch -n N [--master-addr A] [--master-port P] [--timeout-s S] -- CMD ARGS...`:
//! N ranks of CMD on this host, with torchrun's environment and a store hosted by the launcher.
//!
//! Each rank runs in its own process group, so that stopping a rank stops whatever it started.
//! Ranks' output comes back line by line with a `[rank] ` prefix; `\r` ends a line too (progress
//! bars), and a line longer than [`MAX_PIECE`] comes in pieces, so a rank's output never grows
//! the launcher. The first rank to fail stops the job (SIGTERM, SIGKILL after a grace period)
//! and gives the launcher its exit code.
//!
//! The ranks die with the launcher, however it ends: each has `PR_SET_PDEATHSIG`, every exit
//! path SIGKILLs the ranks' groups, and a guard process (forked first, in its own group, deaf
//! to the terminal's signals) learns each group and kills them all if the launcher vanishes
//! without saying it is done (SIGKILL), which also takes what the ranks started.

use std::ffi::OsString;
use std::fs::File;
use std::io::{self, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, Command, ExitCode, ExitStatus, Stdio};
use std::sync::atomic::{AtomicI32, AtomicU32, Ordering};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use ferrocx::bootstrap::{
    JobInfo, StoreServer, ENV_JOB_ID, ENV_JOB_TOKEN, ENV_MASTER_ADDR, ENV_MASTER_PORT,
    ENV_STORE_HOSTED,
};

/// Time between SIGTERM and SIGKILL when the job is stopped.
const GRACE: Duration = Duration::from_secs(2);
/// How often the launcher looks at its ranks.
const POLL: Duration = Duration::from_millis(10);
/// How long to wait for the last output of ranks that have exited (a process they left behind
/// may hold their pipes open).
const DRAIN: Duration = Duration::from_secs(2);
/// Exit code of a job stopped by `--timeout-s`, as timeout(1).
const TIMEOUT_EXIT: u8 = 124;
/// Longest piece of a rank's output forwarded as one line: a longer line is cut into pieces of
/// this size, each with its prefix.
pub const MAX_PIECE: usize = 1 << 20;

/// Arguments of `ferrocx launch`.
#[derive(clap::Args, Debug)]
pub struct LaunchArgs {
    /// Number of ranks to start on this host.
    #[arg(short = 'n', long = "nproc", value_parser = clap::value_parser!(u32).range(1..=65536))]
    pub nproc: u32,
    /// Address the job's store listens on (the ranks get it as MASTER_ADDR).
    #[arg(long, default_value = "127.0.0.1")]
    pub master_addr: String,
    /// Port of the job's store, 0 for any free one (the ranks get it as MASTER_PORT).
    #[arg(long, default_value_t = 0)]
    pub master_port: u16,
    /// Stop the job if it still runs after this many seconds, and exit 124.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub timeout_s: Option<u64>,
    /// The command every rank runs, and its arguments (after `--`).
    #[arg(
        required = true,
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "CMD"
    )]
    pub command: Vec<OsString>,
}

/// Writes a line to stderr; a closed stderr must not stop the launcher (`eprintln!` panics).
macro_rules! say {
    ($($arg:tt)*) => {{
        let _ = writeln!(io::stderr().lock(), $($arg)*);
    }};
}

/// Count and number of the signals the launcher received (SIGINT, SIGTERM, SIGHUP).
static SIGNALS: AtomicU32 = AtomicU32::new(0);
static LAST_SIGNAL: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_signal(sig: libc::c_int) {
    // Only lock-free atomics here: async-signal-safe.
    LAST_SIGNAL.store(sig, Ordering::SeqCst);
    SIGNALS.fetch_add(1, Ordering::SeqCst);
}

fn install_signal_handlers() -> io::Result<()> {
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: an all-zero `sigaction` is a valid value to fill in; the handler only touches
        // atomics, and `sa_mask` is initialised by `sigemptyset` before the call.
        let rc = unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
            sa.sa_flags = libc::SA_RESTART;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(sig, &sa, std::ptr::null_mut())
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Sends `sig` to rank process group `pgid`. A group already gone is not an error.
fn signal_group(pgid: u32, sig: libc::c_int) {
    let Ok(pgid) = libc::pid_t::try_from(pgid) else {
        return;
    };
    // SAFETY: kill(2) with a negative pid signals that process group; it has no memory
    // effects. The group is one of our ranks' (each rank leads its own group).
    unsafe {
        libc::kill(-pgid, sig);
    }
}

/// How a rank ended.
#[derive(Clone, Copy)]
enum Outcome {
    Code(i32),
    Signal(i32),
    /// The launcher could not wait for it.
    Lost,
}

impl Outcome {
    fn of(status: ExitStatus) -> Outcome {
        match (status.code(), status.signal()) {
            (Some(c), _) => Outcome::Code(c),
            (None, Some(s)) => Outcome::Signal(s),
            (None, None) => Outcome::Lost,
        }
    }

    fn success(self) -> bool {
        matches!(self, Outcome::Code(0))
    }

    /// The launcher's exit code for it: the rank's code, 128 + signal, 1 when unknown.
    fn exit_code(self) -> u8 {
        match self {
            Outcome::Code(c) => u8::try_from(c).ok().filter(|&c| c != 0).unwrap_or(1),
            Outcome::Signal(s) => u8::try_from(128 + s).unwrap_or(255),
            Outcome::Lost => 1,
        }
    }

    fn describe(self) -> String {
        match self {
            Outcome::Code(c) => format!("exited with code {c}"),
            Outcome::Signal(s) => format!("killed by signal {s}"),
            Outcome::Lost => "could not be waited for".to_owned(),
        }
    }
}

struct Rank {
    child: Child,
    /// Its process group (= its pid: each rank leads its own group).
    pgid: u32,
    outcome: Option<Outcome>,
}

/// Runs the job; the launcher's exit code.
pub fn run(args: LaunchArgs) -> Result<ExitCode, Box<dyn std::error::Error>> {
    let n = usize::try_from(args.nproc)?;
    let Some((program, program_args)) = args.command.split_first() else {
        return Err("no command to launch (give it after `--`)".into());
    };
    let bind_addr = ferrocx::bootstrap::resolve(&args.master_addr, args.master_port)?;
    let job_id = format!("launch-{}", random_hex(8)?);
    let token = random_hex(32)?;
    let server = StoreServer::bind(bind_addr, token.clone())
        .map_err(|e| format!("could not host the job's store on {bind_addr}: {e}"))?;
    let store_addr = server.local_addr();
    // Ranks connect to a concrete address: "any" becomes loopback.
    let connect_ip = match store_addr.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(ip) if ip.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
        ip => ip,
    };
    tracing::debug!(store = %store_addr, job = %job_id, ranks = n, "launching");
    install_signal_handlers()?;
    let guard = Guard::start(n).map_err(|e| format!("cannot start the launcher's guard: {e}"))?;

    let (done_tx, done_rx) = mpsc::channel::<()>();
    let mut ranks: Vec<Rank> = Vec::with_capacity(n);
    for r in 0..n {
        let mut cmd = Command::new(program);
        cmd.args(program_args)
            .env("RANK", r.to_string())
            .env("WORLD_SIZE", n.to_string())
            .env("LOCAL_RANK", r.to_string())
            .env("LOCAL_WORLD_SIZE", n.to_string())
            .env(ENV_MASTER_ADDR, connect_ip.to_string())
            .env(ENV_MASTER_PORT, store_addr.port().to_string())
            .env(ENV_JOB_ID, &job_id)
            .env(ENV_JOB_TOKEN, &token)
            .env(ENV_STORE_HOSTED, "1")
            // A rank in its own process group would be stopped by the terminal if it read it.
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0);
        let launcher = std::process::id();
        // SAFETY: the closure runs in the child between fork and exec and calls only
        // async-signal-safe functions (prctl, getppid) and allocates nothing.
        unsafe {
            cmd.pre_exec(move || {
                // If the launcher dies without stopping it (SIGKILL), the rank goes too.
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(io::Error::last_os_error());
                }
                if u32::try_from(libc::getppid()) != Ok(launcher) {
                    return Err(io::Error::from_raw_os_error(libc::ESRCH));
                }
                Ok(())
            });
        }
        let mut child = match cmd.spawn() {
            Ok(c) => c,
            Err(e) => {
                stop_all(&mut ranks);
                return Err(format!(
                    "could not start rank {r} ({}): {e}",
                    program.to_string_lossy()
                )
                .into());
            }
        };
        if let Some(out) = child.stdout.take() {
            spawn_forwarder(r, out, false, done_tx.clone());
        }
        if let Some(err) = child.stderr.take() {
            spawn_forwarder(r, err, true, done_tx.clone());
        }
        guard.watch(child.id());
        ranks.push(Rank {
            pgid: child.id(),
            child,
            outcome: None,
        });
    }
    drop(done_tx);

    let code = supervise(&mut ranks, args.timeout_s.map(Duration::from_secs));
    // The rest of the ranks' output, unless something they left behind keeps the pipes open.
    let drain_until = Instant::now() + DRAIN;
    loop {
        let left = drain_until.saturating_duration_since(Instant::now());
        match done_rx.recv_timeout(left) {
            Ok(()) => {}
            Err(_) => break,
        }
    }
    // Whatever the ranks left running goes with the job (their groups; every rank is reaped).
    for rank in &ranks {
        signal_group(rank.pgid, libc::SIGKILL);
    }
    guard.done();
    drop(server);
    remove_job_segments(&job_id);
    Ok(ExitCode::from(code))
}

/// Removes the shared-memory segments of this job that its ranks left behind (a rank that was
/// killed cannot unlink its own): every name in /dev/shm that starts with `ferrocx-<job id>-`,
/// the id made safe by the ranks' rule ([`JobInfo::sanitize_id`]).
fn remove_job_segments(job_id: &str) {
    let prefix = format!("ferrocx-{}-", JobInfo::sanitize_id(job_id));
    let Ok(dir) = std::fs::read_dir("/dev/shm") else {
        return;
    };
    let mut removed = 0;
    for entry in dir.flatten() {
        let name = entry.file_name();
        if name.to_string_lossy().starts_with(&prefix) && std::fs::remove_file(entry.path()).is_ok()
        {
            removed += 1;
        }
    }
    if removed > 0 {
        tracing::warn!(
            job = job_id,
            "removed {removed} shared-memory segment(s) the ranks left behind"
        );
    }
}

/// Waits for the ranks, stopping the job on the first failure, a signal or the timeout; the
/// launcher's exit code.
fn supervise(ranks: &mut [Rank], timeout: Option<Duration>) -> u8 {
    // A timeout too long to represent is no timeout.
    let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
    let mut first_failure: Option<Outcome> = None;
    let mut timed_out = false;
    let mut interrupted: Option<i32> = None;
    // When the job is being stopped: the moment SIGKILL follows.
    let mut kill_at: Option<Instant> = None;
    let mut killed = false;
    // From 0: a signal that came while the ranks were being started counts too.
    let mut signals_seen = 0;
    loop {
        let mut failed: Option<(usize, Outcome)> = None;
        for (r, rank) in ranks.iter_mut().enumerate() {
            if rank.outcome.is_some() {
                continue;
            }
            let outcome = match rank.child.try_wait() {
                Ok(None) => continue,
                Ok(Some(status)) => Outcome::of(status),
                Err(e) => {
                    say!("ferrocx launch: cannot wait for rank {r}: {e}");
                    Outcome::Lost
                }
            };
            rank.outcome = Some(outcome);
            // Whatever the rank left in its group is told to go, right away: its pid was just
            // reaped, before it could be reused.
            signal_group(rank.pgid, libc::SIGTERM);
            if !outcome.success() && kill_at.is_none() && failed.is_none() {
                failed = Some((r, outcome));
            }
        }
        if let Some((r, outcome)) = failed.take() {
            say!("ferrocx launch: rank {r} {}", outcome.describe());
            first_failure = Some(outcome);
            kill_at = Some(begin_stop(ranks_running(ranks), libc::SIGTERM));
        }
        if ranks.iter().all(|r| r.outcome.is_some()) {
            break;
        }

        let signals = SIGNALS.load(Ordering::SeqCst);
        if signals != signals_seen {
            signals_seen = signals;
            let sig = LAST_SIGNAL.load(Ordering::SeqCst);
            if kill_at.is_some() {
                // Interrupted while already stopping: no more grace.
                say!("ferrocx launch: signal {sig}; killing the ranks");
                kill_at = Some(Instant::now());
            } else {
                say!("ferrocx launch: signal {sig}; forwarding it to the ranks");
                interrupted = Some(sig);
                kill_at = Some(begin_stop(ranks_running(ranks), sig));
            }
        }

        if let Some(d) = deadline {
            if Instant::now() >= d && kill_at.is_none() {
                let running: Vec<String> = ranks
                    .iter()
                    .enumerate()
                    .filter(|(_, r)| r.outcome.is_none())
                    .map(|(i, _)| i.to_string())
                    .collect();
                say!(
                    "ferrocx launch: timed out after {} s; ranks still running: {}",
                    timeout.unwrap_or_default().as_secs(),
                    running.join(", ")
                );
                timed_out = true;
                kill_at = Some(begin_stop(ranks_running(ranks), libc::SIGTERM));
            }
        }

        if let Some(k) = kill_at {
            if !killed && Instant::now() >= k {
                // Every group, exited ranks' too: what they left behind goes with the job.
                for rank in ranks.iter() {
                    signal_group(rank.pgid, libc::SIGKILL);
                }
                killed = true;
            }
        }
        thread::sleep(POLL);
    }
    if kill_at.is_some() && !killed {
        // The ranks are gone; anything they started that ignored SIGTERM is not.
        for rank in ranks.iter() {
            signal_group(rank.pgid, libc::SIGKILL);
        }
    }
    match (first_failure, timed_out, interrupted) {
        (Some(f), _, _) => f.exit_code(),
        (None, true, _) => TIMEOUT_EXIT,
        (None, false, Some(sig)) => u8::try_from(128 + sig).unwrap_or(255),
        (None, false, None) => 0,
    }
}

fn ranks_running(ranks: &[Rank]) -> impl Iterator<Item = u32> + '_ {
    ranks.iter().filter(|r| r.outcome.is_none()).map(|r| r.pgid)
}

/// Sends `sig` to the given groups; when SIGKILL is due.
fn begin_stop(groups: impl Iterator<Item = u32>, sig: libc::c_int) -> Instant {
    for g in groups {
        signal_group(g, sig);
    }
    Instant::now() + GRACE
}

/// Kills and reaps the ranks started so far (a later rank failed to start).
fn stop_all(ranks: &mut [Rank]) {
    for rank in ranks.iter() {
        signal_group(rank.pgid, libc::SIGKILL);
    }
    for rank in ranks.iter_mut() {
        let _ = rank.child.wait();
    }
}

/// Cuts a rank's output into the pieces forwarded: a line ends at `\n`, at `\r` (a progress
/// bar redrawing its line; `\r\n` is one end), or after `max` bytes without an end; what is
/// held between reads is at most `max` bytes.
pub(crate) struct Splitter {
    max: usize,
    held: Vec<u8>,
    /// The held piece ended with `\r` at the end of a read: a `\n` may follow.
    after_cr: bool,
}

impl Splitter {
    pub(crate) fn new(max: usize) -> Splitter {
        Splitter {
            max: max.max(1),
            held: Vec::new(),
            after_cr: false,
        }
    }

    /// Takes `data`; calls `emit` with each complete piece (its end included, if it had one).
    pub(crate) fn feed(&mut self, mut data: &[u8], emit: &mut dyn FnMut(&[u8])) {
        if self.after_cr {
            self.after_cr = false;
            if let Some(b'\n') = data.first() {
                self.held.push(b'\n');
                data = &data[1..];
            }
            emit(&self.held);
            self.held.clear();
        }
        for (i, &b) in data.iter().enumerate() {
            self.held.push(b);
            match b {
                b'\n' => {}
                b'\r' => match data.get(i + 1) {
                    Some(b'\n') => continue,
                    Some(_) => {}
                    None => {
                        self.after_cr = true;
                        continue;
                    }
                },
                _ if self.held.len() >= self.max => {}
                _ => continue,
            }
            emit(&self.held);
            self.held.clear();
        }
    }

    /// The end of the output: what is held, if anything.
    pub(crate) fn finish(&mut self, emit: &mut dyn FnMut(&[u8])) {
        if !self.held.is_empty() {
            emit(&self.held);
            self.held.clear();
        }
        self.after_cr = false;
    }
}

/// Copies `src` to the launcher's stdout (or stderr) piece by piece (see [`Splitter`]), each
/// prefixed with `[rank] ` and written whole under the stream's lock, so lines never interleave.
fn spawn_forwarder(
    rank: usize,
    mut src: impl Read + Send + 'static,
    to_stderr: bool,
    done: mpsc::Sender<()>,
) {
    let spawned = thread::Builder::new()
        .name(format!("ferrocx-launch-out-{rank}"))
        .spawn(move || {
            let prefix = format!("[{rank}] ");
            let mut splitter = Splitter::new(MAX_PIECE);
            let mut buf = vec![0u8; 64 << 10];
            let mut out = Vec::new();
            // After a write error (e.g. a closed pipe) the output is read and dropped, so that
            // the rank never blocks on a full pipe.
            let mut broken = false;
            let mut write = |piece: &[u8]| {
                if broken {
                    return;
                }
                out.clear();
                out.extend_from_slice(prefix.as_bytes());
                out.extend_from_slice(piece);
                if !piece.ends_with(b"\n") && !piece.ends_with(b"\r") {
                    out.push(b'\n');
                }
                let written = match to_stderr {
                    true => {
                        let mut e = io::stderr().lock();
                        e.write_all(&out).and_then(|()| e.flush())
                    }
                    false => {
                        let mut o = io::stdout().lock();
                        o.write_all(&out).and_then(|()| o.flush())
                    }
                };
                broken = written.is_err();
            };
            loop {
                match src.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => splitter.feed(&buf[..n], &mut write),
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(_) => break,
                }
            }
            splitter.finish(&mut write);
            let _ = done.send(());
        });
    if let Err(e) = spawned {
        tracing::warn!("rank {rank}: no thread to forward its output: {e}");
    }
}

/// A process that outlives a launcher killed without warning (SIGKILL) and kills the ranks'
/// groups then. The launcher writes each rank's group to a pipe; the guard reads them until a 0
/// (the launcher is done and has stopped every group itself) or the end of the pipe (the
/// launcher is gone: every group is killed).
struct Guard {
    /// The pipe's write end (close-on-exec, so no rank holds it), and the guard's pid.
    pipe: Option<(std::os::fd::OwnedFd, libc::pid_t)>,
}

impl Guard {
    /// Forks the guard, ready for `ranks` groups.
    fn start(ranks: usize) -> io::Result<Guard> {
        use std::os::fd::FromRawFd;
        let mut fds = [0; 2];
        // SAFETY: `fds` has room for the two descriptors pipe2 writes.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: both are new descriptors nothing else owns.
        let (read_end, write_end) = unsafe {
            (
                std::os::fd::OwnedFd::from_raw_fd(fds[0]),
                std::os::fd::OwnedFd::from_raw_fd(fds[1]),
            )
        };
        // Allocated before the fork: the child may not allocate (other threads may hold the
        // allocator's lock at the fork).
        let mut groups: Vec<libc::pid_t> = Vec::with_capacity(ranks);
        let rfd = fds[0];
        let wfd = fds[1];
        // SAFETY: fork has no memory-safety preconditions; the child below only makes
        // async-signal-safe calls (setpgid, sigaction, close, read, kill, _exit) and writes into
        // memory allocated before the fork, never beyond its capacity.
        let pid = unsafe { libc::fork() };
        if pid < 0 {
            return Err(io::Error::last_os_error());
        }
        if pid == 0 {
            // SAFETY: see above; this never returns.
            unsafe { guard_main(rfd, wfd, &mut groups) }
        }
        drop(read_end);
        Ok(Guard {
            pipe: Some((write_end, pid)),
        })
    }

    /// Tells the guard about a rank's group.
    fn watch(&self, pgid: u32) {
        if let Some((fd, _)) = &self.pipe {
            let bytes = (pgid as libc::pid_t).to_ne_bytes();
            // A 4-byte write to a pipe is atomic; a guard that is gone cannot be helped.
            let _ = write_fd(fd, &bytes);
        }
    }

    /// Tells the guard the launcher is done (the groups are stopped) and waits for it.
    fn done(mut self) {
        if let Some((fd, pid)) = self.pipe.take() {
            let _ = write_fd(&fd, &0i32.to_ne_bytes());
            drop(fd);
            // SAFETY: waits for our own child; a null status pointer is allowed.
            unsafe {
                libc::waitpid(pid, std::ptr::null_mut(), 0);
            }
        }
    }
}

impl Drop for Guard {
    /// An early return of the launcher (an error after some ranks started): the guard kills
    /// what was started, as it would for a crash.
    fn drop(&mut self) {
        if let Some((fd, pid)) = self.pipe.take() {
            drop(fd);
            // SAFETY: as in `done`.
            unsafe {
                libc::waitpid(pid, std::ptr::null_mut(), 0);
            }
        }
    }
}

fn write_fd(fd: &std::os::fd::OwnedFd, bytes: &[u8]) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: `bytes` is readable for its length; the descriptor is open (owned by the caller).
    let n = unsafe { libc::write(fd.as_raw_fd(), bytes.as_ptr().cast(), bytes.len()) };
    if n == bytes.len() as isize {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// The guard process's whole life (see [`Guard`]).
///
/// # Safety
/// Only in the child of a fork: async-signal-safe calls only, and `groups` has the capacity of
/// every group it may be told about (more are ignored).
unsafe fn guard_main(rfd: libc::c_int, wfd: libc::c_int, groups: &mut Vec<libc::pid_t>) -> ! {
    // SAFETY: (the whole body) async-signal-safe calls on this process's own descriptors and
    // signal dispositions, and writes within `groups`' capacity (checked before each push).
    unsafe {
        libc::close(wfd);
        // Its own group: the terminal's Ctrl-C goes to the launcher, which handles it.
        libc::setpgid(0, 0);
        for sig in [
            libc::SIGINT,
            libc::SIGTERM,
            libc::SIGHUP,
            libc::SIGPIPE,
            libc::SIGQUIT,
        ] {
            libc::signal(sig, libc::SIG_IGN);
        }
        // Hold no descriptor but the pipe: not the store's socket, not the launcher's stdout
        // (a reader of it would wait for the guard too).
        for fd in 0..1024 {
            if fd != rfd {
                libc::close(fd);
            }
        }
        let mut word = [0u8; 4];
        loop {
            let mut got = 0;
            while got < 4 {
                let n = libc::read(rfd, word[got..].as_mut_ptr().cast(), 4 - got);
                if n > 0 {
                    got += n as usize;
                } else if n < 0 && *libc::__errno_location() == libc::EINTR {
                    continue;
                } else {
                    break;
                }
            }
            if got < 4 {
                // The launcher is gone without saying it was done.
                for &g in groups.iter() {
                    libc::kill(-g, libc::SIGKILL);
                }
                libc::_exit(0);
            }
            let pgid = libc::pid_t::from_ne_bytes(word);
            if pgid == 0 {
                libc::_exit(0);
            }
            if groups.len() < groups.capacity() {
                groups.push(pgid);
            }
        }
    }
}

/// `bytes` random bytes from the kernel, in hex.
fn random_hex(bytes: usize) -> Result<String, String> {
    let mut buf = vec![0u8; bytes];
    File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut buf))
        .map_err(|e| format!("cannot read /dev/urandom for the job's token: {e}"))?;
    Ok(buf.iter().map(|b| format!("{b:02x}")).collect())
}

#[cfg(test)]
mod tests {
    use super::Splitter;

    /// The pieces `Splitter` makes of `reads` (one `feed` per read), with bound `max`.
    fn pieces(max: usize, reads: &[&[u8]]) -> Vec<String> {
        let mut s = Splitter::new(max);
        let mut out = Vec::new();
        for r in reads {
            s.feed(r, &mut |p| {
                out.push(String::from_utf8_lossy(p).into_owned())
            });
        }
        s.finish(&mut |p| out.push(String::from_utf8_lossy(p).into_owned()));
        out
    }

    #[test]
    fn lines_end_at_newline_and_carriage_return() {
        assert_eq!(pieces(100, &[b"a\nbc\n"]), ["a\n", "bc\n"]);
        assert_eq!(
            pieces(100, &[b"10%\r20%\r30%\rdone\n"]),
            ["10%\r", "20%\r", "30%\r", "done\n"]
        );
        // \r\n is one end, even split across reads.
        assert_eq!(pieces(100, &[b"x\r\ny\r", b"\nz"]), ["x\r\n", "y\r\n", "z"]);
        assert_eq!(pieces(100, &[b"p\r", b"q\n"]), ["p\r", "q\n"]);
        assert_eq!(pieces(100, &[b"tail"]), ["tail"]);
        assert_eq!(pieces(100, &[b"ab", b"c\n", b""]), ["abc\n"]);
    }

    #[test]
    fn a_line_longer_than_the_bound_comes_in_pieces_and_nothing_more_is_held() {
        let line = vec![b'x'; 10_000];
        let reads: Vec<&[u8]> = line.chunks(333).collect();
        let out = pieces(1024, &reads);
        assert_eq!(out.len(), 10);
        assert!(out[..9].iter().all(|p| p.len() == 1024));
        assert_eq!(out[9].len(), 10_000 - 9 * 1024);
        // Held bytes never exceed the bound, whatever the reads.
        let mut s = Splitter::new(1024);
        for r in &reads {
            s.feed(r, &mut |_| {});
            assert!(s.held.len() < 1024);
        }
    }
}
