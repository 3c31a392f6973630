//! File descriptors between the ranks of one node: each rank listens on an abstract-namespace
//! UNIX socket and hands its descriptors (`SCM_RIGHTS`) to every peer that connects; peers
//! connect and receive them.
//!
//! The abstract namespace has no file permissions, so both ends check who is on the other side
//! with `SO_PEERCRED`: the same user, and the process id the peer published through the job's
//! store (which admits only the job's ranks). A stranger that connects gets nothing; a stranger
//! that took a rank's name first makes that rank's `bind` fail, and the protocol falls back.

use std::ffi::c_void;
use std::io::{self, Read, Write};
use std::mem::size_of;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// First bytes of a request.
const MAGIC: [u8; 4] = *b"FXW1";
/// Most descriptors one answer carries.
pub const MAX_FDS: usize = 4;
/// Longest abstract name (`sun_path` less its leading NUL).
const MAX_NAME: usize = 107;
/// Longest job id kept verbatim in a name; longer ones are cut and given a hash.
const MAX_JOB: usize = 48;

/// 64-bit FNV-1a: a short, stable digest for names.
pub(crate) fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// The abstract name rank `rank` listens on for window `seq` of communicator `comm` of job
/// `job`: `ferrocx-<job>-<comm>-<seq>-<rank>`. Two jobs have different ids (the launcher's, or
/// one derived from the store's address), so their names never collide; a job id too long for
/// the name is cut and followed by its hash.
pub(crate) fn socket_name(job: &str, comm: u64, seq: u64, rank: usize) -> String {
    let job = if job.len() > MAX_JOB {
        let cut: String = job.chars().take(MAX_JOB - 17).collect();
        format!("{cut}~{:016x}", fnv1a(job.as_bytes()))
    } else {
        job.to_string()
    };
    let name = format!("ferrocx-{job}-{comm:016x}-{seq}-{rank}");
    debug_assert!(name.len() <= MAX_NAME, "{name}");
    name
}

/// `(pid, uid)` of the process on the other end of `sock`.
fn peer_cred(sock: &UnixStream) -> io::Result<(u32, u32)> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `cred` and `len` are writable and `len` is the size of `cred`.
    let rc = unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            &mut cred as *mut libc::ucred as *mut c_void,
            &mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((cred.pid as u32, cred.uid))
}

/// This process's effective user id.
fn my_uid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// Checks that the process on the other end of `sock` is `pid`, of this user.
fn check_peer(sock: &UnixStream, pid: u32) -> io::Result<()> {
    let (got_pid, uid) = peer_cred(sock)?;
    if got_pid != pid || uid != my_uid() {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "the other end is process {got_pid} of user {uid}, expected process {pid} of \
                 user {}",
                my_uid()
            ),
        ));
    }
    Ok(())
}

/// Sends `payload` (non-empty) with `fds` attached (`SCM_RIGHTS`); the descriptors stay open
/// here, the receiver gets its own.
pub fn send_fds(sock: &UnixStream, payload: &[u8], fds: &[RawFd]) -> io::Result<()> {
    let mut iov = libc::iovec {
        iov_base: payload.as_ptr() as *mut c_void,
        iov_len: payload.len(),
    };
    let data_len = std::mem::size_of_val(fds) as u32;
    // SAFETY: CMSG_SPACE is arithmetic.
    let space = unsafe { libc::CMSG_SPACE(data_len) } as usize;
    // u64 storage keeps the control buffer aligned for cmsghdr.
    let mut control = vec![0u64; space.div_ceil(8)];
    // SAFETY: an all-zero msghdr is a valid empty message.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if !fds.is_empty() {
        msg.msg_control = control.as_mut_ptr() as *mut c_void;
        msg.msg_controllen = space as _;
        // SAFETY: the control buffer holds one header and `fds.len()` descriptors (CMSG_SPACE).
        unsafe {
            let cmsg = libc::CMSG_FIRSTHDR(&msg);
            (*cmsg).cmsg_level = libc::SOL_SOCKET;
            (*cmsg).cmsg_type = libc::SCM_RIGHTS;
            (*cmsg).cmsg_len = libc::CMSG_LEN(data_len) as _;
            std::ptr::copy_nonoverlapping(
                fds.as_ptr(),
                libc::CMSG_DATA(cmsg) as *mut RawFd,
                fds.len(),
            );
        }
    }
    // SAFETY: `msg` points to live buffers for the call.
    let n = unsafe { libc::sendmsg(sock.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
    match n {
        n if n < 0 => Err(io::Error::last_os_error()),
        n if n as usize != payload.len() => Err(io::Error::new(
            io::ErrorKind::WriteZero,
            format!("sent {n} of {} bytes", payload.len()),
        )),
        _ => Ok(()),
    }
}

/// Receives one message of at most `payload.len()` bytes and at most [`MAX_FDS`] descriptors:
/// the bytes received and the descriptors, which are this process's from here on.
pub fn recv_fds(sock: &UnixStream, payload: &mut [u8]) -> io::Result<(usize, Vec<OwnedFd>)> {
    let mut iov = libc::iovec {
        iov_base: payload.as_mut_ptr() as *mut c_void,
        iov_len: payload.len(),
    };
    let data_len = (MAX_FDS * size_of::<RawFd>()) as u32;
    // SAFETY: arithmetic.
    let space = unsafe { libc::CMSG_SPACE(data_len) } as usize;
    let mut control = vec![0u64; space.div_ceil(8)];
    // SAFETY: an all-zero msghdr is a valid empty message.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr() as *mut c_void;
    msg.msg_controllen = space as _;
    // SAFETY: `msg` points to live, writable buffers for the call.
    let got = unsafe { libc::recvmsg(sock.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
    if got < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut fds = Vec::new();
    // SAFETY: the kernel filled the control buffer with `msg_controllen` bytes of headers; each
    // SCM_RIGHTS header carries descriptors that are now this process's, taken into `OwnedFd`s
    // at once so that every one is closed on any return below.
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                let bytes = (*cmsg).cmsg_len as usize - libc::CMSG_LEN(0) as usize;
                let data = libc::CMSG_DATA(cmsg) as *const RawFd;
                for i in 0..bytes / size_of::<RawFd>() {
                    fds.push(OwnedFd::from_raw_fd(std::ptr::read_unaligned(data.add(i))));
                }
            }
            cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
        }
    }
    if msg.msg_flags & libc::MSG_CTRUNC != 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("more than {MAX_FDS} descriptors were sent"),
        ));
    }
    Ok((got as usize, fds))
}

