//! Bootstrap: rank detection from each launcher's variables (through a lookup closure, never the
//! process environment), and the TCP store between threads standing in for ranks.

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use ferrocx::bootstrap::{BootstrapError, JobInfo, RankInfo, RankSource, Store, StoreServer};

const TOKEN: &str = "s3cret-token";
const DEADLINE: Duration = Duration::from_secs(30);

fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + Copy + 'a {
    move |k: &str| {
        vars.iter()
            .find(|(name, _)| *name == k)
            .map(|(_, v)| (*v).to_owned())
    }
}

fn loopback() -> SocketAddr {
    SocketAddr::from((Ipv4Addr::LOCALHOST, 0))
}

fn server() -> StoreServer {
    StoreServer::bind(loopback(), TOKEN.to_owned()).expect("bind the store")
}

fn client(server: &StoreServer) -> Store {
    Store::connect(server.local_addr(), TOKEN, DEADLINE).expect("connect to the store")
}

fn info(
    rank: usize,
    world: usize,
    local_rank: usize,
    local_world: usize,
) -> (usize, usize, usize, usize) {
    (rank, world, local_rank, local_world)
}

fn fields(r: &RankInfo) -> (usize, usize, usize, usize) {
    (r.rank, r.world_size, r.local_rank, r.local_world_size)
}

#[test]
fn rank_from_torchrun_variables() {
    let r = RankInfo::from_env(env(&[
        ("RANK", "5"),
        ("WORLD_SIZE", "8"),
        ("LOCAL_RANK", "1"),
        ("LOCAL_WORLD_SIZE", "4"),
        // Lower-priority families are ignored when torchrun's are present.
        ("OMPI_COMM_WORLD_RANK", "0"),
        ("SLURM_PROCID", "0"),
    ]))
    .unwrap();
    assert_eq!(fields(&r), info(5, 8, 1, 4));
    assert_eq!(r.source(), RankSource::Torchrun);
}

#[test]
fn rank_from_open_mpi_variables() {
    let r = RankInfo::from_env(env(&[
        ("OMPI_COMM_WORLD_RANK", "3"),
        ("OMPI_COMM_WORLD_SIZE", "6"),
        ("OMPI_COMM_WORLD_LOCAL_RANK", "0"),
        ("OMPI_COMM_WORLD_LOCAL_SIZE", "3"),
        ("PMI_RANK", "1"),
        ("PMI_SIZE", "2"),
    ]))
    .unwrap();
    assert_eq!(fields(&r), info(3, 6, 0, 3));
    assert_eq!(r.source(), RankSource::OpenMpi);
}

#[test]
fn rank_from_pmi_variables_defaults_to_one_host() {
    let r = RankInfo::from_env(env(&[("PMI_RANK", "2"), ("PMI_SIZE", "4")])).unwrap();
    assert_eq!(fields(&r), info(2, 4, 2, 4));
    assert_eq!(r.source(), RankSource::Pmi);
}

#[test]
fn rank_from_slurm_variables() {
    let r = RankInfo::from_env(env(&[
        ("SLURM_PROCID", "7"),
        ("SLURM_NTASKS", "8"),
        ("SLURM_LOCALID", "3"),
        ("SLURM_NTASKS_PER_NODE", "4"),
    ]))
    .unwrap();
    assert_eq!(fields(&r), info(7, 8, 3, 4));
    assert_eq!(r.source(), RankSource::Slurm);

    // Without --ntasks-per-node, this node's count comes from SLURM_TASKS_PER_NODE.
    let r = RankInfo::from_env(env(&[
        ("SLURM_PROCID", "6"),
        ("SLURM_NTASKS", "7"),
        ("SLURM_LOCALID", "0"),
        ("SLURM_NODEID", "3"),
        ("SLURM_TASKS_PER_NODE", "2(x3),1"),
    ]))
    .unwrap();
    assert_eq!(fields(&r), info(6, 7, 0, 1));
}

#[test]
fn no_launcher_variables_is_rank_zero_of_one() {
    let r = RankInfo::from_env(env(&[("RANK", ""), ("PATH", "/bin")])).unwrap();
    assert_eq!(fields(&r), info(0, 1, 0, 1));
    assert_eq!(r.source(), RankSource::Default);
}

