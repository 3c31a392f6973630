//! Collective agreements through the job's store: every rank's record of a step, and whether
//! every rank succeeded at it. Each wait has the store's deadline (the communicator's timeout)
//! and a rank that does not arrive is named.

use crate::bootstrap::{BootstrapError, Store};

use super::WindowError;

/// A rank's refusal at a step: its rank and its reason.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Refusal {
    /// The first rank (lowest) that failed.
    pub rank: usize,
    /// Its reason.
    pub reason: String,
    /// Every rank that failed.
    pub ranks: Vec<usize>,
}

/// The agreements of one communicator.
pub(crate) struct Agreement<'a> {
    pub(crate) store: &'a Store,
    pub(crate) rank: usize,
    pub(crate) world: usize,
    /// Keeps this communicator's keys apart from other communicators' of the job.
    pub(crate) tag: u64,
}

impl Agreement<'_> {
    /// Every rank's `data` for `step`, in rank order. Each name is one store round per call,
    /// so the store's keys do not grow with the number of windows.
    pub(crate) fn gather(
        &self,
        step: &'static str,
        data: &[u8],
    ) -> Result<Vec<Vec<u8>>, WindowError> {
        let prefix = format!("window/{:016x}/{step}", self.tag);
        self.store
            .all_gather(&prefix, self.rank, self.world, data)
            .map_err(|e| waited_for(step, e))
    }

    /// Whether every rank succeeded at `step`: `Ok(Ok(()))`, or `Ok(Err(refusal))` naming the
    /// failed ranks, the same on every rank.
    pub(crate) fn outcome(
        &self,
        step: &'static str,
        mine: &Result<(), String>,
    ) -> Result<Result<(), Refusal>, WindowError> {
        let record = match mine {
            Ok(()) => vec![1u8],
            Err(reason) => [&[0u8][..], reason.as_bytes()].concat(),
        };
        let all = self.gather(step, &record)?;
        let failed: Vec<(usize, String)> = all
            .iter()
            .enumerate()
            .filter(|(_, r)| r.first() != Some(&1))
            .map(|(rank, r)| {
                (
                    rank,
                    String::from_utf8_lossy(r.get(1..).unwrap_or(&[])).into_owned(),
                )
            })
            .collect();
        Ok(match failed.first() {
            None => Ok(()),
            Some((rank, reason)) => Err(Refusal {
                rank: *rank,
                reason: reason.clone(),
                ranks: failed.iter().map(|(r, _)| *r).collect(),
            }),
        })
    }
}

/// A store error of `step`; a timeout names the first rank that did not arrive.
fn waited_for(step: &'static str, e: BootstrapError) -> WindowError {
    match e {
        BootstrapError::Absent {
            ref missing,
            waited,
            ..
        } if !missing.is_empty() => WindowError::PeerTimeout {
            step,
            rank: missing[0],
            waited,
        },
        e => WindowError::Bootstrap(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bootstrap::StoreServer;
    use std::net::{Ipv4Addr, SocketAddr};
    use std::time::Duration;

    #[test]
    fn outcomes_name_the_failed_ranks_and_timeouts_the_missing_one() {
        let server = StoreServer::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)), "t".into())
            .expect("bind");
        let addr = server.local_addr();
        let results: Vec<_> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..3)
                .map(|rank| {
                    s.spawn(move || {
                        let store = Store::connect(addr, "t", Duration::from_secs(20)).unwrap();
                        let a = Agreement {
                            store: &store,
                            rank,
                            world: 3,
                            tag: 9,
                        };
                        let mine = match rank {
                            0 => Ok(()),
                            r => Err(format!("broke {r}")),
                        };
                        let first = a.outcome("step", &mine).unwrap();
                        let second = a.outcome("step", &Ok(())).unwrap();
                        (first, second)
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for (first, second) in results {
            assert_eq!(
                first,
                Err(Refusal {
                    rank: 1,
                    reason: "broke 1".into(),
                    ranks: vec![1, 2]
                })
            );
            assert_eq!(second, Ok(()));
        }

        // Rank 1 never comes: rank 0 and 2 name it.
        let mut store = Store::connect(addr, "t", Duration::from_secs(20)).unwrap();
        store.set_timeout(Duration::from_millis(300));
        let a = Agreement {
            store: &store,
            rank: 0,
            world: 3,
            tag: 10,
        };
        match a.gather("lonely", b"x") {
            Err(WindowError::PeerTimeout { step, rank, .. }) => {
                assert_eq!((step, rank), ("lonely", 1));
            }
            other => panic!("expected a timeout naming rank 1, got {other:?}"),
        }
    }
}
