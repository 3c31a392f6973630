//! The store's server: a key-value map behind a TCP listener.
//!
//! A new connection is not trusted until it has shown the job's token: the accept thread reads
//! every hello itself, without blocking (poll(2) over the listener and the connections still in
//! their handshake), so an idle or slow client costs one descriptor and a small buffer, never a
//! thread. The whole hello must arrive within [`StoreLimits::hello_timeout`] of the accept, and
//! at most [`StoreLimits::max_unauthenticated`] connections wait for theirs: a new one beyond it
//! closes the oldest, so a flood of idle connections cannot keep a real rank out (a rank
//! completes its hello within milliseconds). Only an authenticated connection gets a thread.

use std::collections::{HashMap, VecDeque};
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use super::wire::{self, Request, Response};

/// How often the accept loop looks at the stop flag.
const ACCEPT_POLL_MS: i32 = 100;
/// Connections accepted per wake-up at most, so that the handshakes in progress are served too.
const ACCEPT_BURST: usize = 64;

/// What a store server allows connections that have not shown the token yet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StoreLimits {
    /// Time from the accept to a complete hello (the whole frame, however it is split).
    pub hello_timeout: Duration,
    /// Connections in their handshake at once; a new one beyond it closes the oldest.
    pub max_unauthenticated: usize,
}

impl Default for StoreLimits {
    /// 10 s for the hello, 128 connections in their handshake.
    fn default() -> Self {
        StoreLimits {
            hello_timeout: Duration::from_secs(10),
            max_unauthenticated: 128,
        }
    }
}

/// A running store: listens on its address and serves clients on background threads until it
/// is shut down or dropped.
///
/// Every connection must first present the job's token; one that does not is refused, closed,
/// and logged at WARN with the peer's address.
pub struct StoreServer {
    local_addr: SocketAddr,
    shared: Arc<Shared>,
    acceptor: Option<JoinHandle<Vec<JoinHandle<()>>>>,
}

struct Shared {
    token: String,
    data: Mutex<HashMap<String, Vec<u8>>>,
    /// Signalled on every change of `data`, and on stop.
    changed: Condvar,
    /// Set under the `data` lock, so a waiter cannot miss it.
    stop: AtomicBool,
    /// Clones of the open connections, shut down on stop to end their blocked reads.
    conns: Mutex<HashMap<u64, TcpStream>>,
    next_conn: AtomicU64,
    local_addr: SocketAddr,
    limits: StoreLimits,
}

impl StoreServer {
    /// Listens on `addr` (port 0: any free port; [`local_addr`](Self::local_addr) tells which)
    /// and starts serving clients that present `token`.
    pub fn bind(addr: SocketAddr, token: String) -> io::Result<StoreServer> {
        Self::bind_with(addr, token, StoreLimits::default())
    }

    /// [`bind`](Self::bind) with explicit limits on unauthenticated connections.
    pub fn bind_with(
        addr: SocketAddr,
        token: String,
        limits: StoreLimits,
    ) -> io::Result<StoreServer> {
        let listener = TcpListener::bind(addr)?;
        // Non-blocking so that the accept loop, woken by poll(2), never blocks past a stop.
        listener.set_nonblocking(true)?;
        let local_addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            token,
            data: Mutex::new(HashMap::new()),
            changed: Condvar::new(),
            stop: AtomicBool::new(false),
            conns: Mutex::new(HashMap::new()),
            next_conn: AtomicU64::new(0),
            local_addr,
            limits: StoreLimits {
                max_unauthenticated: limits.max_unauthenticated.max(1),
                ..limits
            },
        });
        let s = Arc::clone(&shared);
        let acceptor = thread::Builder::new()
            .name("ferrocx-store".into())
            .spawn(move || accept_loop(listener, s))?;
        tracing::debug!(addr = %local_addr, "store listening");
        Ok(StoreServer {
            local_addr,
            shared,
            acceptor: Some(acceptor),
        })
    }

    /// The address it listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Stops listening, ends every connection (clients then get an error), and waits for the
    /// server's threads. Dropping the server does the same.
    pub fn shutdown(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        let Some(acceptor) = self.acceptor.take() else {
            return;
        };
        {
            let _data = lock(&self.shared.data);
            self.shared.stop.store(true, Ordering::SeqCst);
            self.shared.changed.notify_all();
        }
        // The acceptor ends within one poll period; after it, no new connection can appear.
        let handlers = acceptor.join().unwrap_or_default();
        for conn in lock(&self.shared.conns).values() {
            let _ = conn.shutdown(Shutdown::Both);
        }
        for h in handlers {
            let _ = h.join();
        }
        tracing::debug!(addr = %self.local_addr, "store stopped");
    }
}