#[test]
fn bad_rank_variables_are_errors_naming_the_variable() {
    let cases: &[(&[(&str, &str)], &str)] = &[
        (
            &[("RANK", "one"), ("WORLD_SIZE", "2")],
            "RANK=\"one\": not a non-negative integer",
        ),
        (
            &[("RANK", "2"), ("WORLD_SIZE", "2")],
            "RANK=\"2\": not below WORLD_SIZE=2",
        ),
        (&[("RANK", "0"), ("WORLD_SIZE", "0")], "WORLD_SIZE=\"0\""),
        (&[("RANK", "0")], "WORLD_SIZE is not set"),
        (
            &[
                ("RANK", "0"),
                ("WORLD_SIZE", "4"),
                ("LOCAL_RANK", "2"),
                ("LOCAL_WORLD_SIZE", "2"),
            ],
            "LOCAL_RANK=\"2\"",
        ),
        (
            &[
                ("RANK", "0"),
                ("WORLD_SIZE", "4"),
                ("LOCAL_WORLD_SIZE", "5"),
            ],
            "LOCAL_WORLD_SIZE=\"5\"",
        ),
        (
            &[
                ("OMPI_COMM_WORLD_RANK", "-1"),
                ("OMPI_COMM_WORLD_SIZE", "2"),
            ],
            "OMPI_COMM_WORLD_RANK=\"-1\"",
        ),
        (
            &[("SLURM_PROCID", "0"), ("SLURM_NTASKS", "x")],
            "SLURM_NTASKS=\"x\"",
        ),
    ];
    for (vars, want) in cases {
        let e = RankInfo::from_env(env(vars)).unwrap_err().to_string();
        assert!(e.contains(want), "{vars:?}: got \"{e}\", want \"{want}\"");
    }
}

#[test]
fn job_info_from_variables() {
    let single = RankInfo::single();
    let j = JobInfo::from_env(
        env(&[
            ("FERROCX_JOB_ID", "my job/../x"),
            ("FERROCX_JOB_TOKEN", "t"),
        ]),
        &single,
    );
    assert_eq!(j.id, "my_job____x");
    assert_eq!(j.token, "t");

    let two = RankInfo::new(1, 2, 1, 2).unwrap();
    let j = JobInfo::from_env(
        env(&[("MASTER_ADDR", "node-1.example"), ("MASTER_PORT", "29500")]),
        &two,
    );
    assert_eq!(j.id, "node-1_example_29500");
    assert_eq!(j.token, "");
}

#[test]
fn set_get_add_delete_from_several_threads_sharing_one_store() {
    let server = server();
    let store = Arc::new(client(&server));
    let threads = 4;
    let per_thread = 50;
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let store = Arc::clone(&store);
            thread::spawn(move || {
                for i in 0..per_thread {
                    store
                        .set(&format!("t{t}/k{i}"), format!("v{t}.{i}").as_bytes())
                        .unwrap();
                    store.add("counter", i64::from(i + 1)).unwrap();
                }
                // Waits for a key another thread sets.
                let next = (t + 1) % threads;
                store.get(&format!("t{next}/k{}", per_thread - 1)).unwrap()
            })
        })
        .collect();
    for (t, h) in handles.into_iter().enumerate() {
        let got = h.join().unwrap();
        assert_eq!(
            got,
            format!("v{}.{}", (t + 1) % threads, per_thread - 1).into_bytes()
        );
    }
    let per_thread_sum: i64 = (1..=i64::from(per_thread)).sum();
    assert_eq!(
        store.add("counter", 0).unwrap(),
        per_thread_sum * threads as i64
    );
    // Counters read back as decimal text.
    assert_eq!(
        store.get("counter").unwrap(),
        (per_thread_sum * threads as i64).to_string().into_bytes()
    );
    assert_eq!(store.get("t2/k7").unwrap(), b"v2.7");

    assert!(store.check(&["t0/k0", "t3/k49"]).unwrap());
    assert!(!store.check(&["t0/k0", "nope"]).unwrap());
    assert!(store.delete("t0/k0").unwrap());
    assert!(!store.delete("t0/k0").unwrap());
    assert!(!store.check(&["t0/k0"]).unwrap());

    store.set("text", b"abc").unwrap();
    let e = store.add("text", 1).unwrap_err().to_string();
    assert!(e.contains("not a counter"), "{e}");

    // A second client sees the same data.
    let other = client(&server);
    assert_eq!(other.get("t1/k0").unwrap(), b"v1.0");
}

#[test]
fn get_of_a_missing_key_fails_after_the_deadline_naming_the_key() {
    let server = server();
    let store = Store::connect(server.local_addr(), TOKEN, Duration::from_millis(300)).unwrap();
    let start = Instant::now();
    let e = store.get("never/set").unwrap_err();
    assert!(
        start.elapsed() >= Duration::from_millis(300),
        "returned before the deadline"
    );
    assert!(matches!(e, BootstrapError::Timeout { .. }), "{e:?}");
    let msg = e.to_string();
    assert!(msg.contains("\"never/set\""), "{msg}");
    assert!(msg.contains("300ms"), "{msg}");
}

