//! The store's client, the rendezvous helpers built on it, and the launcher-driven setup.

use std::collections::HashMap;
use std::io;
use std::net::{Ipv4Addr, SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::thread;
use std::time::{Duration, Instant};

use super::wire::{self, Request, Response};
use super::{
    BootstrapError, JobInfo, RankInfo, StoreServer, ENV_MASTER_ADDR, ENV_MASTER_PORT,
    ENV_STORE_HOSTED,
};

/// Extra time a reply may take beyond the operation's own wait (a busy server, a slow link).
const REPLY_SLACK: Duration = Duration::from_secs(10);
/// Longest single connect attempt; attempts repeat until the deadline.
const CONNECT_ATTEMPT: Duration = Duration::from_secs(2);
/// Where every helper's keys live, apart from the caller's own keys.
const HELPER_ROOT: &str = "ferrocx";

/// A connection to the job's key-value store.
///
/// Methods take `&self`: threads may share one `Store`. Each operation borrows an idle
/// connection, or opens another one, so a thread blocked in [`get`](Store::get) does not hold
/// up the others.
///
/// The rendezvous helpers ([`all_gather`](Store::all_gather), [`broadcast`](Store::broadcast),
/// [`barrier`](Store::barrier)) count their rounds per name in this `Store`: a `Store` stands
/// for one rank, which calls each helper once per round, as with any collective.
pub struct Store {
    addr: SocketAddr,
    token: String,
    timeout: Duration,
    idle: Mutex<Vec<TcpStream>>,
    /// Round number per helper and name: the generation that keeps reused names apart.
    rounds: Mutex<HashMap<(&'static str, String), u64>>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("addr", &self.addr)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The store server this process hosts at `addr` for the job of `token`: the one it already
/// hosts there while that one lives (every communicator of a job made on rank 0 under torchrun
/// names the same `MASTER_PORT`), else a new one.
fn hosted_server(addr: SocketAddr, token: &str) -> Result<Arc<StoreServer>, BootstrapError> {
    static HOSTED: Mutex<Vec<(SocketAddr, String, Weak<StoreServer>)>> = Mutex::new(Vec::new());
    let mut hosted = lock(&HOSTED);
    hosted.retain(|(_, _, w)| w.strong_count() > 0);
    let live = hosted
        .iter()
        .find(|(a, t, _)| *a == addr && t == token)
        .and_then(|(_, _, w)| w.upgrade());
    if let Some(server) = live {
        tracing::debug!(%addr, "store: sharing the server this process already hosts");
        return Ok(server);
    }
    let server = Arc::new(
        StoreServer::bind(addr, token.to_owned())
            .map_err(|source| BootstrapError::Bind { addr, source })?,
    );
    hosted.push((addr, token.to_owned(), Arc::downgrade(&server)));
    Ok(server)
}

impl Store {
    /// Connects to the store at `addr`, retrying until `deadline` has passed (the server may
    /// not be up yet), and presents `token`. `deadline` is also how long [`get`](Store::get)
    /// and the helpers wait (see [`set_timeout`](Store::set_timeout)).
    pub fn connect(
        addr: SocketAddr,
        token: &str,
        deadline: Duration,
    ) -> Result<Store, BootstrapError> {
        let store = Store {
            addr,
            token: token.to_owned(),
            timeout: deadline,
            idle: Mutex::new(Vec::new()),
            rounds: Mutex::new(HashMap::new()),
        };
        let conn = store.open()?;
        lock(&store.idle).push(conn);
        tracing::debug!(%addr, "connected to the store");
        Ok(store)
    }

    /// Sets up the job's store from the launcher's environment (see
    /// [`from_env_with`](Store::from_env_with)), read from the process environment.
    pub fn from_env(
        rank: &RankInfo,
        job: &JobInfo,
        timeout: Duration,
    ) -> Result<(Store, Option<Arc<StoreServer>>), BootstrapError> {
        Store::from_env_with(rank, job, timeout, |v| std::env::var(v).ok())
    }

    /// Sets up the job's store from variables read through `lookup`:
    ///
    /// - a lone rank (world 1) with no `MASTER_PORT` hosts a private store on `127.0.0.1:0`;
    /// - otherwise the store is at `MASTER_ADDR` (default `127.0.0.1`) : `MASTER_PORT`
    ///   (required); rank 0 hosts it there unless `FERROCX_STORE_HOSTED=1` says the launcher
    ///   already does (`ferrocx launch`).
    ///
    /// Every rank, rank 0 included, connects as a client with the job's token. The server, if
    /// this rank hosts it, is returned: keep it alive until every rank is done with the store.
    /// A process hosts one server per address: a second call while the first one's server lives
    /// (a second communicator under torchrun) shares it rather than binding the port again.
    pub fn from_env_with(
        rank: &RankInfo,
        job: &JobInfo,
        timeout: Duration,
        lookup: impl Fn(&str) -> Option<String>,
    ) -> Result<(Store, Option<Arc<StoreServer>>), BootstrapError> {
        let get = |var: &str| {
            lookup(var)
                .map(|v| v.trim().to_owned())
                .filter(|v| !v.is_empty())
        };
        let port = get(ENV_MASTER_PORT);
        if port.is_none() && rank.world_size == 1 {
            let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, 0));
            let server = StoreServer::bind(addr, job.token.clone())
                .map_err(|source| BootstrapError::Bind { addr, source })?;
            let store = Store::connect(server.local_addr(), &job.token, timeout)?;
            return Ok((store, Some(Arc::new(server))));
        }
        let port = port.ok_or_else(|| BootstrapError::MissingEnv {
            var: ENV_MASTER_PORT.to_owned(),
            reason: format!(
                "rank {} of {} needs the store's port (torchrun and ferrocx launch set it; MPI \
                 launchers do not: pass it to every rank with rank 0's host, `mpiexec -genv \
                 MASTER_ADDR <host> -genv MASTER_PORT <port>`, Open MPI's `-x MASTER_PORT=<port>`)",
                rank.rank, rank.world_size
            ),
        })?;
        let port = match port.parse::<u16>() {
            Ok(p) if p != 0 => p,
            _ => {
                return Err(BootstrapError::BadEnv {
                    var: ENV_MASTER_PORT.to_owned(),
                    value: port,
                    reason: "not a TCP port (1-65535)".into(),
                })
            }
        };
        let host = get(ENV_MASTER_ADDR).unwrap_or_else(|| "127.0.0.1".to_owned());
        let addr = resolve(&host, port)?;
        let hosted = get(ENV_STORE_HOSTED).is_some_and(|v| v == "1");
        let server = match rank.rank == 0 && !hosted {
            true => Some(hosted_server(addr, &job.token)?),
            false => None,
        };
        let store = Store::connect(addr, &job.token, timeout)?;
        Ok((store, server))
    }

    /// The store's address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// How long blocking operations wait.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Changes how long blocking operations wait.
    pub fn set_timeout(&mut self, timeout: Duration) {
        self.timeout = timeout;
    }

    /// Stores `value` under `key`, replacing any value there.
    pub fn set(&self, key: &str, value: &[u8]) -> Result<(), BootstrapError> {
        let req = Request::Set {
            key: key.to_owned(),
            value: value.to_vec(),
        };
        match self.call("set", key, &req, Duration::ZERO)? {
            Response::Done => Ok(()),
            other => Err(self.unexpected("set", key, other)),
        }
    }

    /// The value under `key`, waiting until some rank sets it; fails when the store's timeout
    /// passes first, naming the key and the deadline.
    pub fn get(&self, key: &str) -> Result<Vec<u8>, BootstrapError> {
        self.get_within(key, self.timeout)
    }

    /// Adds `delta` to the counter under `key` (absent counts as 0) and returns the new value,
    /// atomically with respect to every other client. Counters are stored as decimal text.
    pub fn add(&self, key: &str, delta: i64) -> Result<i64, BootstrapError> {
        let req = Request::Add {
            key: key.to_owned(),
            delta,
        };
        match self.call("add", key, &req, Duration::ZERO)? {
            Response::Int(n) => Ok(n),
            other => Err(self.unexpected("add", key, other)),
        }
    }

    /// Removes `key`; whether it was there.
    pub fn delete(&self, key: &str) -> Result<bool, BootstrapError> {
        let req = Request::Delete {
            key: key.to_owned(),
        };
        match self.call("delete", key, &req, Duration::ZERO)? {
            Response::Bool(b) => Ok(b),
            other => Err(self.unexpected("delete", key, other)),
        }
    }

    /// Whether every one of `keys` is set, without waiting.
    pub fn check(&self, keys: &[&str]) -> Result<bool, BootstrapError> {
        let req = Request::Check {
            keys: keys.iter().map(|k| (*k).to_owned()).collect(),
        };
        let name = keys.join(",");
        match self.call("check", &name, &req, Duration::ZERO)? {
            Response::Bool(b) => Ok(b),
            other => Err(self.unexpected("check", &name, other)),
        }
    }

    /// Every rank's `data`, in rank order. Each of the `world` ranks calls it once per round
    /// with the same `prefix`; rounds with the same prefix never mix. Ranks whose data does not
    /// come within the store's timeout fail it with [`BootstrapError::Absent`], naming them.
    pub fn all_gather(
        &self,
        prefix: &str,
        rank: usize,
        world: usize,
        data: &[u8],
    ) -> Result<Vec<Vec<u8>>, BootstrapError> {
        if rank >= world {
            return Err(BootstrapError::InvalidArgument {
                op: "all_gather",
                name: prefix.to_owned(),
                reason: format!("rank {rank} is not below the world size {world}"),
            });
        }
        let deadline = deadline_after(self.timeout);
        let round = self.next_round("ag", prefix);
        let slot = |round: u64, r: usize| format!("{HELPER_ROOT}/ag/{prefix}/{round}/{r}");
        self.set(&slot(round, rank), data)?;
        let mut all = Vec::with_capacity(world);
        for r in 0..world {
            match r == rank {
                true => all.push(data.to_vec()),
                false => match self.get_within(&slot(round, r), left(deadline)) {
                    Ok(v) => all.push(v),
                    Err(BootstrapError::Timeout { .. }) => {
                        // Ranks below `r` arrived; look (without waiting) at those above.
                        let mut missing = vec![r];
                        for later in (r + 1..world).filter(|&q| q != rank) {
                            if !self.check(&[&slot(round, later)])? {
                                missing.push(later);
                            }
                        }
                        return Err(BootstrapError::Absent {
                            op: "all_gather",
                            name: prefix.to_owned(),
                            round,
                            arrived: world - missing.len(),
                            missing,
                            world,
                            waited: self.timeout,
                        });
                    }
                    Err(e) => return Err(e),
                },
            }
        }
        // Every rank has set its slot of this round, so every rank is done reading the last
        // round: our slot there can go.
        if round > 0 {
            self.delete(&slot(round - 1, rank))?;
        }
        Ok(all)
    }

    /// The root's `data` on every rank. The root passes `is_root = true` and `Some(data)`, the
    /// others `false` and `None`; each calls it once per round with the same `key`.
    ///
    /// The root does not wait for the others, so it cannot know when a value has been read:
    /// each round leaves one key in the store.
    pub fn broadcast(
        &self,
        key: &str,
        is_root: bool,
        data: Option<&[u8]>,
    ) -> Result<Vec<u8>, BootstrapError> {
        let slot = |round: u64| format!("{HELPER_ROOT}/bc/{key}/{round}");
        match (is_root, data) {
            (true, Some(data)) => {
                let round = self.next_round("bc", key);
                self.set(&slot(round), data)?;
                Ok(data.to_vec())
            }
            (true, None) => Err(BootstrapError::InvalidArgument {
                op: "broadcast",
                name: key.to_owned(),
                reason: "the root must give the data".into(),
            }),
            (false, _) => {
                let round = self.next_round("bc", key);
                self.get(&slot(round))
            }
        }
    }

    /// Returns once all `world` ranks have called it with this `name` (once per round); after
    /// the store's timeout, [`BootstrapError::Absent`] with the number that arrived.
    pub fn barrier(&self, name: &str, world: usize) -> Result<(), BootstrapError> {
        if world == 0 {
            return Err(BootstrapError::InvalidArgument {
                op: "barrier",
                name: name.to_owned(),
                reason: "a world of 0 ranks".into(),
            });
        }
        let round = self.next_round("barrier", name);
        let key = |round: u64, what: &str| format!("{HELPER_ROOT}/barrier/{name}/{round}/{what}");
        let arrived = self.add(&key(round, "arrived"), 1)?;
        let world_i64 = i64::try_from(world).unwrap_or(i64::MAX);
        if arrived > world_i64 {
            return Err(BootstrapError::InvalidArgument {
                op: "barrier",
                name: name.to_owned(),
                reason: format!(
                    "round {round} has {arrived} arrivals for a world of {world} (the ranks \
                     disagree on the world size, or one called it twice)"
                ),
            });
        }
        if arrived == world_i64 {
            self.set(&key(round, "done"), b"")?;
            // Every rank has arrived here, so every rank has left the last round.
            if round > 0 {
                self.delete(&key(round - 1, "arrived"))?;
                self.delete(&key(round - 1, "done"))?;
            }
        }
        match self.get(&key(round, "done")) {
            Ok(_) => Ok(()),
            Err(BootstrapError::Timeout { waited, .. }) => {
                let arrived = self.add(&key(round, "arrived"), 0)?;
                Err(BootstrapError::Absent {
                    op: "barrier",
                    name: name.to_owned(),
                    round,
                    missing: Vec::new(),
                    arrived: usize::try_from(arrived).unwrap_or(0),
                    world,
                    waited,
                })
            }
            Err(e) => Err(e),
        }
    }

    fn next_round(&self, helper: &'static str, name: &str) -> u64 {
        let mut rounds = lock(&self.rounds);
        let r = rounds.entry((helper, name.to_owned())).or_insert(0);
        let this = *r;
        *r += 1;
        this
    }

    fn get_within(&self, key: &str, wait: Duration) -> Result<Vec<u8>, BootstrapError> {
        let req = Request::Get {
            key: key.to_owned(),
            wait_ms: u64::try_from(wait.as_millis()).unwrap_or(u64::MAX),
        };
        match self.call("get", key, &req, wait)? {
            Response::Value(v) => Ok(v),
            // A helper waits for several keys within one timeout: report that timeout.
            Response::Missing => Err(BootstrapError::Timeout {
                addr: self.addr,
                key: key.to_owned(),
                waited: self.timeout,
            }),
            other => Err(self.unexpected("get", key, other)),
        }
    }

    /// One request and its reply on an idle connection (or a new one). A connection that
    /// failed is dropped: its stream may be mid-frame.
    fn call(
        &self,
        op: &'static str,
        key: &str,
        req: &Request,
        wait: Duration,
    ) -> Result<Response, BootstrapError> {
        let pooled = lock(&self.idle).pop();
        let mut conn = match pooled {
            Some(c) => c,
            None => self.open()?,
        };
        let io_err = |source: io::Error| BootstrapError::Io {
            addr: self.addr,
            op,
            key: key.to_owned(),
            source,
        };
        let reply = (|| {
            let body = req.encode()?;
            conn.set_read_timeout(Some(wait.saturating_add(REPLY_SLACK)))?;
            wire::write_frame(&mut conn, &body)?;
            match wire::read_frame(&mut conn, wire::MAX_FRAME)? {
                Some(b) => Response::decode(&b),
                None => Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the store closed the connection",
                )),
            }
        })()
        .map_err(io_err)?;
        lock(&self.idle).push(conn);
        match reply {
            Response::Error(message) => Err(BootstrapError::Refused {
                addr: self.addr,
                op,
                key: key.to_owned(),
                message,
            }),
            r => Ok(r),
        }
    }

    fn unexpected(&self, op: &str, key: &str, r: Response) -> BootstrapError {
        BootstrapError::Protocol {
            addr: self.addr,
            reason: format!("unexpected reply to {op} \"{key}\": {r:?}"),
        }
    }

    /// A new connection, retried until the store's timeout, then the handshake.
    fn open(&self) -> Result<TcpStream, BootstrapError> {
        let start = Instant::now();
        let deadline = deadline_after(self.timeout);
        let mut pause = Duration::from_millis(10);
        let mut stream = loop {
            let attempt = left(deadline).clamp(Duration::from_millis(100), CONNECT_ATTEMPT);
            match TcpStream::connect_timeout(&self.addr, attempt) {
                Ok(s) => break s,
                Err(source) if Instant::now() >= deadline => {
                    return Err(BootstrapError::Connect {
                        addr: self.addr,
                        waited: start.elapsed(),
                        source,
                    })
                }
                Err(e) => {
                    tracing::trace!(addr = %self.addr, "store not reachable yet: {e}");
                    thread::sleep(pause.min(left(deadline)));
                    pause = (pause * 2).min(Duration::from_millis(500));
                }
            }
        };
        let handshake = |stream: &mut TcpStream| -> io::Result<Response> {
            stream.set_nodelay(true)?;
            stream.set_read_timeout(Some(left(deadline).max(Duration::from_secs(1))))?;
            let hello = Request::Hello {
                magic: wire::MAGIC,
                version: wire::VERSION,
                token: self.token.as_bytes().to_vec(),
            };
            wire::write_frame(stream, &hello.encode()?)?;
            match wire::read_frame(stream, wire::MAX_HELLO)? {
                Some(b) => Response::decode(&b),
                None => Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the store closed the connection during the handshake",
                )),
            }
        };
        match handshake(&mut stream) {
            Ok(Response::Welcome) => Ok(stream),
            Ok(Response::Refused(why)) => {
                tracing::debug!(addr = %self.addr, "store refused the handshake: {why}");
                Err(BootstrapError::TokenRefused { addr: self.addr })
            }
            Ok(other) => Err(BootstrapError::Protocol {
                addr: self.addr,
                reason: format!("unexpected reply to the handshake: {other:?}"),
            }),
            Err(source) => Err(BootstrapError::Io {
                addr: self.addr,
                op: "handshake",
                key: String::new(),
                source,
            }),
        }
    }
}

/// `timeout` from now; a timeout too long to represent is about a century.
fn deadline_after(timeout: Duration) -> Instant {
    let now = Instant::now();
    now.checked_add(timeout)
        .or_else(|| now.checked_add(Duration::from_secs(100 * 365 * 24 * 3600)))
        .unwrap_or(now)
}

fn left(deadline: Instant) -> Duration {
    deadline.saturating_duration_since(Instant::now())
}

/// Resolves `host:port` (the value of `MASTER_ADDR` and a port), preferring IPv4.
pub fn resolve(host: &str, port: u16) -> Result<SocketAddr, BootstrapError> {
    let err = |reason: String| BootstrapError::Resolve {
        var: ENV_MASTER_ADDR.to_owned(),
        host: host.to_owned(),
        reason,
    };
    let addrs: Vec<SocketAddr> = (host, port)
        .to_socket_addrs()
        .map_err(|e| err(e.to_string()))?
        .collect();
    // Prefer IPv4: it is what the other ranks most likely resolve the same name to.
    addrs
        .iter()
        .find(|a| a.is_ipv4())
        .or_else(|| addrs.first())
        .copied()
        .ok_or_else(|| err("no addresses".into()))
}