impl Drop for StoreServer {
    fn drop(&mut self) {
        self.stop();
    }
}

impl std::fmt::Debug for StoreServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreServer")
            .field("local_addr", &self.local_addr)
            .finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panicked handler must not take the whole store down with it.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A connection in its handshake: non-blocking, with what it sent so far.
struct Pending {
    stream: TcpStream,
    peer: SocketAddr,
    deadline: Instant,
    buf: Vec<u8>,
}

/// What a handshake came to after a read.
enum Hello {
    /// More bytes are needed.
    Partial,
    /// The peer closed before a whole hello.
    Closed,
    /// Refused, with the reason (sent to the peer).
    Refused(String),
    /// The token matched.
    Admitted,
}

fn accept_loop(listener: TcpListener, shared: Arc<Shared>) -> Vec<JoinHandle<()>> {
    let mut handlers: Vec<JoinHandle<()>> = Vec::new();
    let mut pending: VecDeque<Pending> = VecDeque::new();
    let mut evicted: u64 = 0;
    let mut fds: Vec<libc::pollfd> = Vec::new();
    while !shared.stop.load(Ordering::SeqCst) {
        let now = Instant::now();
        let wait = pending
            .iter()
            .map(|p| p.deadline.saturating_duration_since(now))
            .min()
            .map_or(ACCEPT_POLL_MS, |d| {
                (d.as_millis().min(ACCEPT_POLL_MS as u128) as i32).max(1)
            });
        fds.clear();
        fds.push(libc::pollfd {
            fd: listener.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        });
        fds.extend(pending.iter().map(|p| libc::pollfd {
            fd: p.stream.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        }));
        // SAFETY: `fds` holds `fds.len()` valid pollfds that live across the call; every fd in
        // it is open for as long as the listener and the pending streams are (not dropped
        // before the results are read below).
        let ready = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, wait) };
        if ready < 0 {
            continue;
        }
        // The handshakes first (their indices are those of `pending` before any accept).
        let mut keep: VecDeque<Pending> = VecDeque::with_capacity(pending.len());
        let now = Instant::now();
        for (mut p, fd) in pending.drain(..).zip(fds[1..].iter()) {
            let outcome = if fd.revents != 0 {
                read_hello(&mut p, &shared)
            } else {
                Hello::Partial
            };
            match outcome {
                Hello::Partial if now >= p.deadline => {
                    let why = format!(
                        "no complete hello within {} ms of connecting",
                        shared.limits.hello_timeout.as_millis()
                    );
                    refuse(&mut p.stream, p.peer, &shared, &why);
                }
                Hello::Partial => keep.push_back(p),
                Hello::Closed => {}
                Hello::Refused(why) => refuse(&mut p.stream, p.peer, &shared, &why),
                Hello::Admitted => admit(p, &shared, &mut handlers),
            }
        }
        pending = keep;
        if fds[0].revents == 0 {
            continue;
        }
        for _ in 0..ACCEPT_BURST {
            let (stream, peer) = match listener.accept() {
                Ok(c) => c,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    // E.g. out of file descriptors: back off instead of spinning.
                    tracing::warn!(addr = %shared.local_addr, "store: accept failed: {e}");
                    thread::sleep(Duration::from_millis(ACCEPT_POLL_MS as u64));
                    break;
                }
            };
            if stream.set_nonblocking(true).is_err() {
                continue;
            }
            if pending.len() >= shared.limits.max_unauthenticated {
                // The oldest has had the longest to say hello: it goes.
                if let Some(mut old) = pending.pop_front() {
                    if evicted == 0 {
                        tracing::warn!(
                            store = %shared.local_addr,
                            "store: {} connections are waiting for their hello (the limit); \
                             closing the oldest for each new one",
                            shared.limits.max_unauthenticated
                        );
                    }
                    evicted += 1;
                    tracing::debug!(peer = %old.peer, "store: closed a connection still in its handshake");
                    let _ = write_refusal(
                        &mut old.stream,
                        "too many connections are waiting for their hello",
                    );
                }
            }
            pending.push_back(Pending {
                stream,
                peer,
                deadline: Instant::now() + shared.limits.hello_timeout,
                buf: Vec::new(),
            });
        }
    }
    handlers
}

