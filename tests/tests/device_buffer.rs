//! `DeviceBuffer`: the safe owner of device memory. Data round trips on the host device, bounds
//! refused before any call reaches the adaptor, and the allocation given back on drop (counted
//! by the test plugin's `mem_get_info`).

use ferrocx::abi::{MemKind, Status};
use ferrocx::adaptor::{AdaptorError, Device, DeviceBuffer};
use ferrocx::registry::Registry;
use ferrocx_tests::rust_plugin;

/// The built-in host device, initialised.
fn host_device() -> Device {
    ferrocx_adaptor_host::link();
    let r = Registry::with_builtins();
    let dev = r
        .device("host")
        .expect("the host adaptor is built in")
        .device()
        .expect("device");
    dev.init(&[]).expect("init");
    dev
}

fn is_out_of_bounds(r: Result<(), AdaptorError>, op: &str) -> bool {
    matches!(
        r,
        Err(AdaptorError::Failed { op: o, status: Status::INVALID_ARGUMENT, ref message, .. })
            if o == op && message.contains("do not fit")
    )
}

#[test]
fn data_goes_in_and_comes_back_at_every_kind_and_offset() {
    let dev = host_device();
    for kind in [MemKind::DEVICE, MemKind::HOST, MemKind::PINNED] {
        let data: Vec<u8> = (0..4099u32).map(|i| (i * 7 % 251) as u8).collect();
        let mut buf = DeviceBuffer::from_host(&dev, &data, kind).expect("from_host");
        assert_eq!((buf.len(), buf.kind()), (data.len(), kind));
        assert_eq!(buf.to_vec().expect("to_vec"), data, "{kind:?}");

        // A slice written at an offset lands there and nowhere else.
        buf.copy_from_host_at(100, &[0xAB; 10]).expect("at 100");
        let mut want = data.clone();
        want[100..110].fill(0xAB);
        assert_eq!(buf.to_vec().expect("to_vec"), want);
        let mut part = [0u8; 12];
        buf.copy_to_host_at(99, &mut part).expect("read at 99");
        assert_eq!(part, want[99..111]);

        buf.fill(0x3C).expect("fill");
        assert_eq!(buf.to_vec().expect("to_vec"), vec![0x3C; data.len()]);
    }
}

#[test]
fn copies_past_the_end_are_refused_and_change_nothing() {
    let dev = host_device();
    let mut buf = DeviceBuffer::from_host(&dev, &[1, 2, 3, 4], MemKind::DEVICE).expect("alloc");
    assert!(is_out_of_bounds(
        buf.copy_from_host(&[9; 5]),
        "copy_from_host"
    ));
    assert!(is_out_of_bounds(
        buf.copy_from_host_at(3, &[9; 2]),
        "copy_from_host"
    ));
    assert!(is_out_of_bounds(
        buf.copy_from_host_at(usize::MAX, &[9]),
        "copy_from_host"
    ));
    let mut out = [0u8; 5];
    assert!(is_out_of_bounds(buf.copy_to_host(&mut out), "copy_to_host"));
    assert!(is_out_of_bounds(
        buf.copy_to_host_at(4, &mut out[..1]),
        "copy_to_host"
    ));
    assert_eq!(out, [0; 5], "a refused read writes nothing");
    assert_eq!(buf.to_vec().expect("to_vec"), [1, 2, 3, 4]);
    // The end itself is an address; past it is not.
    let base = buf.ptr().0;
    assert_eq!(buf.ptr_at(4).map(|p| p.0), Some(base + 4));
    assert_eq!(buf.ptr_at(5), None);
}

#[test]
fn an_empty_buffer_takes_empty_copies_only() {
    let dev = host_device();
    let mut buf = DeviceBuffer::new(&dev, 0, MemKind::DEVICE).expect("a 0-byte buffer");
    assert!(buf.is_empty());
    buf.copy_from_host(&[]).expect("nothing to copy");
    buf.fill(7).expect("nothing to fill");
    assert_eq!(buf.to_vec().expect("to_vec"), Vec::<u8>::new());
    assert!(is_out_of_bounds(buf.copy_from_host(&[1]), "copy_from_host"));
}

#[test]
fn dropping_a_buffer_frees_its_allocation() {
    let mut r = Registry::empty();
    let e = r.add_plugin(&rust_plugin()).expect("the Rust plugin loads");
    let dev = e.device().expect("device");
    dev.init(&[]).expect("init");
    let (free, _) = dev.mem_get_info().expect("mem_get_info");
    let buf = DeviceBuffer::new(&dev, 1 << 20, MemKind::DEVICE).expect("alloc");
    assert_eq!(
        dev.mem_get_info().expect("mem_get_info").0,
        free - (1 << 20)
    );
    // The test device copies only between its own allocations: a host address is refused,
    // and the error comes back instead of a copy.
    let mut buf = buf;
    let err = buf
        .copy_from_host(&[1, 2, 3])
        .expect_err("host addresses refused");
    assert_eq!(err.status(), Status::INVALID_ARGUMENT);
    drop(buf);
    assert_eq!(dev.mem_get_info().expect("mem_get_info").0, free);
}