/// Waits until `fd` is readable or `wait` has passed.
fn wait_readable(fd: BorrowedFd<'_>, wait: Duration) {
    let mut p = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd; poll only writes its `revents`.
    unsafe { libc::poll(&mut p, 1, wait.as_millis().min(i32::MAX as u128) as i32) };
}

/// A rank's listening socket.
pub(crate) struct FdServer {
    listener: UnixListener,
    name: String,
}

impl FdServer {
    /// Listens on abstract name `name`.
    pub(crate) fn bind(name: &str) -> io::Result<FdServer> {
        let addr = SocketAddr::from_abstract_name(name.as_bytes())?;
        let listener = UnixListener::bind_addr(&addr)?;
        listener.set_nonblocking(true)?;
        Ok(FdServer {
            listener,
            name: name.to_string(),
        })
    }

    /// Hands `fds` to each peer that asks for them, until every rank but `me` of `pids`
    /// (process id of each rank) has had them or `stop` is set. A connection that is not one
    /// of the peers, or that misbehaves, is dropped with a warning; `io_timeout` bounds each
    /// exchange. Returns the ranks served.
    pub(crate) fn serve(
        &self,
        me: usize,
        pids: &[u32],
        fds: &[BorrowedFd<'_>],
        stop: &AtomicBool,
        io_timeout: Duration,
    ) -> Vec<usize> {
        let raw: Vec<RawFd> = fds.iter().map(|f| f.as_raw_fd()).collect();
        let mut served = vec![false; pids.len()];
        if let Some(s) = served.get_mut(me) {
            *s = true;
        }
        while !stop.load(Ordering::Acquire) && served.iter().any(|s| !s) {
            match self.listener.accept() {
                Ok((sock, _)) => match answer(&sock, me, pids, &raw, io_timeout) {
                    Ok(rank) => served[rank] = true,
                    Err(e) => tracing::warn!(socket = %self.name, "refused a connection: {e}"),
                },
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    wait_readable(
                        // SAFETY: the listener's descriptor, open for the whole call.
                        unsafe { BorrowedFd::borrow_raw(self.listener.as_raw_fd()) },
                        Duration::from_millis(10),
                    );
                }
                Err(e) => {
                    tracing::warn!(socket = %self.name, "accept failed: {e}");
                    std::thread::sleep(Duration::from_millis(10));
                }
            }
        }
        (0..pids.len()).filter(|&r| r != me && served[r]).collect()
    }
}

/// Checks the asker on `sock`, reads its request and sends `fds`: the asker's rank. The
/// credentials come first, so a stranger is dropped before anything is read from it.
fn answer(
    sock: &UnixStream,
    me: usize,
    pids: &[u32],
    fds: &[RawFd],
    io_timeout: Duration,
) -> io::Result<usize> {
    let (pid, uid) = peer_cred(sock)?;
    let is_peer = |r: usize| r != me && pids.get(r) == Some(&pid);
    if uid != my_uid() || !(0..pids.len()).any(is_peer) {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("process {pid} of user {uid} is not a peer rank of this window"),
        ));
    }
    sock.set_nonblocking(false)?;
    sock.set_read_timeout(Some(io_timeout))?;
    sock.set_write_timeout(Some(io_timeout))?;
    let mut req = [0u8; 8];
    (&*sock).read_exact(&mut req)?;
    // Ranks may share a process (threads as ranks): the claimed rank must be one of its.
    let rank = u32::from_le_bytes([req[4], req[5], req[6], req[7]]) as usize;
    if req[..4] != MAGIC || !is_peer(rank) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("process {pid} sent a request that is not one of its ranks'"),
        ));
    }
    send_fds(sock, &[fds.len() as u8], fds)?;
    Ok(rank)
}

