//! The store's server: a key-value map behind a TCP listener, one thread per client connection.

use std::collections::HashMap;
use std::io;
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use super::wire::{self, Request, Response};

/// How long a new connection may take to present its token.
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);
/// How often the accept loop looks at the stop flag.
const ACCEPT_POLL_MS: i32 = 100;

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
}

impl StoreServer {
    /// Listens on `addr` (port 0: any free port; [`local_addr`](Self::local_addr) tells which)
    /// and starts serving clients that present `token`.
    pub fn bind(addr: SocketAddr, token: String) -> io::Result<StoreServer> {
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

fn accept_loop(listener: TcpListener, shared: Arc<Shared>) -> Vec<JoinHandle<()>> {
    let mut handlers: Vec<JoinHandle<()>> = Vec::new();
    while !shared.stop.load(Ordering::SeqCst) {
        let mut pfd = libc::pollfd {
            fd: listener.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: `pfd` is one valid pollfd that lives across the call; the listener's fd is
        // open for as long as `listener` is.
        let ready = unsafe { libc::poll(&mut pfd, 1, ACCEPT_POLL_MS) };
        if ready <= 0 {
            continue;
        }
        let (stream, peer) = match listener.accept() {
            Ok(c) => c,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => {
                // E.g. out of file descriptors: back off instead of spinning.
                tracing::warn!(addr = %shared.local_addr, "store: accept failed: {e}");
                thread::sleep(Duration::from_millis(ACCEPT_POLL_MS as u64));
                continue;
            }
        };
        handlers.retain(|h| !h.is_finished());
        let id = shared.next_conn.fetch_add(1, Ordering::Relaxed);
        match stream.try_clone() {
            Ok(clone) => {
                lock(&shared.conns).insert(id, clone);
            }
            Err(e) => {
                tracing::warn!(%peer, "store: dropping a connection: {e}");
                continue;
            }
        }
        let s = Arc::clone(&shared);
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
    handlers
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

fn serve(mut stream: TcpStream, peer: SocketAddr, shared: &Shared) {
    let _ = stream.set_nonblocking(false);
    let _ = stream.set_nodelay(true);
    let _ = stream.set_read_timeout(Some(HELLO_TIMEOUT));
    let refuse = |stream: &mut TcpStream, why: &str| {
        tracing::warn!(%peer, store = %shared.local_addr, "store: refused a connection: {why}");
        if let Ok(body) = Response::Refused(why.to_owned()).encode() {
            let _ = wire::write_frame(stream, &body);
        }
    };
    let hello = match wire::read_frame(&mut stream, wire::MAX_HELLO) {
        Ok(Some(body)) => Request::decode(&body),
        Ok(None) => return,
        Err(e) => Err(e),
    };
    match hello {
        Ok(Request::Hello {
            magic,
            version,
            token,
        }) if magic == wire::MAGIC => {
            if version != wire::VERSION {
                let why = format!(
                    "protocol version {version}, this store speaks {}",
                    wire::VERSION
                );
                return refuse(&mut stream, &why);
            }
            if !same_token(&token, shared.token.as_bytes()) {
                return refuse(&mut stream, "wrong job token");
            }
        }
        Ok(_) => return refuse(&mut stream, "the first message is not a store hello"),
        Err(e) => return refuse(&mut stream, &format!("bad hello: {e}")),
    }
    let welcome = match Response::Welcome.encode() {
        Ok(b) => b,
        Err(_) => return,
    };
    if wire::write_frame(&mut stream, &welcome).is_err() {
        return;
    }
    let _ = stream.set_read_timeout(None);
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
