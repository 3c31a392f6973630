//! Rank and world from the launcher's environment: torchrun (and `ferrocx launch`), Open MPI,
//! PMI (MPICH/Hydra, Intel MPI), Slurm.

use std::fmt;

use super::BootstrapError;

/// Which launcher's variables gave a [`RankInfo`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RankSource {
    /// `RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `LOCAL_WORLD_SIZE` (torchrun, `ferrocx launch`).
    Torchrun,
    /// `OMPI_COMM_WORLD_RANK`, `_SIZE`, `_LOCAL_RANK`, `_LOCAL_SIZE`.
    OpenMpi,
    /// `PMI_RANK`, `PMI_SIZE` (local rank from Hydra's `MPI_LOCALRANKID`/`MPI_LOCALNRANKS`).
    Pmi,
    /// `SLURM_PROCID`, `SLURM_NTASKS`, `SLURM_LOCALID`, `SLURM_NTASKS_PER_NODE`.
    Slurm,
    /// No launcher variable was set: a lone process, rank 0 of 1.
    Default,
    /// Given in code with [`RankInfo::new`].
    Explicit,
}

impl fmt::Display for RankSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            RankSource::Torchrun => "torchrun (RANK/WORLD_SIZE)",
            RankSource::OpenMpi => "Open MPI (OMPI_COMM_WORLD_*)",
            RankSource::Pmi => "PMI (PMI_RANK/PMI_SIZE)",
            RankSource::Slurm => "Slurm (SLURM_PROCID/SLURM_NTASKS)",
            RankSource::Default => "default (no launcher variables: rank 0 of 1)",
            RankSource::Explicit => "explicit",
        })
    }
}

/// This process's place in the job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RankInfo {
    /// Global rank, `0..world_size`.
    pub rank: usize,
    /// Number of ranks in the job.
    pub world_size: usize,
    /// Rank among the ranks of this host, `0..local_world_size`.
    pub local_rank: usize,
    /// Number of ranks on this host.
    pub local_world_size: usize,
    source: RankSource,
}

/// One launcher's variable names. A family is chosen when its rank variable is set; its world
/// variable is then required, the local ones default to a single host (`rank`, `world`).
struct Family {
    source: RankSource,
    rank: &'static str,
    world: &'static str,
    local_rank: &'static str,
    local_world: &'static str,
}

const FAMILIES: [Family; 4] = [
    Family {
        source: RankSource::Torchrun,
        rank: "RANK",
        world: "WORLD_SIZE",
        local_rank: "LOCAL_RANK",
        local_world: "LOCAL_WORLD_SIZE",
    },
    Family {
        source: RankSource::OpenMpi,
        rank: "OMPI_COMM_WORLD_RANK",
        world: "OMPI_COMM_WORLD_SIZE",
        local_rank: "OMPI_COMM_WORLD_LOCAL_RANK",
        local_world: "OMPI_COMM_WORLD_LOCAL_SIZE",
    },
    Family {
        source: RankSource::Pmi,
        rank: "PMI_RANK",
        world: "PMI_SIZE",
        local_rank: "MPI_LOCALRANKID",
        local_world: "MPI_LOCALNRANKS",
    },
    Family {
        source: RankSource::Slurm,
        rank: "SLURM_PROCID",
        world: "SLURM_NTASKS",
        local_rank: "SLURM_LOCALID",
        local_world: "SLURM_NTASKS_PER_NODE",
    },
];

