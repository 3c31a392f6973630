//! File descriptors over a UNIX socket, for the cross-process tests: the core's `SCM_RIGHTS`
//! helpers, asserting instead of returning errors.

use std::os::fd::{OwnedFd, RawFd};
use std::os::unix::net::UnixStream;

use ferrocx::window::fdpass;

/// Sends `fds` with one byte of payload.
pub fn send_fds(sock: &UnixStream, fds: &[RawFd]) {
    fdpass::send_fds(sock, b"F", fds).expect("send descriptors");
}

/// Receives exactly `n` descriptors sent by [`send_fds`].
pub fn recv_fds(sock: &UnixStream, n: usize) -> Vec<OwnedFd> {
    let mut payload = [0u8; 1];
    let (got, fds) = fdpass::recv_fds(sock, &mut payload).expect("receive descriptors");
    assert_eq!((got, payload[0]), (1, b'F'), "the payload of send_fds");
    assert_eq!(fds.len(), n, "descriptors received");
    fds
}
