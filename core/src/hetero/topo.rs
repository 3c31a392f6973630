//! Who is where: the clusters of a job, each with its global ranks in order, and every global
//! rank's cluster and cluster-local rank (its position in its cluster's rank list, which need
//! not be contiguous: cluster `a = "0,2"` has local ranks 0 and 1 for global ranks 0 and 2).

use crate::config::Config;

/// One cluster of the job: its name and its global ranks, ascending.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterRanks {
    /// The cluster's name in the config.
    pub name: String,
    /// Its global ranks below the world size, ascending; local rank i is `ranks[i]`.
    pub ranks: Vec<usize>,
    /// `true` when reducing inside the cluster first gains nothing over the bridge: one rank,
    /// or the host device (whose CCL moves the same host memory the bridge does).
    pub flat: bool,
    /// `true` when the cluster is on the host device (its buffers are host memory that
    /// another rank of the host can map).
    pub host: bool,
}

/// The clusters of a job and this rank's place in them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Topology {
    /// The clusters that have ranks in this job, in config order.
    pub clusters: Vec<ClusterRanks>,
    /// Per global rank: (cluster index, local rank).
    pub place: Vec<(usize, usize)>,
    /// This rank.
    pub me: usize,
}

impl Topology {
    /// The topology of a `world`-rank job under `config`, seen from rank `me`; an error names
    /// a rank that no cluster has.
    pub fn new(config: &Config, world: usize, me: usize) -> Result<Topology, String> {
        let mut clusters = Vec::new();
        let mut place = vec![(usize::MAX, 0); world];
        for c in &config.clusters {
            let ranks: Vec<usize> = (0..world).filter(|&r| c.ranks.contains(r)).collect();
            if ranks.is_empty() {
                continue;
            }
            for (local, &r) in ranks.iter().enumerate() {
                place[r] = (clusters.len(), local);
            }
            clusters.push(ClusterRanks {
                name: c.name.clone(),
                flat: ranks.len() == 1 || c.device == "host",
                host: c.device == "host",
                ranks,
            });
        }
        if let Some(r) = place.iter().position(|p| p.0 == usize::MAX) {
            return Err(format!(
                "rank {r} of this {world}-rank job is in no cluster of {}",
                config.origin
            ));
        }
        Ok(Topology {
            clusters,
            place,
            me,
        })
    }

    /// Ranks of the job.
    pub fn world(&self) -> usize {
        self.place.len()
    }

    /// This rank's cluster index.
    pub fn my_cluster(&self) -> usize {
        self.place[self.me].0
    }

    /// This rank's cluster-local rank.
    pub fn my_local(&self) -> usize {
        self.place[self.me].1
    }

    /// The global rank of local rank `local` of cluster `c`.
    pub fn global(&self, c: usize, local: usize) -> usize {
        self.clusters[c].ranks[local]
    }

    /// The name of rank r's cluster.
    pub fn cluster_name_of(&self, r: usize) -> &str {
        self.place
            .get(r)
            .map_or("?", |p| self.clusters[p.0].name.as_str())
    }

    /// `rank 3 (cluster "cpu")`.
    pub fn who(&self, r: usize) -> String {
        format!("rank {r} (cluster {:?})", self.cluster_name_of(r))
    }

    /// Ranks per cluster, in cluster order.
    pub fn sizes(&self) -> Vec<usize> {
        self.clusters.iter().map(|c| c.ranks.len()).collect()
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    #[test]
    fn local_ranks_follow_the_rank_lists() {
        let text = "[[cluster]]\nname = \"a\"\nranks = \"0,2\"\ndevice = \"host\"\nccl = \"host\"\n\
                    [[cluster]]\nname = \"b\"\nranks = \"1,3-9\"\ndevice = \"host\"\nccl = \"host\"\n";
        let config = Config::parse(text, Path::new("t.toml")).expect("config");
        let t = Topology::new(&config, 5, 3).expect("topology");
        assert_eq!(t.sizes(), vec![2, 3]);
        assert_eq!(t.place, vec![(0, 0), (1, 0), (0, 1), (1, 1), (1, 2)]);
        assert_eq!((t.my_cluster(), t.my_local()), (1, 1));
        assert_eq!(t.global(1, 2), 4);
        assert_eq!(t.who(2), "rank 2 (cluster \"a\")");
        let e = Topology::new(&config, 11, 0).expect_err("rank 10 has no cluster");
        assert!(e.contains("rank 10"), "{e}");
    }
}