#[test]
fn get_waits_for_a_key_set_later() {
    let server = server();
    let store = Arc::new(client(&server));
    let s = Arc::clone(&store);
    let waiter = thread::spawn(move || s.get("late"));
    thread::sleep(Duration::from_millis(100));
    store.set("late", b"here").unwrap();
    assert_eq!(waiter.join().unwrap().unwrap(), b"here");
}

#[test]
fn a_wrong_token_is_refused() {
    let server = server();
    let addr = server.local_addr();
    let e = Store::connect(addr, "not-the-token", DEADLINE).unwrap_err();
    assert!(matches!(e, BootstrapError::TokenRefused { .. }), "{e:?}");
    assert_eq!(
        e.to_string(),
        format!("the store at {addr} refused this job's token")
    );
    // The server still serves the right token afterwards.
    client(&server).set("k", b"v").unwrap();
}

#[test]
fn connect_retries_until_the_server_is_up() {
    // Find a free port, release it, and start the server there a little later.
    let addr = StoreServer::bind(loopback(), String::new())
        .unwrap()
        .local_addr();
    let starter = thread::spawn(move || {
        thread::sleep(Duration::from_millis(300));
        StoreServer::bind(addr, TOKEN.to_owned())
    });
    let store = Store::connect(addr, TOKEN, DEADLINE).unwrap();
    let _server = starter.join().unwrap().unwrap();
    store.set("k", b"v").unwrap();
    assert_eq!(store.get("k").unwrap(), b"v");
}

#[test]
fn connect_to_nothing_fails_naming_the_address() {
    let addr = StoreServer::bind(loopback(), String::new())
        .unwrap()
        .local_addr();
    let e = Store::connect(addr, TOKEN, Duration::from_millis(200)).unwrap_err();
    assert!(matches!(e, BootstrapError::Connect { .. }), "{e:?}");
    assert!(e.to_string().contains(&addr.to_string()), "{e}");
}

