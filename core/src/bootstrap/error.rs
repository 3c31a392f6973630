//! Errors of the bootstrap: a bad launcher environment, a store that cannot be reached, a key
//! that never came.

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

/// Why rank detection, the store or a rendezvous step failed.
#[derive(Debug, thiserror::Error)]
pub enum BootstrapError {
    /// A launcher variable holds a value that cannot be used.
    #[error("{var}=\"{value}\": {reason}")]
    BadEnv {
        /// The variable.
        var: String,
        /// Its value.
        value: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A variable the job needs is not set.
    #[error("{var} is not set: {reason}")]
    MissingEnv {
        /// The variable.
        var: String,
        /// Why it is needed.
        reason: String,
    },
    /// The store's host name (from `var`) did not resolve.
    #[error("{var}=\"{host}\" does not resolve to an address: {reason}")]
    Resolve {
        /// The variable that named the host.
        var: String,
        /// The host name.
        host: String,
        /// The resolver's answer.
        reason: String,
    },
    /// The store could not listen on its address.
    #[error("could not host the store on {addr}: {source}")]
    Bind {
        /// The address asked for.
        addr: SocketAddr,
        /// The system's reason.
        source: io::Error,
    },
    /// No connection to the store could be made before the deadline.
    #[error("could not connect to the store at {addr} within {waited:?}: {source}")]
    Connect {
        /// The store's address.
        addr: SocketAddr,
        /// How long connecting was retried.
        waited: Duration,
        /// The last attempt's error.
        source: io::Error,
    },
    /// The store answered the handshake with a refusal.
    #[error("the store at {addr} refused this job's token")]
    TokenRefused {
        /// The store's address.
        addr: SocketAddr,
    },
    /// A key did not appear before the deadline.
    #[error("timed out after {waited:?} waiting for key \"{key}\" in the store at {addr}")]
    Timeout {
        /// The store's address.
        addr: SocketAddr,
        /// The key waited for.
        key: String,
        /// The deadline that passed.
        waited: Duration,
    },
    /// The connection failed during an operation.
    #[error("store at {addr}: {op} \"{key}\" failed: {source}")]
    Io {
        /// The store's address.
        addr: SocketAddr,
        /// The operation (`set`, `get`, …).
        op: &'static str,
        /// The key it was about.
        key: String,
        /// The system's reason.
        source: io::Error,
    },
    /// The store answered an operation with an error (e.g. `add` on a key that is not a
    /// counter).
    #[error("store at {addr}: {op} \"{key}\" refused: {message}")]
    Refused {
        /// The store's address.
        addr: SocketAddr,
        /// The operation.
        op: &'static str,
        /// The key it was about.
        key: String,
        /// The store's message.
        message: String,
    },
    /// The peer spoke something other than the store protocol.
    #[error("store at {addr}: protocol error: {reason}")]
    Protocol {
        /// The store's address.
        addr: SocketAddr,
        /// What was wrong.
        reason: String,
    },
    /// Ranks of a rendezvous helper's round did not arrive before the deadline: `all_gather`
    /// names them (`missing`); `barrier`, which counts arrivals, says how many came.
    #[error(
        "{op} \"{name}\" (round {round}): {} within {waited:?}",
        absent_text(.missing, *.arrived, *.world)
    )]
    Absent {
        /// The helper (`all_gather`, `barrier`).
        op: &'static str,
        /// The prefix or barrier name.
        name: String,
        /// The helper's round under that name (0 for the first call).
        round: u64,
        /// The ranks whose contribution never came, ascending (empty when unknown).
        missing: Vec<usize>,
        /// How many ranks arrived.
        arrived: usize,
        /// The world size.
        world: usize,
        /// The deadline that passed.
        waited: Duration,
    },
    /// A rendezvous helper was called with arguments that cannot work (e.g. rank ≥ world), or
    /// the ranks disagree about them.
    #[error("{op} \"{name}\": {reason}")]
    InvalidArgument {
        /// The helper (`all_gather`, `broadcast`, `barrier`).
        op: &'static str,
        /// The prefix, key or barrier name.
        name: String,
        /// What is wrong.
        reason: String,
    },
}

/// "rank 3 of 4 did not arrive", "ranks 1, 2 of 4 did not arrive", or "3 of 4 ranks arrived".
fn absent_text(missing: &[usize], arrived: usize, world: usize) -> String {
    let list = missing
        .iter()
        .map(|r| r.to_string())
        .collect::<Vec<_>>()
        .join(", ");
    match missing.len() {
        0 => format!("{arrived} of {world} ranks arrived"),
        1 => format!("rank {list} of {world} did not arrive"),
        _ => format!("ranks {list} of {world} did not arrive"),
    }
}
