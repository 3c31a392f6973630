//! The all-reduce plan: how a message is cut into chunks, each chunk into the shares of each
//! cluster's ranks, and the shares into pieces that have one owner per cluster.
//!
//! A chunk of `E` elements is split inside cluster `c` (of `P` ranks) into `P` shares of
//! `q = E / P` elements; the last rank's share also takes the `E - q·P` elements left over
//! (the tail). Shares of clusters of different sizes do not line up, so each rank cuts its
//! share at the union of every cluster's share boundaries: each resulting piece lies inside
//! exactly one share of every cluster, so it has one owner per cluster, and the owners of a
//! piece reduce it together over the bridge (each reads the others' copy and reduces them in
//! cluster order, so every owner gets the same bits). Example, `E = 12`, clusters of 2 and 3:
//!
//! ```text
//! cluster a (2 ranks)  |      a0: 0..6       |      a1: 6..12      |
//! cluster b (3 ranks)  |   b0: 0..4   |   b1: 4..8   |   b2: 8..12  |
//! pieces               | 0..4         | 4..6 | 6..8  | 8..12        |
//! owners               | a0,b0        | a0,b1| a1,b1 | a1,b2        |
//! ```
//!
//! `E` is the same in every cluster: `chunk_elems · min(P)` (a share of the smallest cluster
//! fills one staging slot), rounded down to a multiple of the clusters' sizes' least common
//! multiple when that is smaller, so that only the message's last chunk has tails.

/// One piece of this rank's share: elements `start..start + len` of the chunk, and its owner
/// in every cluster (in cluster order, this rank included) with the piece's offset in that
/// owner's share.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Piece {
    /// First element, from the chunk's start.
    pub start: usize,
    /// Elements.
    pub len: usize,
    /// Per cluster: (global rank of the owner, the piece's element offset in its share).
    pub owners: Vec<(usize, usize)>,
}

/// What one chunk size means for this rank.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Shape {
    /// Elements of the chunk.
    pub elems: usize,
    /// This cluster's block (the reduce-scatter's count).
    pub q: usize,
    /// This cluster's tail (`elems - q · P`), owned by its last rank.
    pub tail: usize,
    /// This rank's share: elements `share.0..share.1` of the chunk.
    pub share: (usize, usize),
    /// The pieces of the share.
    pub pieces: Vec<Piece>,
    /// Ranks of other clusters that read this rank's staging slot in this chunk.
    pub readers: u64,
    /// Those ranks (each is sent one "done" per chunk).
    pub read_from: Vec<usize>,
}

/// The plan of an all-reduce of `count` elements for one rank.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AllReducePlan {
    /// Elements of every chunk but the last.
    pub chunk: usize,
    /// Chunks.
    pub chunks: usize,
    /// The shape of the full chunks (`None` when the message is one partial chunk).
    pub full: Option<Shape>,
    /// The shape of the last chunk when it is shorter.
    pub last: Option<Shape>,
}