/// Reads what a pending connection has sent, without blocking, and judges a whole hello.
fn read_hello(p: &mut Pending, shared: &Shared) -> Hello {
    let mut chunk = [0u8; 4096];
    loop {
        // The length prefix, then exactly the frame: nothing past the hello is read here.
        let want = match p.buf.len() {
            n if n < 4 => 4 - n,
            n => {
                let len = u32::from_le_bytes([p.buf[0], p.buf[1], p.buf[2], p.buf[3]]);
                if len > wire::MAX_HELLO {
                    return Hello::Refused(format!(
                        "bad hello: frame of {len} bytes is over the limit of {}",
                        wire::MAX_HELLO
                    ));
                }
                let total = 4 + len as usize;
                if n >= total {
                    return judge(&p.buf[4..total], shared);
                }
                total - n
            }
        };
        match p.stream.read(&mut chunk[..want.min(4096)]) {
            Ok(0) => return Hello::Closed,
            Ok(n) => p.buf.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Hello::Partial,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return Hello::Closed,
        }
    }
}

/// Whether a whole hello frame admits its sender.
fn judge(body: &[u8], shared: &Shared) -> Hello {
    match Request::decode(body) {
        Ok(Request::Hello {
            magic,
            version,
            token,
        }) if magic == wire::MAGIC => {
            if version != wire::VERSION {
                Hello::Refused(format!(
                    "protocol version {version}, this store speaks {}",
                    wire::VERSION
                ))
            } else if !same_token(&token, shared.token.as_bytes()) {
                Hello::Refused("wrong job token".into())
            } else {
                Hello::Admitted
            }
        }
        Ok(_) => Hello::Refused("the first message is not a store hello".into()),
        Err(e) => Hello::Refused(format!("bad hello: {e}")),
    }
}

/// Best effort: the refusal is a few bytes, which a fresh socket's buffer takes at once.
fn write_refusal(stream: &mut TcpStream, why: &str) -> io::Result<()> {
    let body = Response::Refused(why.to_owned()).encode()?;
    let mut frame = (body.len() as u32).to_le_bytes().to_vec();
    frame.extend_from_slice(&body);
    stream.write_all(&frame)
}

fn refuse(stream: &mut TcpStream, peer: SocketAddr, shared: &Shared, why: &str) {
    tracing::warn!(%peer, store = %shared.local_addr, "store: refused a connection: {why}");
    let _ = write_refusal(stream, why);
}

/// Welcomes an authenticated connection and gives it a thread.
fn admit(p: Pending, shared: &Arc<Shared>, handlers: &mut Vec<JoinHandle<()>>) {
    let Pending {
        mut stream, peer, ..
    } = p;
    if stream.set_nonblocking(false).is_err() {
        return;
    }
    let _ = stream.set_nodelay(true);
    // A rank reads its welcome at once; one that does not is not worth waiting for.
    let _ = stream.set_write_timeout(Some(shared.limits.hello_timeout));
    let welcome = match Response::Welcome.encode() {
        Ok(b) => b,
        Err(_) => return,
    };
    if wire::write_frame(&mut stream, &welcome).is_err() {
        return;
    }
    let _ = stream.set_write_timeout(None);
    handlers.retain(|h| !h.is_finished());
    let id = shared.next_conn.fetch_add(1, Ordering::Relaxed);
    match stream.try_clone() {
        Ok(clone) => {
            lock(&shared.conns).insert(id, clone);
        }
        Err(e) => {
            tracing::warn!(%peer, "store: dropping a connection: {e}");
            return;
        }
    }
    let s = Arc::clone(shared);
    let spawned = thread::Builder::new()
        .name("ferrocx-store-conn".into())
        .spawn(move || {
            serve(stream, peer, &s);
            lock(&s.conns).remove(&id);
        });
    match spawned {
        Ok(h) => handlers.push(h),
        Err(e) => {
            tracing::warn!(%peer, "store: no thread for a connection: {e}");
            if let Some(c) = lock(&shared.conns).remove(&id) {
                let _ = c.shutdown(Shutdown::Both);
            }
        }
    }
}

