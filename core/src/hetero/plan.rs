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

/// A plan cut into chunks of one shape (`S`) but for a shorter last one, for one rank.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Chunked<S> {
    /// Elements of every chunk but the last.
    pub chunk: usize,
    /// Chunks.
    pub chunks: usize,
    /// The shape of the full chunks (`None` when the message is one partial chunk).
    pub full: Option<S>,
    /// The shape of the last chunk when it is shorter.
    pub last: Option<S>,
}

impl<S> Chunked<S> {
    /// The shape of chunk `k` and its first element.
    pub fn chunk(&self, k: usize) -> (usize, &S) {
        let shape = match (&self.last, k + 1 == self.chunks) {
            (Some(last), true) => last,
            _ => self.full.as_ref().expect("a plan with full chunks"),
        };
        (k * self.chunk, shape)
    }
}

/// The plan of an all-reduce of `count` elements for one rank (through the clusters).
pub type AllReducePlan = Chunked<Shape>;

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

/// Which ranks take part in the hybrid plan how (the same on every rank: it depends on the
/// config and the environment only).
///
/// A **flat** rank skips its cluster's in-cluster steps and takes part in the bridge with its
/// whole chunk; a cluster **through its CCL** reduce-scatters each chunk inside, takes part in
/// the bridge with each rank's share, and all-gathers. With no cluster through its CCL this is
/// the flat plan.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Roles {
    /// Every rank of the job.
    pub world: usize,
    /// The flat ranks, ascending (flat index = position here).
    pub flat: Vec<usize>,
    /// Per cluster through its CCL: its global ranks in local order.
    pub through: Vec<Vec<usize>>,
    /// Every flat rank is on the host device: a flat rank's step A reads the other flat ranks'
    /// inputs where they lie (their IPC handles go with the call's descriptor) instead of a
    /// copy published in their slots, and writes its reduced share straight into its slot of
    /// step B (see the module docs of `hetero`).
    pub direct: bool,
}

impl Roles {
    /// The roles of `topo`'s job for `FERROCX_BRIDGE_PLAN` = `choice` (`None`: unset), or
    /// `None` for the plan through every cluster's CCL:
    ///
    /// - `clusters`: every cluster through its CCL (`None`);
    /// - `flat`: every rank flat;
    /// - `hybrid`: clusters of several ranks off the host device through their CCL, the
    ///   others flat; `hybrid=a,b`: clusters `a` and `b` through their CCL, the others flat;
    /// - unset (or anything else): the flat plan when every cluster is flat (one rank, or the
    ///   host device), else the plan through the clusters (the hybrid is opt-in: slower than
    ///   the plan through the clusters on 2 GPUs + 4 CPU ranks).
    ///
    /// A hybrid without a flat rank is the plan through the clusters.
    pub fn choose(topo: &super::topo::Topology, choice: Option<&str>) -> Option<Roles> {
        let by = |through: &dyn Fn(&super::topo::ClusterRanks) -> bool| {
            let mut flat = Vec::new();
            let mut thr = Vec::new();
            let mut direct = true;
            for c in &topo.clusters {
                if through(c) {
                    thr.push(c.ranks.clone());
                } else {
                    flat.extend_from_slice(&c.ranks);
                    direct &= c.host;
                }
            }
            flat.sort_unstable();
            (!flat.is_empty()).then(|| Roles {
                world: topo.world(),
                flat,
                through: thr,
                direct,
            })
        };
        match choice.map(str::trim) {
            Some("clusters") => None,
            Some("flat") => by(&|_| false),
            Some("hybrid") => by(&|c| !c.flat),
            Some(s) if s.starts_with("hybrid=") => {
                let names: Vec<&str> = s["hybrid=".len()..].split(',').map(str::trim).collect();
                by(&|c| names.contains(&c.name.as_str()))
            }
            _ => {
                // The hybrid is opt-in: on 2 H200 + 4 CPU ranks it was slower than the plan
                // through the clusters (6.5–7.4 against 8.3–9.5 GB/s at 64 MiB).
                if topo.clusters.iter().all(|c| c.flat) {
                    by(&|_| false)
                } else {
                    None
                }
            }
        }
    }

