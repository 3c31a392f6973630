//! Hostile and careless inputs to the library (issue 17): each test here failed before its fix.
//! The inputs that go through the `ferrocx` command are in `cli/tests/hostile.rs`.
//!
//! - Loader: a table's `struct_size` that is not whole entries, or larger than any table of its
//!   minor can be, is refused with path, symbol, size and rule, for every table and group.
//! - Store: a client that drips its hello is dropped at the handshake's deadline, and
//!   unauthenticated connections are capped while a real rank still gets in.
//! - Config: one pass for positions, bounded regular-file reads, named duplicate keys, located
//!   too-deep headers, control characters in names, and plugin dirs that do not exist.

use ferrocx::loader::LoadErrorKind;
use ferrocx::registry::Registry;
use ferrocx_tests::c_plugin;

// ---- 2. Loader: table sizes ----

#[test]
fn a_table_size_that_is_not_whole_entries_is_refused_with_path_symbol_and_rule() {
    let mut r = Registry::empty();
    let path = c_plugin("oddsize");
    let e = r.add_plugin(&path).err().expect("refused");
    assert_eq!(e.kind, LoadErrorKind::BadHeader);
    assert_eq!(e.path, path);
    assert_eq!(e.symbol.as_deref(), Some("ferrocx_device_adaptor_v1"));
    // The C plugins declare this build's minor.
    let want = format!(
        "struct_size 52 (ABI 1.{}) refused: a table is the 24-byte header plus whole 8-byte entries",
        ferrocx::abi::ABI_MINOR
    );
    assert!(e.reason.contains(&want), "{e}");
}

#[test]
fn an_absurd_table_size_of_a_known_minor_is_refused() {
    let mut r = Registry::empty();
    let e = r.add_plugin(&c_plugin("hugesize")).err().expect("refused");
    assert_eq!(e.kind, LoadErrorKind::BadHeader);
    assert_eq!(e.symbol.as_deref(), Some("ferrocx_device_adaptor_v1"));
    assert!(e.reason.contains("struct_size 1048576"), "{e}");
    assert!(e.reason.contains("is at most this build's"), "{e}");
}

#[test]
fn a_group_whose_size_is_not_whole_entries_is_dropped_with_the_rule() {
    let mut r = Registry::empty();
    let entry = r
        .add_plugin(&c_plugin("oddgroup"))
        .expect("the plugin loads");
    let device = entry.device.as_ref().expect("a device");
    assert!(device.flatmap.is_none(), "the broken group was kept");
    let note = entry
        .notes
        .iter()
        .find(|n| n.contains("ferrocx_device_flatmap_v1"))
        .unwrap_or_else(|| panic!("no note about the group: {:?}", entry.notes));
    assert!(note.contains("struct_size 36"), "{note}");
    assert!(note.contains("whole 8-byte entries"), "{note}");
}

// ---- 6. Config ----

fn load_error(path: &std::path::Path) -> String {
    match ferrocx::config::Config::load(path) {
        Ok(_) => panic!("{} loaded", path.display()),
        Err(e) => {
            assert_eq!(e.kind(), ferrocx::config::ConfigErrorKind::Io, "{e}");
            e.to_string()
        }
    }
}

#[test]
fn a_device_file_is_refused_without_reading_it() {
    // /dev/zero never ends: reading it ran until memory did.
    let e = load_error(std::path::Path::new("/dev/zero"));
    assert!(
        e.contains("it is a character device; a config is a regular file"),
        "{e}"
    );
    let dir = tempfile::tempdir().unwrap();
    let e = load_error(dir.path());
    assert!(e.contains("it is a directory"), "{e}");
}

#[test]
fn a_fifo_is_refused_without_blocking() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("config.toml");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a NUL-terminated path; mkfifo touches no memory of this process.
    assert_eq!(unsafe { libc_mkfifo(c.as_ptr(), 0o600) }, 0);
    // With no writer, opening it for reading would block forever.
    let e = load_error(&fifo);
    assert!(e.contains("it is a FIFO"), "{e}");
}

extern "C" {
    #[link_name = "mkfifo"]
    fn libc_mkfifo(path: *const std::ffi::c_char, mode: u32) -> i32;
}

#[test]
fn a_config_larger_than_the_limit_is_refused_before_reading() {
    let dir = tempfile::tempdir().unwrap();
    let big = dir.path().join("big.toml");
    // Sparse: no disk is used.
    let f = std::fs::File::create(&big).unwrap();
    f.set_len(ferrocx::config::MAX_CONFIG_BYTES + 1).unwrap();
    let e = load_error(&big);
    assert!(e.contains("over the limit of 16777216 bytes"), "{e}");
}

