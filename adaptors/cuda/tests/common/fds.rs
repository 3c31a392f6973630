//! File descriptors over a UNIX socket (`SCM_RIGHTS`), for the cross-process tests (the same
//! helper as the host adaptor's tests use).

use std::ffi::c_void;
use std::mem::size_of;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;

/// Sends `fds` with one byte of payload (`SCM_RIGHTS`).
pub fn send_fds(sock: &UnixStream, fds: &[RawFd]) {
    let payload = [b'F'];
    let mut iov = libc::iovec {
        iov_base: payload.as_ptr() as *mut c_void,
        iov_len: 1,
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
    msg.msg_control = control.as_mut_ptr() as *mut c_void;
    msg.msg_controllen = space as _;
    // SAFETY: the control buffer holds one header and `fds.len()` descriptors (CMSG_SPACE).
    unsafe {
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        (*cmsg).cmsg_level = libc::SOL_SOCKET;
        (*cmsg).cmsg_type = libc::SCM_RIGHTS;
        (*cmsg).cmsg_len = libc::CMSG_LEN(data_len) as _;
        std::ptr::copy_nonoverlapping(fds.as_ptr(), libc::CMSG_DATA(cmsg) as *mut RawFd, fds.len());
    }
    // SAFETY: `msg` points to live buffers for the call.
    let n = unsafe { libc::sendmsg(sock.as_raw_fd(), &msg, 0) };
    assert_eq!(n, 1, "sendmsg: {}", std::io::Error::last_os_error());
}

/// Receives exactly `n` descriptors sent by [`send_fds`].
pub fn recv_fds(sock: &UnixStream, n: usize) -> Vec<OwnedFd> {
    let mut payload = [0u8; 1];
    let mut iov = libc::iovec {
        iov_base: payload.as_mut_ptr() as *mut c_void,
        iov_len: 1,
    };
    let data_len = (n * size_of::<libc::c_int>()) as u32;
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
    assert_eq!(got, 1, "recvmsg: {}", std::io::Error::last_os_error());
    assert_eq!(payload[0], b'F');
    assert_eq!(
        msg.msg_flags & libc::MSG_CTRUNC,
        0,
        "control data truncated"
    );
    // SAFETY: the kernel filled one SCM_RIGHTS header with `n` descriptors, now ours.
    unsafe {
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        assert!(!cmsg.is_null(), "no descriptors received");
        assert_eq!((*cmsg).cmsg_type, libc::SCM_RIGHTS);
        assert_eq!((*cmsg).cmsg_len as usize, libc::CMSG_LEN(data_len) as usize);
        let data = libc::CMSG_DATA(cmsg) as *const RawFd;
        (0..n)
            .map(|i| OwnedFd::from_raw_fd(std::ptr::read_unaligned(data.add(i))))
            .collect()
    }
}