/// Connects to rank `peer` (process `pid`) at abstract name `name`, as rank `me`, and receives
/// its descriptors; `timeout` bounds every wait.
pub(crate) fn fetch(
    name: &str,
    me: usize,
    pid: u32,
    timeout: Duration,
) -> io::Result<Vec<OwnedFd>> {
    let addr = SocketAddr::from_abstract_name(name.as_bytes())?;
    let sock = UnixStream::connect_addr(&addr)?;
    sock.set_read_timeout(Some(timeout))?;
    sock.set_write_timeout(Some(timeout))?;
    check_peer(&sock, pid)?;
    let mut req = [0u8; 8];
    req[..4].copy_from_slice(&MAGIC);
    req[4..].copy_from_slice(&(me as u32).to_le_bytes());
    (&sock).write_all(&req)?;
    let mut payload = [0u8; 1];
    let (n, fds) = recv_fds(&sock, &mut payload)?;
    if n != 1 || payload[0] as usize != fds.len() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "the answer announced {} descriptors and carried {} ({n} bytes)",
                payload[0],
                fds.len()
            ),
        ));
    }
    Ok(fds)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    fn name(tag: &str) -> String {
        socket_name(&format!("unit-{tag}-{}", std::process::id()), 7, 1, 0)
    }

    #[test]
    fn names_are_distinct_per_job_and_fit_the_address() {
        let a = socket_name("job-a", 1, 2, 3);
        assert_eq!(a, "ferrocx-job-a-0000000000000001-2-3");
        assert_ne!(a, socket_name("job-b", 1, 2, 3));
        assert_ne!(a, socket_name("job-a", 2, 2, 3));
        let long_a = socket_name(&"x".repeat(128), u64::MAX, u64::MAX, 4095);
        let long_b = socket_name(&format!("{}y", "x".repeat(127)), u64::MAX, u64::MAX, 4095);
        assert!(long_a.len() <= MAX_NAME, "{long_a}");
        assert_ne!(
            long_a, long_b,
            "two long ids that share a prefix stay apart"
        );
    }

    /// A memory file holding `text`, as a descriptor.
    fn memfd(text: &[u8]) -> OwnedFd {
        // SAFETY: a NUL-terminated name; the new descriptor is ours.
        let fd = unsafe { libc::memfd_create(c"fdpass-test".as_ptr(), libc::MFD_CLOEXEC) };
        assert!(fd >= 0, "{}", io::Error::last_os_error());
        // SAFETY: a new descriptor nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        std::fs::File::from(fd.try_clone().unwrap())
            .write_all(text)
            .unwrap();
        fd
    }

    fn read_all(fd: OwnedFd) -> Vec<u8> {
        let mut f = std::fs::File::from(fd);
        let mut out = Vec::new();
        std::io::Seek::rewind(&mut f).unwrap();
        f.read_to_end(&mut out).unwrap();
        out
    }

    #[test]
    fn descriptors_reach_the_expected_peer_only() {
        let n = name("pass");
        let server = FdServer::bind(&n).unwrap();
        // The name is taken while the server lives.
        assert!(FdServer::bind(&n).is_err());
        let (a, b) = (memfd(b"first"), memfd(b"second"));
        let me = std::process::id();
        let stop = AtomicBool::new(false);
        let t = Duration::from_secs(10);
        std::thread::scope(|s| {
            // Ranks 0 (server), 1 and 2 are all this process here.
            let served =
                s.spawn(|| server.serve(0, &[me, me, me], &[a.as_fd(), b.as_fd()], &stop, t));
            for rank in [1usize, 2] {
                let got = fetch(&n, rank, me, t).unwrap();
                assert_eq!(got.len(), 2);
                let mut got = got.into_iter();
                assert_eq!(read_all(got.next().unwrap()), b"first");
                assert_eq!(read_all(got.next().unwrap()), b"second");
            }
            assert_eq!(served.join().unwrap(), vec![1, 2]);
        });
        // A server expecting another process refuses this one, and the fetcher refuses a
        // server that is not the process it expected.
        let stop = AtomicBool::new(false);
        std::thread::scope(|s| {
            let served =
                s.spawn(|| server.serve(0, &[me, me.wrapping_add(1)], &[a.as_fd()], &stop, t));
            let e = fetch(&n, 1, me, t).expect_err("the server must refuse");
            assert_ne!(e.kind(), io::ErrorKind::PermissionDenied, "{e}");
            let e = fetch(&n, 1, me.wrapping_add(1), t).expect_err("the wrong server");
            assert_eq!(e.kind(), io::ErrorKind::PermissionDenied, "{e}");
            stop.store(true, Ordering::Release);
            assert_eq!(served.join().unwrap(), Vec::<usize>::new());
        });
        drop(server);
        assert!(fetch(&n, 1, me, t).is_err(), "nobody listens any more");
    }
}
