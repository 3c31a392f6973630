//! A UNIX socket between two workers, and a barrier over it.

use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::time::{Duration, Instant};

/// The two ends of a connection between two workers: rank 0 listens at `path`, rank 1
/// connects (retrying until rank 0 is there, at most 30 s). Reads and writes time out after
/// 60 s, so a peer that died fails the other instead of hanging it.
pub fn connect(path: &Path, rank: usize) -> UnixStream {
    let s = if rank == 0 {
        let l = UnixListener::bind(path).expect("bind the test socket");
        let (s, _) = l.accept().expect("accept the peer");
        let _ = std::fs::remove_file(path);
        s
    } else {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            match UnixStream::connect(path) {
                Ok(s) => break s,
                Err(_) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) => panic!("connect to {}: {e}", path.display()),
            }
        }
    };
    let t = Some(Duration::from_secs(60));
    s.set_read_timeout(t).expect("read timeout");
    s.set_write_timeout(t).expect("write timeout");
    s
}

/// Both workers reach this point before either goes on.
pub fn barrier(s: &mut UnixStream) {
    s.write_all(b"B").expect("barrier: write");
    let mut b = [0u8; 1];
    s.read_exact(&mut b)
        .expect("barrier: read (did the peer fail?)");
    assert_eq!(&b, b"B");
}