impl RankInfo {
    /// Reads the launcher's variables through `lookup` (e.g. `|v| std::env::var(v).ok()`), trying
    /// in order torchrun's `RANK`/`WORLD_SIZE`/`LOCAL_RANK`/`LOCAL_WORLD_SIZE`, Open MPI's
    /// `OMPI_COMM_WORLD_RANK`/`_SIZE`/`_LOCAL_RANK`/`_LOCAL_SIZE`, `PMI_RANK`/`PMI_SIZE`, and
    /// Slurm's `SLURM_PROCID`/`SLURM_NTASKS`/`SLURM_LOCALID`/`SLURM_NTASKS_PER_NODE` (else
    /// `SLURM_TASKS_PER_NODE` at `SLURM_NODEID`). The first family whose rank variable is set
    /// wins; with none set this is rank 0 of 1.
    ///
    /// Empty values count as unset. A missing local rank or local size means one host (the
    /// global values). A value that is not a number, a world of 0, or a rank not below its size
    /// is an error naming the variable.
    pub fn from_env(lookup: impl Fn(&str) -> Option<String>) -> Result<RankInfo, BootstrapError> {
        let get = |var: &str| {
            lookup(var)
                .map(|v| v.trim().to_owned())
                .filter(|v| !v.is_empty())
        };
        let Some(family) = FAMILIES.iter().find(|f| get(f.rank).is_some()) else {
            return Ok(RankInfo::single());
        };
        let number = |var: &'static str| -> Result<Option<usize>, BootstrapError> {
            get(var).map(|v| parse_count(var, &v)).transpose()
        };
        let rank = number(family.rank)?.unwrap_or(0);
        let world = number(family.world)?.ok_or_else(|| BootstrapError::MissingEnv {
            var: family.world.to_owned(),
            reason: format!("{} is set, so the world size must be too", family.rank),
        })?;
        let local_rank = number(family.local_rank)?;
        let mut local_world_var = family.local_world;
        let mut local_world = number(family.local_world)?;
        if family.source == RankSource::Slurm && local_world.is_none() {
            if let Some(v) = get("SLURM_TASKS_PER_NODE") {
                local_world_var = "SLURM_TASKS_PER_NODE";
                let node = number("SLURM_NODEID")?.unwrap_or(0);
                local_world = Some(slurm_tasks_on_node(&v, node)?);
            }
        }
        let info = RankInfo {
            rank,
            world_size: world,
            local_rank: local_rank.unwrap_or(rank),
            local_world_size: local_world.unwrap_or(world),
            source: family.source,
        };
        info.check(
            [
                family.rank,
                family.world,
                family.local_rank,
                local_world_var,
            ],
            &get,
        )?;
        Ok(info)
    }

    /// A lone process: rank 0 of 1.
    pub fn single() -> RankInfo {
        RankInfo {
            rank: 0,
            world_size: 1,
            local_rank: 0,
            local_world_size: 1,
            source: RankSource::Default,
        }
    }

    /// A rank given in code (e.g. threads standing in for ranks in a test); checked like the
    /// environment's values.
    pub fn new(
        rank: usize,
        world_size: usize,
        local_rank: usize,
        local_world_size: usize,
    ) -> Result<RankInfo, BootstrapError> {
        let info = RankInfo {
            rank,
            world_size,
            local_rank,
            local_world_size,
            source: RankSource::Explicit,
        };
        let names = ["rank", "world_size", "local_rank", "local_world_size"];
        let values = [rank, world_size, local_rank, local_world_size];
        info.check(names, &|n: &str| {
            names
                .iter()
                .position(|&x| x == n)
                .map(|i| values[i].to_string())
        })?;
        Ok(info)
    }

    /// Which launcher's variables were used.
    pub fn source(&self) -> RankSource {
        self.source
    }

    /// Checks the ranges; `vars` are the names of rank, world, local rank, local world.
    fn check(
        &self,
        vars: [&str; 4],
        get: &dyn Fn(&str) -> Option<String>,
    ) -> Result<(), BootstrapError> {
        let [rank_var, world_var, local_rank_var, local_world_var] = vars;
        let bad = |var: &str, fallback: usize, reason: String| BootstrapError::BadEnv {
            var: var.to_owned(),
            value: get(var).unwrap_or_else(|| fallback.to_string()),
            reason,
        };
        if self.world_size == 0 {
            return Err(bad(world_var, 0, "a job has at least one rank".into()));
        }
        if self.rank >= self.world_size {
            return Err(bad(
                rank_var,
                self.rank,
                format!("not below {world_var}={}", self.world_size),
            ));
        }
        if self.local_world_size == 0 || self.local_world_size > self.world_size {
            return Err(bad(
                local_world_var,
                self.local_world_size,
                format!("must be between 1 and {world_var}={}", self.world_size),
            ));
        }
        if self.local_rank >= self.local_world_size {
            return Err(bad(
                local_rank_var,
                self.local_rank,
                format!("not below the local size {}", self.local_world_size),
            ));
        }
        Ok(())
    }
}

fn parse_count(var: &str, value: &str) -> Result<usize, BootstrapError> {
    value.parse::<usize>().map_err(|_| BootstrapError::BadEnv {
        var: var.to_owned(),
        value: value.to_owned(),
        reason: "not a non-negative integer".into(),
    })
}

/// Slurm's `SLURM_TASKS_PER_NODE` (`2(x3),1`: two tasks on each of three nodes, then one) at
/// node `node`.
fn slurm_tasks_on_node(value: &str, node: usize) -> Result<usize, BootstrapError> {
    let var = "SLURM_TASKS_PER_NODE";
    let bad = |reason: String| BootstrapError::BadEnv {
        var: var.to_owned(),
        value: value.to_owned(),
        reason,
    };
    let mut first = 0usize;
    for part in value.split(',') {
        let (tasks, repeat) = match part.split_once("(x") {
            Some((t, r)) => {
                let r = r
                    .strip_suffix(')')
                    .ok_or_else(|| bad(format!("\"{part}\" is not N or N(xM)")))?;
                (t, parse_count(var, r)?)
            }
            None => (part, 1),
        };
        let tasks = parse_count(var, tasks)?;
        if node < first.saturating_add(repeat) {
            return Ok(tasks);
        }
        first = first.saturating_add(repeat);
    }
    Err(bad(format!(
        "lists {first} nodes, but SLURM_NODEID is {node}"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slurm_tasks_per_node_is_expanded() {
        assert_eq!(slurm_tasks_on_node("4", 0).unwrap(), 4);
        assert_eq!(slurm_tasks_on_node("2(x3),1", 2).unwrap(), 2);
        assert_eq!(slurm_tasks_on_node("2(x3),1", 3).unwrap(), 1);
        assert!(slurm_tasks_on_node("2(x3),1", 4).is_err());
        assert!(slurm_tasks_on_node("2(x3", 0).is_err());
    }

    #[test]
    fn explicit_ranks_are_checked() {
        assert!(RankInfo::new(1, 2, 1, 2).is_ok());
        let e = RankInfo::new(2, 2, 0, 2).unwrap_err().to_string();
        assert!(e.contains("rank=\"2\""), "{e}");
    }
}