    /// `true` when no cluster goes through its CCL (the flat plan).
    pub fn all_flat(&self) -> bool {
        self.through.is_empty()
    }

    /// Rank `r`'s cluster through its CCL and its local rank there, if it has one.
    pub fn through_of(&self, r: usize) -> Option<(usize, usize)> {
        self.through
            .iter()
            .enumerate()
            .find_map(|(c, ranks)| ranks.iter().position(|&x| x == r).map(|i| (c, i)))
    }
}

/// One copy or reduction of a rank's step in the hybrid plan: elements `start..start + len`
/// of the chunk, from `srcs` (rank, element offset in that rank's slot), reduced in that order
/// when `reduce`, else copied from the one source.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HybridOut {
    /// First element, from the chunk's start.
    pub start: usize,
    /// Elements (never 0).
    pub len: usize,
    /// (rank, element offset in its slot), ascending by rank.
    pub srcs: Vec<(usize, usize)>,
    /// Reduce the sources (else copy the one source).
    pub reduce: bool,
}

/// One step (epoch) of a rank in the hybrid plan.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HybridStep {
    /// Elements of the chunk this rank publishes at its slot's start (empty: none).
    pub publish: (usize, usize),
    /// What it reads from the others' slots.
    pub outs: Vec<HybridOut>,
    /// Ranks that read this rank's slot in this step.
    pub readers: u64,
}

/// What one chunk size means for one rank of the hybrid plan: step A (flat ranks publish the
/// chunk from their input and reduce their flat share; ranks through their CCL publish their
/// reduced-in-cluster share) and step B (flat ranks publish their reduced flat share and copy
/// the others'; ranks through their CCL copy the pieces of their share from the flat ranks
/// that reduced them).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HybridShape {
    /// Elements of the chunk.
    pub elems: usize,
    /// Step A.
    pub a: HybridStep,
    /// Step B.
    pub b: HybridStep,
}

/// The hybrid plan of an all-reduce for one rank: chunks of `chunk` elements (a slot's), two
/// epochs each.
pub type HybridPlan = Chunked<HybridShape>;

impl HybridPlan {
    /// Reads of this rank's slot in epoch `j` of the call (two per chunk).
    pub fn readers(&self, j: usize) -> u64 {
        let s = self.chunk(j / 2).1;
        if j % 2 == 0 {
            s.a.readers
        } else {
            s.b.readers
        }
    }
}

/// `lo`, `hi` and the `points` strictly between them, ascending, each once: where a share
/// `lo..hi` is cut by the share boundaries (`points`) of other ranks.
fn cut(lo: usize, hi: usize, points: impl Iterator<Item = usize>) -> Vec<usize> {
    let mut bounds = vec![lo, hi];
    bounds.extend(points.filter(|&b| b > lo && b < hi));
    bounds.sort_unstable();
    bounds.dedup();
    bounds
}