#[test]
fn a_plugin_dir_of_a_config_that_does_not_exist_is_not_rejected_but_an_explicit_one_is() {
    let text = "[runtime]\nplugin_dirs = [\"/nonexistent/ferrocx-build\"]\n\n[[cluster]]\nname = \"local\"\ndevice = \"host\"\nccl = \"host\"\n";
    let config =
        ferrocx::config::Config::parse(text, std::path::Path::new("shipped.toml")).unwrap();
    assert!(!config.runtime.plugin_dir_is_explicit(0));
    let r = Registry::discover(&config.runtime);
    assert!(r.rejected().is_empty(), "{:?}", r.rejected());

    let mut config = config;
    let lookup = |k: &str| (k == "FERROCX_PLUGIN_PATH").then(|| "/nonexistent/named".to_string());
    config.apply_env(lookup).unwrap();
    assert!(config.runtime.plugin_dir_is_explicit(0));
    assert!(!config.runtime.plugin_dir_is_explicit(1));
    let r = Registry::discover(&config.runtime);
    let rejected: Vec<String> = r.rejected().iter().map(|e| e.to_string()).collect();
    assert_eq!(rejected.len(), 1, "{rejected:?}");
    assert!(
        rejected[0].starts_with("/nonexistent/named: plugin directory cannot be read"),
        "{rejected:?}"
    );
}

#[test]
fn a_negative_device_count_is_an_error_and_a_huge_error_message_is_cut() {
    let mut r = Registry::empty();
    let entry = r.add_plugin(&c_plugin("negcount")).expect("loads");
    let dev = entry.device().expect("a device");
    let e = dev.device_count().unwrap_err();
    assert_eq!(e.status(), ferrocx::abi::Status::INTERNAL_ERROR);
    assert!(
        e.to_string()
            .contains("returned success with -5, a negative number"),
        "{e}"
    );
    // The plugin's get_last_error is 1 MiB long.
    let e = dev.set_device(7).unwrap_err().to_string();
    assert!(e.len() < 5000, "{} bytes", e.len());
    assert!(
        e.ends_with("[... cut at 4096 bytes]"),
        "{}",
        &e[e.len() - 40..]
    );
}

// ---- 3. Store ----

mod store {
    use std::io::{Read, Write};
    use std::net::{Ipv4Addr, SocketAddr, TcpStream};
    use std::time::{Duration, Instant};

    use ferrocx::bootstrap::{Store, StoreLimits, StoreServer};

    const TOKEN: &str = "hostile-token";

    fn server(limits: StoreLimits) -> StoreServer {
        StoreServer::bind_with(
            SocketAddr::from((Ipv4Addr::LOCALHOST, 0)),
            TOKEN.into(),
            limits,
        )
        .expect("bind the store")
    }

    /// Whether the server closed `c` (EOF, an error or a refusal frame) within `within`.
    fn closed_by_server(c: &mut TcpStream, within: Duration) -> bool {
        c.set_read_timeout(Some(within)).unwrap();
        let mut buf = [0u8; 256];
        loop {
            match c.read(&mut buf) {
                Ok(0) => return true,
                // The refusal frame, then the close.
                Ok(_) => continue,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return false,
                Err(e) if e.kind() == std::io::ErrorKind::TimedOut => return false,
                Err(_) => return true,
            }
        }
    }

    #[test]
    fn a_client_dripping_its_hello_is_dropped_at_the_handshakes_deadline() {
        let s = server(StoreLimits {
            hello_timeout: Duration::from_millis(800),
            ..StoreLimits::default()
        });
        let mut c = TcpStream::connect(s.local_addr()).unwrap();
        let start = Instant::now();
        // A hello that would be 64 bytes, one byte every 100 ms: each read is quick, the whole
        // never comes. Before, the timeout applied to each read and this stayed forever.
        c.write_all(&64u32.to_le_bytes()).unwrap();
        let mut dropped = false;
        while start.elapsed() < Duration::from_secs(20) {
            if c.write_all(&[1]).is_err() {
                dropped = true;
                break;
            }
            if closed_by_server(&mut c, Duration::from_millis(100)) {
                dropped = true;
                break;
            }
        }
        assert!(dropped, "still connected after {:?}", start.elapsed());
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "dropped only after {:?}",
            start.elapsed()
        );
    }

    #[test]
    fn connections_beyond_the_cap_are_closed_and_a_rank_still_gets_in() {
        let s = server(StoreLimits {
            hello_timeout: Duration::from_secs(60),
            max_unauthenticated: 4,
        });
        let mut idle: Vec<TcpStream> = (0..12)
            .map(|_| TcpStream::connect(s.local_addr()).unwrap())
            .collect();
        // A real rank connects after the flood and works.
        let store = Store::connect(s.local_addr(), TOKEN, Duration::from_secs(20))
            .expect("a rank gets in past idle connections");
        store.set("k", b"v").unwrap();
        assert_eq!(store.get("k").unwrap(), b"v");
        // The server holds at most 4 of the 12 idle ones: the others were closed.
        let closed = idle
            .iter_mut()
            .map(|c| closed_by_server(c, Duration::from_millis(300)))
            .filter(|&closed| closed)
            .count();
        assert!(
            closed >= 8,
            "only {closed} of 12 idle connections were closed"
        );
    }

    #[test]
    fn a_wrong_token_is_still_refused() {
        let s = server(StoreLimits::default());
        let e = Store::connect(s.local_addr(), "wrong", Duration::from_secs(5)).unwrap_err();
        assert!(e.to_string().contains("refused this job's token"), "{e}");
    }
}