impl AllReducePlan {
    /// The shape of chunk `k` and its first element.
    pub fn chunk(&self, k: usize) -> (usize, &Shape) {
        let shape = match (&self.last, k + 1 == self.chunks) {
            (Some(last), true) => last,
            _ => self.full.as_ref().expect("a plan with full chunks"),
        };
        (k * self.chunk, shape)
    }
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// Elements per chunk for clusters of `sizes` and `slot_elems` elements per staging slot.
pub fn chunk_elems(sizes: &[usize], slot_elems: usize) -> usize {
    let min = sizes.iter().copied().min().unwrap_or(1).max(1);
    let mut lcm: usize = 1;
    for &s in sizes {
        lcm = (lcm / gcd(lcm, s.max(1))).saturating_mul(s.max(1));
    }
    let e = slot_elems.max(1).saturating_mul(min);
    if e >= lcm {
        e - e % lcm
    } else {
        e
    }
}

/// Share bounds of local rank `i` of a `p`-rank cluster in a chunk of `e` elements.
pub fn share_of(e: usize, p: usize, i: usize) -> (usize, usize) {
    let q = e / p;
    let end = if i + 1 == p { e } else { (i + 1) * q };
    (i * q, end)
}

/// The local rank of a `p`-rank cluster whose share holds element `a` of an `e`-element chunk.
pub fn owner_of(e: usize, p: usize, a: usize) -> usize {
    match a.checked_div(e / p) {
        None => p - 1,
        Some(i) => i.min(p - 1),
    }
}

/// The shape of an `e`-element chunk for local rank `me_local` of cluster `me_cluster`;
/// `global(c, i)` is the global rank of local rank i of cluster c.
pub fn shape(
    e: usize,
    sizes: &[usize],
    me_cluster: usize,
    me_local: usize,
    global: &dyn Fn(usize, usize) -> usize,
) -> Shape {
    let p = sizes[me_cluster];
    let q = e / p;
    let share = share_of(e, p, me_local);
    let mut bounds: Vec<usize> = vec![share.0, share.1];
    for &pc in sizes {
        let qc = e / pc;
        for i in 1..pc {
            let b = i * qc;
            if b > share.0 && b < share.1 {
                bounds.push(b);
            }
        }
    }
    bounds.sort_unstable();
    bounds.dedup();
    let mut pieces = Vec::new();
    let mut read_from: Vec<usize> = Vec::new();
    for w in bounds.windows(2) {
        let (a, b) = (w[0], w[1]);
        if a == b {
            continue;
        }
        let owners: Vec<(usize, usize)> = sizes
            .iter()
            .enumerate()
            .map(|(c, &pc)| {
                let local = owner_of(e, pc, a);
                let start = share_of(e, pc, local).0;
                (global(c, local), a - start)
            })
            .collect();
        for (c, &(r, _)) in owners.iter().enumerate() {
            if c != me_cluster && !read_from.contains(&r) {
                read_from.push(r);
            }
        }
        pieces.push(Piece {
            start: a,
            len: b - a,
            owners,
        });
    }
    Shape {
        elems: e,
        q,
        tail: e - q * p,
        share,
        pieces,
        readers: read_from.len() as u64,
        read_from,
    }
}

/// The all-reduce plan of `count` elements (see the module docs).
pub fn all_reduce(
    count: usize,
    slot_elems: usize,
    sizes: &[usize],
    me_cluster: usize,
    me_local: usize,
    global: &dyn Fn(usize, usize) -> usize,
) -> AllReducePlan {
    let chunk = chunk_elems(sizes, slot_elems);
    let chunks = count.div_ceil(chunk).max(1);
    let rest = count - (chunks - 1) * chunk;
    let mk = |e| shape(e, sizes, me_cluster, me_local, global);
    let (full, last) = if chunks == 1 {
        (None, Some(mk(rest)))
    } else if rest == chunk {
        (Some(mk(chunk)), None)
    } else {
        (Some(mk(chunk)), Some(mk(rest)))
    };
    AllReducePlan {
        chunk,
        chunks,
        full,
        last,
    }
}

/// The plan of a `world`-rank job under `config`, as text (`ferrocx config check --world N`):
/// each cluster and its ranks, the bridge, and how an all-reduce's chunk of f32 is cut into
/// shares and pieces, rank by rank (`None` for a job of one cluster).
pub fn describe(config: &crate::config::Config, world: usize) -> Result<Option<String>, String> {
    use std::fmt::Write;
    let mut out = String::new();
    let t0 = super::topo::Topology::new(config, world, 0)?;
    if t0.clusters.len() < 2 {
        return Ok(None);
    }
    let b = &config.bridge;
    for c in &t0.clusters {
        let _ = writeln!(out, "cluster {}: ranks {:?}", c.name, c.ranks);
    }
    if b.ccl == crate::config::BridgeCcl::Mpi {
        let _ = writeln!(
            out,
            "bridge: MPI (ccl mpi): one communicator of the mpi CCL over all {} ranks; every \
             collective across clusters is one MPI collective of the whole job, on the caller's \
             stream (send/recv between clusters on the bridge's send and receive streams)",
            t0.world()
        );
        return Ok(Some(out));
    }
    let _ = writeln!(
        out,
        "bridge: ccl {}, chunk_bytes {}, depth {}",
        format!("{:?}", b.ccl).to_lowercase(),
        b.chunk_bytes,
        b.depth
    );
    if b.ccl == crate::config::BridgeCcl::Auto {
        let _ = writeln!(
            out,
            "bridge: shared memory when every rank is on one host (decided at communicator \
             creation from every rank's host identity), else MPI as with ccl mpi; the plan \
             below is the shared-memory one"
        );
    }
    let _ = writeln!(
        out,
        "all_reduce up to 64 KiB per rank: one step over the bridge (every rank publishes its \
         input and reduces every rank's)"
    );
    if t0.clusters.iter().all(|c| c.flat) {
        let w = t0.world();
        let e = (b.chunk_bytes as usize / 4).max(1);
        let _ = writeln!(
            out,
            "all_reduce of f32 past that: the flat plan (every cluster of several ranks is on \
             the host device): chunks of {e} elements ({} bytes); per chunk each rank reduces \
             its share from every rank's slot, then copies the others' shares",
            e * 4
        );
        for r in 0..w {
            let (lo, hi) = share_of(e, w, r);
            let _ = writeln!(
                out,
                "  rank {r} ({}): share {lo}..{hi} of each chunk",
                t0.cluster_name_of(r)
            );
        }
        return Ok(Some(out));
    }
    let sizes = t0.sizes();
    let slot_elems = b.chunk_bytes as usize / 4;
    let e = chunk_elems(&sizes, slot_elems.max(1));
    let _ = writeln!(
        out,
        "all_reduce of f32 past that: chunks of {e} elements ({} bytes), {} in flight; per chunk: \
         reduce-scatter in each cluster, each rank reduces its share over the bridge with its \
         owners in the other clusters, all-gather in each cluster",
        e * 4,
        b.depth
    );
    for r in 0..world {
        let t = super::topo::Topology::new(config, world, r)?;
        let s = shape(e, &sizes, t.my_cluster(), t.my_local(), &|c, i| {
            t.global(c, i)
        });
        let pieces: Vec<String> = s
            .pieces
            .iter()
            .map(|p| {
                let owners: Vec<String> = p.owners.iter().map(|o| o.0.to_string()).collect();
                format!(
                    "{}..{} with [{}]",
                    p.start,
                    p.start + p.len,
                    owners.join(",")
                )
            })
            .collect();
        let _ = writeln!(
            out,
            "  rank {r} ({}): share {}..{}: {}",
            t.cluster_name_of(r),
            s.share.0,
            s.share.1,
            pieces.join("; ")
        );
    }
    Ok(Some(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Global ranks numbered cluster after cluster.
    fn globals(sizes: &[usize]) -> impl Fn(usize, usize) -> usize + '_ {
        move |c, i| sizes[..c].iter().sum::<usize>() + i
    }

    #[test]
    fn every_element_has_one_owner_per_cluster_and_reads_are_symmetric() {
        for sizes in [
            vec![2, 3],
            vec![1, 1, 2],
            vec![4, 1],
            vec![3, 3],
            vec![5, 2, 3],
        ] {
            let world: usize = sizes.iter().sum();
            for count in (0..40).chain([97, 1000, 1001]) {
                for slot in [1, 3, 8] {
                    let g = globals(&sizes);
                    let plans: Vec<AllReducePlan> = (0..world)
                        .map(|r| {
                            let (mut c, mut i) = (0, r);
                            while i >= sizes[c] {
                                i -= sizes[c];
                                c += 1;
                            }
                            all_reduce(count, slot, &sizes, c, i, &g)
                        })
                        .collect();
                    let chunks = plans[0].chunks;
                    for k in 0..chunks {
                        let (off, e) = {
                            let (o, s) = plans[0].chunk(k);
                            (o, s.elems)
                        };
                        // Each cluster's shares tile the chunk; every element's piece lists the
                        // owners that hold it.
                        let mut covered = vec![0usize; e];
                        for (r, plan) in plans.iter().enumerate() {
                            let (o, s) = plan.chunk(k);
                            assert_eq!((o, s.elems), (off, e));
                            for p in &s.pieces {
                                for c in &mut covered[p.start..p.start + p.len] {
                                    *c += 1;
                                }
                                assert!(p.owners.iter().any(|&(o, _)| o == r));
                                for &(o, at) in &p.owners {
                                    let so = plans[o].chunk(k).1;
                                    assert_eq!(so.share.0 + at, p.start, "{sizes:?} {count}");
                                    assert!(p.start + p.len <= so.share.1);
                                }
                            }
                            for &o in &s.read_from {
                                assert!(
                                    plans[o].chunk(k).1.read_from.contains(&r),
                                    "{sizes:?} {count}: {r} reads {o}, not back"
                                );
                            }
                            // A share fits one slot, give or take the tail.
                            assert!(s.share.1 - s.share.0 <= slot + sizes.iter().max().unwrap());
                        }
                        assert!(
                            covered.iter().all(|&n| n == sizes.len()),
                            "{sizes:?} {count}"
                        );
                    }
                    let total: usize = (0..chunks).map(|k| plans[0].chunk(k).1.elems).sum();
                    assert_eq!(total, count);
                }
            }
        }
    }

    #[test]
    fn full_chunks_have_no_tail() {
        assert_eq!(chunk_elems(&[2, 3], 1000), 1998);
        assert_eq!(chunk_elems(&[4], 1000), 4000);
        assert_eq!(chunk_elems(&[7, 11], 2), 14);
        let plan = all_reduce(10_000, 1000, &[2, 3], 0, 1, &globals(&[2, 3]));
        assert_eq!(plan.full.as_ref().map(|s| s.tail), Some(0));
        assert_eq!(plan.chunks, 6);
    }

    #[test]
    fn the_plan_says_which_bridge() {
        let text = |bridge: &str| {
            let t = format!(
                "[[cluster]]\nname = \"a\"\nranks = \"0\"\ndevice = \"host\"\nccl = \"host\"\n\n\
                 [[cluster]]\nname = \"b\"\nranks = \"1-2\"\ndevice = \"host\"\nccl = \"host\"\n\n\
                 [bridge]\nccl = \"{bridge}\"\n"
            );
            let c = crate::config::Config::parse(&t, std::path::Path::new("p.toml")).unwrap();
            describe(&c, 3).unwrap().unwrap()
        };
        let mpi = text("mpi");
        assert!(
            mpi.contains("bridge: MPI (ccl mpi)") && mpi.contains("all 3 ranks"),
            "{mpi}"
        );
        assert!(!mpi.contains("chunk_bytes"), "{mpi}");
        let auto = text("auto");
        assert!(
            auto.contains("bridge: ccl auto") && auto.contains("else MPI"),
            "{auto}"
        );
        let host = text("host");
        assert!(
            host.contains("bridge: ccl host") && !host.contains("MPI"),
            "{host}"
        );
    }
}