/// Rank `r`'s steps A and B in an `e`-element chunk, without the readers.
fn hybrid_steps_of(e: usize, roles: &Roles, r: usize) -> (HybridStep, HybridStep) {
    let f = roles.flat.len();
    // Per cluster through its CCL, the share bounds of its ranks inside the chunk.
    let owner_in = |c: usize, a: usize| -> (usize, usize) {
        let p = roles.through[c].len();
        let i = owner_of(e, p, a);
        (roles.through[c][i], share_of(e, p, i).0)
    };
    if let Some(j) = roles.flat.iter().position(|&x| x == r) {
        let (f0, f1) = share_of(e, f, j);
        let bounds = cut(
            f0,
            f1,
            roles
                .through
                .iter()
                .flat_map(|ranks| (1..ranks.len()).map(move |i| i * (e / ranks.len()))),
        );
        let reduce_outs = bounds
            .windows(2)
            .filter(|w| w[1] > w[0])
            .map(|w| {
                let a = w[0];
                let mut srcs: Vec<(usize, usize)> = roles.flat.iter().map(|&x| (x, a)).collect();
                for c in 0..roles.through.len() {
                    let (o, start) = owner_in(c, a);
                    srcs.push((o, a - start));
                }
                srcs.sort_unstable();
                HybridOut {
                    start: a,
                    len: w[1] - w[0],
                    srcs,
                    reduce: true,
                }
            })
            .collect();
        let copies = roles
            .flat
            .iter()
            .enumerate()
            .filter(|&(y, _)| y != j)
            .filter_map(|(y, &x)| {
                let (y0, y1) = share_of(e, f, y);
                (y1 > y0).then(|| HybridOut {
                    start: y0,
                    len: y1 - y0,
                    srcs: vec![(x, 0)],
                    reduce: false,
                })
            })
            .collect();
        let a = HybridStep {
            publish: (0, e),
            outs: reduce_outs,
            readers: 0,
        };
        let b = HybridStep {
            publish: (f0, f1),
            outs: copies,
            readers: 0,
        };
        return (a, b);
    }
    let (c, i) = roles
        .through_of(r)
        .expect("a rank flat or through its cluster");
    let p = roles.through[c].len();
    let (s0, s1) = share_of(e, p, i);
    let bounds = cut(s0, s1, (1..f).map(|y| y * (e / f)));
    let copies = bounds
        .windows(2)
        .filter(|w| w[1] > w[0])
        .map(|w| {
            let y = owner_of(e, f, w[0]);
            HybridOut {
                start: w[0],
                len: w[1] - w[0],
                srcs: vec![(roles.flat[y], w[0] - share_of(e, f, y).0)],
                reduce: false,
            }
        })
        .collect();
    let a = HybridStep {
        publish: (s0, s1),
        outs: Vec::new(),
        readers: 0,
    };
    let b = HybridStep {
        publish: (0, 0),
        outs: copies,
        readers: 0,
    };
    (a, b)
}

/// Rank `me`'s shape of an `e`-element chunk in the hybrid plan, its readers counted from
/// every rank's reads.
pub fn hybrid_shape(e: usize, roles: &Roles, me: usize) -> HybridShape {
    let (mut a, mut b) = hybrid_steps_of(e, roles, me);
    let reads = |s: &HybridStep, r: usize| -> bool {
        s.outs.iter().any(|o| o.srcs.iter().any(|&(x, _)| x == me)) && r != me
    };
    for r in 0..roles.world {
        if r == me {
            continue;
        }
        let (ra, rb) = hybrid_steps_of(e, roles, r);
        a.readers += u64::from(reads(&ra, r));
        b.readers += u64::from(reads(&rb, r));
    }
    HybridShape { elems: e, a, b }
}