/// Compares two secrets in time that depends on their lengths only, not on where they differ.
fn same_token(a: &[u8], b: &[u8]) -> bool {
    let mut diff = (a.len() ^ b.len()) as u64;
    for i in 0..a.len().max(b.len()) {
        let x = a.get(i).copied().unwrap_or(0);
        let y = b.get(i).copied().unwrap_or(0);
        diff |= u64::from(x ^ y);
    }
    std::hint::black_box(diff) == 0
}

/// Serves an authenticated connection (welcomed already) until it closes or the store stops.
fn serve(mut stream: TcpStream, peer: SocketAddr, shared: &Shared) {
    loop {
        let body = match wire::read_frame(&mut stream, wire::MAX_FRAME) {
            Ok(Some(b)) => b,
            Ok(None) => return,
            Err(e) => {
                if !shared.stop.load(Ordering::SeqCst) {
                    tracing::debug!(%peer, "store: connection ended: {e}");
                }
                return;
            }
        };
        let response = match Request::decode(&body) {
            Ok(req) => handle(req, shared),
            Err(e) => {
                tracing::warn!(%peer, "store: bad request, closing: {e}");
                return;
            }
        };
        let sent = response
            .encode()
            .and_then(|b| wire::write_frame(&mut stream, &b));
        if sent.is_err() {
            return;
        }
    }
}

fn handle(req: Request, shared: &Shared) -> Response {
    match req {
        Request::Hello { .. } => Response::Error("already greeted".into()),
        Request::Set { key, value } => {
            lock(&shared.data).insert(key, value);
            shared.changed.notify_all();
            Response::Done
        }
        Request::Get { key, wait_ms } => {
            // A wait too long to represent is a wait without end.
            let deadline = Instant::now().checked_add(Duration::from_millis(wait_ms));
            let mut data = lock(&shared.data);
            loop {
                if let Some(v) = data.get(&key) {
                    return Response::Value(v.clone());
                }
                if shared.stop.load(Ordering::SeqCst) {
                    return Response::Error("the store is shutting down".into());
                }
                data = match deadline {
                    Some(d) => {
                        let left = d.saturating_duration_since(Instant::now());
                        if left.is_zero() {
                            return Response::Missing;
                        }
                        shared
                            .changed
                            .wait_timeout(data, left)
                            .unwrap_or_else(PoisonError::into_inner)
                            .0
                    }
                    None => shared
                        .changed
                        .wait(data)
                        .unwrap_or_else(PoisonError::into_inner),
                };
            }
        }
        Request::Add { key, delta } => {
            let mut data = lock(&shared.data);
            // Counters are stored as decimal text, as torch's TCPStore does, so `get` reads them.
            let old = match data.get(&key) {
                None => 0,
                Some(v) => match std::str::from_utf8(v)
                    .ok()
                    .and_then(|s| s.parse::<i64>().ok())
                {
                    Some(n) => n,
                    None => {
                        return Response::Error(
                            "the key holds a value that is not a counter".into(),
                        )
                    }
                },
            };
            let Some(new) = old.checked_add(delta) else {
                return Response::Error(format!("{old} + {delta} overflows"));
            };
            data.insert(key, new.to_string().into_bytes());
            shared.changed.notify_all();
            Response::Int(new)
        }
        Request::Delete { key } => {
            let existed = lock(&shared.data).remove(&key).is_some();
            Response::Bool(existed)
        }
        Request::Check { keys } => {
            let data = lock(&shared.data);
            Response::Bool(keys.iter().all(|k| data.contains_key(k)))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::same_token;

    #[test]
    fn tokens_compare_by_content_and_length() {
        assert!(same_token(b"abc", b"abc"));
        assert!(same_token(b"", b""));
        assert!(!same_token(b"abc", b"abd"));
        assert!(!same_token(b"abc", b"abcd"));
        assert!(!same_token(b"", b"a"));
    }
}