/// Runs `f(rank, store)` on `world` threads, each with its own connection (a rank each).
fn on_ranks<T: Send + 'static>(
    server: &StoreServer,
    world: usize,
    f: impl Fn(usize, &Store) -> T + Send + Sync + 'static,
) -> Vec<T> {
    let f = Arc::new(f);
    let handles: Vec<_> = (0..world)
        .map(|rank| {
            let f = Arc::clone(&f);
            let store = client(server);
            thread::spawn(move || f(rank, &store))
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

#[test]
fn all_gather_repeated_with_one_prefix_gives_each_round_its_own_values() {
    let server = server();
    let world = 4;
    let results = on_ranks(&server, world, move |rank, store| {
        (0..100u32)
            .map(|round| {
                let mine = format!("r{rank}:{round}");
                store
                    .all_gather("ag", rank, world, mine.as_bytes())
                    .unwrap()
            })
            .collect::<Vec<_>>()
    });
    for (rank, rounds) in results.iter().enumerate() {
        for (round, got) in rounds.iter().enumerate() {
            let want: Vec<Vec<u8>> = (0..world)
                .map(|r| format!("r{r}:{round}").into_bytes())
                .collect();
            assert_eq!(got, &want, "rank {rank}, round {round}");
        }
    }
    // Earlier rounds are cleaned up: at most the last two rounds' slots remain.
    let store = client(&server);
    assert!(!store.check(&["ferrocx/ag/ag/0/0"]).unwrap());
    assert!(store.check(&["ferrocx/ag/ag/99/3"]).unwrap());
}

#[test]
fn broadcast_repeated_with_one_key_gives_each_round_the_roots_value() {
    let server = server();
    let world = 4;
    let root = 2;
    let results = on_ranks(&server, world, move |rank, store| {
        (0..100u32)
            .map(|round| {
                let data = format!("from root, round {round}");
                let mine = (rank == root).then_some(data.as_bytes());
                store.broadcast("bc", rank == root, mine).unwrap()
            })
            .collect::<Vec<_>>()
    });
    for (rank, rounds) in results.iter().enumerate() {
        for (round, got) in rounds.iter().enumerate() {
            assert_eq!(
                got,
                format!("from root, round {round}").as_bytes(),
                "rank {rank}"
            );
        }
    }
}

#[test]
fn barrier_repeated_with_one_name_holds_every_rank_each_round() {
    let server = server();
    let world = 4;
    let shared = Arc::new(client(&server));
    let counter = Arc::clone(&shared);
    // Before barrier `round`, each rank adds 1 to `before/round`; after it, every rank must see
    // all `world` increments: no rank got through early.
    let seen = on_ranks(&server, world, move |_, store| {
        (0..100)
            .map(|round| {
                let key = format!("before/{round}");
                counter.add(&key, 1).unwrap();
                store.barrier("b", world).unwrap();
                counter.add(&key, 0).unwrap()
            })
            .collect::<Vec<_>>()
    });
    for (rank, rounds) in seen.iter().enumerate() {
        for (round, n) in rounds.iter().enumerate() {
            assert_eq!(
                *n, world as i64,
                "rank {rank} left barrier round {round} early"
            );
        }
    }
    // Old rounds' keys are gone.
    assert!(!shared.check(&["ferrocx/barrier/b/0/done"]).unwrap());
}

/// Ranks 0 and 2 of 4 gather while 1 and 3 never come: both name the two missing ranks within
/// the timeout. A barrier that only 2 of 3 reach says so.
#[test]
fn helpers_that_time_out_name_the_ranks_that_never_came() {
    let server = server();
    let addr = server.local_addr();
    let wait = Duration::from_millis(400);
    let errors: Vec<_> = [0usize, 2]
        .into_iter()
        .map(|rank| {
            thread::spawn(move || {
                let store = Store::connect(addr, TOKEN, wait).unwrap();
                let start = Instant::now();
                let e = store.all_gather("ag", rank, 4, b"x").unwrap_err();
                (start.elapsed(), e)
            })
        })
        .collect::<Vec<_>>()
        .into_iter()
        .map(|h| h.join().unwrap())
        .collect();
    for (took, e) in errors {
        assert!(
            took >= wait * 9 / 10 && took < wait * 5,
            "failed after {took:?}"
        );
        match &e {
            BootstrapError::Absent {
                op: "all_gather",
                missing,
                arrived: 2,
                world: 4,
                round: 0,
                ..
            } => assert_eq!(missing, &[1, 3]),
            other => panic!("{other:?}"),
        }
        let msg = e.to_string();
        assert_eq!(
            msg,
            format!("all_gather \"ag\" (round 0): ranks 1, 3 of 4 did not arrive within {wait:?}")
        );
    }
    let errors: Vec<_> = (0..2)
        .map(|_| {
            thread::spawn(move || {
                let store = Store::connect(addr, TOKEN, wait).unwrap();
                store.barrier("b", 3).unwrap_err().to_string()
            })
        })
        .collect::<Vec<_>>()
        .into_iter()
        .map(|h| h.join().unwrap())
        .collect();
    for msg in errors {
        assert_eq!(
            msg,
            format!("barrier \"b\" (round 0): 2 of 3 ranks arrived within {wait:?}")
        );
    }
}

#[test]
fn helpers_report_bad_arguments() {
    let server = server();
    let store = client(&server);
    let e = store.all_gather("p", 4, 4, b"x").unwrap_err().to_string();
    assert!(e.contains("rank 4 is not below the world size 4"), "{e}");
    let e = store.broadcast("k", true, None).unwrap_err().to_string();
    assert!(e.contains("the root must give the data"), "{e}");
}

#[test]
fn from_env_for_a_lone_process_hosts_a_private_store() {
    let rank = RankInfo::from_env(env(&[])).unwrap();
    let job = JobInfo::from_env(env(&[]), &rank);
    assert!(job.id.starts_with("single-"), "{}", job.id);
    let (store, server) = Store::from_env_with(&rank, &job, DEADLINE, env(&[])).unwrap();
    let server = server.expect("a lone rank hosts its own store");
    assert!(server.local_addr().ip().is_loopback());
    assert_eq!(store.addr(), server.local_addr());
    assert_eq!(
        store.all_gather("x", 0, 1, b"me").unwrap(),
        vec![b"me".to_vec()]
    );
    assert_eq!(store.broadcast("y", true, Some(b"b")).unwrap(), b"b");
    store.barrier("z", 1).unwrap();
}

/// A TCP port of the loopback that was free a moment ago (bound, then released).
fn free_port() -> String {
    StoreServer::bind(loopback(), String::new())
        .unwrap()
        .local_addr()
        .port()
        .to_string()
}

/// The variables torchrun gives rank `rank` of `world`, with the store at `port`.
fn torchrun_env(rank: usize, world: usize, port: &str) -> HashMap<&'static str, String> {
    [
        ("RANK", rank.to_string()),
        ("WORLD_SIZE", world.to_string()),
        ("MASTER_ADDR", "127.0.0.1".to_owned()),
        ("MASTER_PORT", port.to_owned()),
        ("FERROCX_JOB_TOKEN", TOKEN.to_owned()),
    ]
    .into_iter()
    .collect()
}

#[test]
fn a_second_store_of_rank_zero_shares_the_server_it_already_hosts() {
    // As torchrun runs a job that makes two communicators: rank 0 sets up the store at
    // MASTER_PORT twice. The second shares the live server instead of failing to bind.
    let vars = torchrun_env(0, 2, &free_port());
    let lookup = |k: &str| vars.get(k).cloned();
    let rank = RankInfo::from_env(lookup).unwrap();
    let job = JobInfo::from_env(lookup, &rank);
    let (first, s1) = Store::from_env_with(&rank, &job, DEADLINE, lookup).unwrap();
    let (second, s2) = Store::from_env_with(&rank, &job, DEADLINE, lookup)
        .expect("the second store of rank 0 reuses the port's server");
    let (s1, s2) = (s1.expect("rank 0 hosts"), s2.expect("rank 0 hosts"));
    assert!(std::sync::Arc::ptr_eq(&s1, &s2), "one server per address");
    first.set("k", b"v").unwrap();
    assert_eq!(
        second.get("k").unwrap(),
        b"v",
        "both clients reach the same data"
    );
    // Once every holder dropped it, the port is free and a new setup binds afresh.
    drop((first, second, s1, s2));
    let (third, s3) = Store::from_env_with(&rank, &job, DEADLINE, lookup).unwrap();
    assert!(s3.is_some());
    assert!(!third.check(&["k"]).unwrap(), "a fresh server");
}

#[test]
fn from_env_with_master_port_hosts_on_rank_zero_and_connects_the_others() {
    // A free port, released again for rank 0 to bind.
    let port = free_port();
    let world = 3;
    let handles: Vec<_> = (0..world)
        .map(|r| {
            let port = port.clone();
            thread::spawn(move || {
                let vars = torchrun_env(r, world, &port);
                let lookup = |k: &str| vars.get(k).cloned();
                let rank = RankInfo::from_env(lookup).unwrap();
                let job = JobInfo::from_env(lookup, &rank);
                let (store, server) = Store::from_env_with(&rank, &job, DEADLINE, lookup).unwrap();
                assert_eq!(server.is_some(), r == 0);
                let all = store
                    .all_gather("ids", rank.rank, rank.world_size, job.id.as_bytes())
                    .unwrap();
                // The server must outlive every rank's use of it.
                store.barrier("end", rank.world_size).unwrap();
                drop(server);
                all
            })
        })
        .collect();
    for h in handles {
        let all = h.join().unwrap();
        assert_eq!(
            all,
            vec![
                b"127_0_0_1_"
                    .iter()
                    .chain(port.as_bytes())
                    .copied()
                    .collect::<Vec<u8>>();
                world
            ]
        );
    }
}

#[test]
fn from_env_errors_name_the_variable() {
    let rank = RankInfo::new(1, 2, 1, 2).unwrap();
    let job = JobInfo::new("j", TOKEN);
    let e = Store::from_env_with(&rank, &job, DEADLINE, env(&[]))
        .unwrap_err()
        .to_string();
    assert!(e.contains("MASTER_PORT is not set"), "{e}");
    let e = Store::from_env_with(&rank, &job, DEADLINE, env(&[("MASTER_PORT", "http")]))
        .unwrap_err()
        .to_string();
    assert!(e.contains("MASTER_PORT=\"http\""), "{e}");
}

#[test]
fn a_dropped_server_ends_blocked_gets() {
    let server = server();
    let store = client(&server);
    let waiter = thread::spawn(move || store.get("never"));
    thread::sleep(Duration::from_millis(100));
    let start = Instant::now();
    drop(server);
    let r = waiter.join().unwrap();
    assert!(r.is_err());
    assert!(start.elapsed() < Duration::from_secs(20), "shutdown hung");
}

#[test]
fn stores_and_servers_can_move_between_threads() {
    fn shareable<T: Send + Sync>() {}
    shareable::<Store>();
    shareable::<StoreServer>();
}

#[test]
fn a_timeout_too_long_to_represent_does_not_panic() {
    let server = server();
    let store = Store::connect(server.local_addr(), TOKEN, Duration::MAX).unwrap();
    store.set("k", b"v").unwrap();
    assert_eq!(store.get("k").unwrap(), b"v");
    assert_eq!(
        store.all_gather("p", 0, 1, b"x").unwrap(),
        vec![b"x".to_vec()]
    );
}