/// The hybrid plan of `count` elements for rank `me`, in chunks of `chunk` elements (what a
/// flat rank's slot holds).
pub fn hybrid(count: usize, chunk: usize, roles: &Roles, me: usize) -> HybridPlan {
    let chunk = chunk.max(1);
    let chunks = count.div_ceil(chunk).max(1);
    let rest = count - (chunks - 1) * chunk;
    let mk = |e| hybrid_shape(e, roles, me);
    let (full, last) = if chunks == 1 {
        (None, Some(mk(rest)))
    } else if rest == chunk {
        (Some(mk(chunk)), None)
    } else {
        (Some(mk(chunk)), Some(mk(rest)))
    };
    HybridPlan {
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
    let choice = std::env::var("FERROCX_BRIDGE_PLAN").ok();
    let roles = Roles::choose(&t0, choice.as_deref());
    if let Some(roles) = roles.as_ref().filter(|r| !r.all_flat()) {
        let e = (b.chunk_bytes as usize / 4).max(1);
        let names = |ranks: &[usize]| -> String {
            let mut n: Vec<&str> = ranks.iter().map(|&r| t0.cluster_name_of(r)).collect();
            n.dedup();
            n.join(", ")
        };
        let thr: Vec<usize> = roles.through.iter().flatten().copied().collect();
        let _ = writeln!(
            out,
            "all_reduce of f32 past that: the hybrid plan, chunks of {e} elements ({} bytes), \
             {} in flight on the ranks through their cluster; per chunk: clusters {} \
             reduce-scatter inside (their CCL) and publish each rank's share; the flat ranks \
             (clusters {}) publish the whole chunk, each reduces its flat share from every flat \
             rank's slot and the other clusters' owners' shares, then publishes it; every rank \
             copies the reduced pieces it lacks; clusters {} all-gather inside",
            e * 4,
            b.depth,
            names(&thr),
            names(&roles.flat),
            names(&thr),
        );
        for r in 0..roles.world {
            let s = hybrid_shape(e, roles, r);
            let what = if roles.flat.contains(&r) {
                format!(
                    "flat, reduces {}..{} of each chunk",
                    s.b.publish.0, s.b.publish.1
                )
            } else {
                format!(
                    "through its cluster, share {}..{}, copied back from ranks {:?}",
                    s.a.publish.0,
                    s.a.publish.1,
                    s.b.outs.iter().map(|o| o.srcs[0].0).collect::<Vec<_>>()
                )
            };
            let _ = writeln!(out, "  rank {r} ({}): {what}", t0.cluster_name_of(r));
        }
        return Ok(Some(out));
    }
    if roles.is_some() {
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

    /// Runs the hybrid plan of every rank on integer data (wrapping sums of random words, so
    /// a source missed or taken twice shows) and checks that every rank ends with the sum of
    /// every rank's input, that every rank's slot is read by as many ranks as it expects, and
    /// that what a rank publishes fits its slot (a chunk).
    fn simulate_hybrid(sizes: &[usize], through: &[usize], e: usize) {
        let world: usize = sizes.iter().sum();
        let g = globals(sizes);
        let mut flat = Vec::new();
        let mut thr = Vec::new();
        for (c, &p) in sizes.iter().enumerate() {
            let ranks: Vec<usize> = (0..p).map(|i| g(c, i)).collect();
            if through.contains(&c) {
                thr.push(ranks);
            } else {
                flat.extend(ranks);
            }
        }
        let roles = Roles {
            world,
            flat,
            through: thr,
            direct: false,
        };
        let word = |r: usize, i: usize| {
            let mut x = (r as u64) << 32 ^ i as u64 ^ 0x9e37_79b9_7f4a_7c15;
            x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
            x ^ (x >> 29)
        };
        let want: Vec<u64> = (0..e)
            .map(|i| (0..world).fold(0u64, |a, r| a.wrapping_add(word(r, i))))
            .collect();
        let shapes: Vec<HybridShape> = (0..world).map(|r| hybrid_shape(e, &roles, r)).collect();
        // Every rank's buffer: its input; a cluster through its CCL reduce-scatters.
        let mut buf: Vec<Vec<u64>> = (0..world)
            .map(|r| (0..e).map(|i| word(r, i)).collect())
            .collect();
        for ranks in &roles.through {
            let p = ranks.len();
            for (i, &r) in ranks.iter().enumerate() {
                let (s0, s1) = share_of(e, p, i);
                for (a, v) in buf[r].iter_mut().enumerate().take(s1).skip(s0) {
                    *v = ranks
                        .iter()
                        .fold(0u64, |acc, &x| acc.wrapping_add(word(x, a)));
                }
            }
        }
        let mut reads = [vec![0u64; world], vec![0u64; world]];
        for (step, rd) in reads.iter_mut().enumerate() {
            let slots: Vec<Vec<u64>> = (0..world)
                .map(|r| {
                    let s = if step == 0 {
                        &shapes[r].a
                    } else {
                        &shapes[r].b
                    };
                    assert!(s.publish.0 <= s.publish.1 && s.publish.1 <= e);
                    buf[r][s.publish.0..s.publish.1].to_vec()
                })
                .collect();
            for r in 0..world {
                let s = if step == 0 {
                    &shapes[r].a
                } else {
                    &shapes[r].b
                };
                let mut from: Vec<usize> = Vec::new();
                for o in &s.outs {
                    assert!(o.len > 0, "{sizes:?} {through:?} {e}");
                    assert!(o.reduce || o.srcs.len() == 1);
                    for k in 0..o.len {
                        let v = o
                            .srcs
                            .iter()
                            .fold(0u64, |acc, &(x, at)| acc.wrapping_add(slots[x][at + k]));
                        buf[r][o.start + k] = v;
                    }
                    for &(x, _) in &o.srcs {
                        if x != r && !from.contains(&x) {
                            from.push(x);
                        }
                    }
                }
                for x in from {
                    rd[x] += 1;
                }
            }
        }
        // The clusters through their CCL all-gather.
        for ranks in &roles.through {
            let p = ranks.len();
            for (i, &r) in ranks.iter().enumerate() {
                let (s0, s1) = share_of(e, p, i);
                let reduced = buf[r][s0..s1].to_vec();
                for &x in ranks {
                    buf[x][s0..s1].copy_from_slice(&reduced);
                }
            }
        }
        for r in 0..world {
            assert_eq!(
                buf[r], want,
                "rank {r}: {sizes:?} through {through:?}, {e} elements"
            );
            assert_eq!(
                shapes[r].a.readers, reads[0][r],
                "{sizes:?} {through:?} {e}"
            );
            assert_eq!(
                shapes[r].b.readers, reads[1][r],
                "{sizes:?} {through:?} {e}"
            );
        }
    }

    #[test]
    fn the_hybrid_plan_reduces_every_element_once_from_every_rank() {
        for (sizes, through) in [
            (vec![2, 4], vec![0]),
            (vec![2, 3], vec![0]),
            (vec![3, 2], vec![1]),
            (vec![1, 3], vec![0]),
            (vec![2, 1, 3], vec![0]),
            (vec![2, 3, 2], vec![0, 2]),
            (vec![4, 4], vec![]),
            (vec![5], vec![]),
            (vec![3, 5], vec![0, 1]),
        ] {
            if through.len() == sizes.len() {
                continue;
            }
            for e in (1..30).chain([97, 1000, 1001]) {
                simulate_hybrid(&sizes, &through, e);
            }
        }
    }

    #[test]
    fn hybrid_roles_follow_the_config_and_the_switch() {
        let text = "[[cluster]]\nname = \"gpu\"\nranks = \"0-1\"\ndevice = \"cuda\"\nccl = \"nccl\"\n\n\
                    [[cluster]]\nname = \"cpu\"\nranks = \"2-5\"\ndevice = \"host\"\nccl = \"host\"\n";
        let c = crate::config::Config::parse(text, std::path::Path::new("p.toml")).unwrap();
        let t = super::super::topo::Topology::new(&c, 6, 0).unwrap();
        // Opt-in: unset, GPUs beside CPU ranks take the plan through the clusters.
        assert_eq!(Roles::choose(&t, None), None);
        let hybrid = Roles::choose(&t, Some("hybrid")).expect("the hybrid plan");
        assert_eq!(hybrid.flat, vec![2, 3, 4, 5]);
        assert_eq!(hybrid.through, vec![vec![0, 1]]);
        assert_eq!(Roles::choose(&t, Some("clusters")), None);
        assert!(Roles::choose(&t, Some("flat")).unwrap().all_flat());
        let named = Roles::choose(&t, Some("hybrid=cpu")).unwrap();
        assert_eq!(
            (named.flat, named.through),
            (vec![0, 1], vec![vec![2, 3, 4, 5]])
        );
        assert_eq!(Roles::choose(&t, Some("hybrid=gpu,cpu")), None);
        let plan = describe(&c, 6).unwrap().unwrap();
        assert!(plan.contains("reduce-scatter in each cluster"), "{plan}");
        assert!(!plan.contains("the hybrid plan"), "{plan}");
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
