//! The collectives measured: their buffer geometry for a size, as nccl-tests defines it, their
//! bus-bandwidth factor, and the call through the CCL adaptor.

use ferrocx::abi::{DataType, DevicePtr, ReduceOp};
use ferrocx::comm::Communicator;

/// One collective.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// All-reduce.
    AllReduce,
    /// All-gather.
    AllGather,
    /// Reduce-scatter.
    ReduceScatter,
    /// Broadcast from the root.
    Broadcast,
    /// Reduce to the root.
    Reduce,
    /// All-to-all.
    AllToAll,
}

/// Element counts of one op at one size, for one rank.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Geometry {
    /// The count passed to the CCL (nccl-tests' `count` column): all_gather's per-rank input,
    /// reduce_scatter's per-rank output, all_to_all's per-peer block.
    pub count: usize,
    /// Elements of the input buffer.
    pub send: usize,
    /// Elements of the output buffer.
    pub recv: usize,
    /// Bytes of the largest buffer (the table's `size`; a multiple of the ranks' blocks).
    pub size: usize,
}

impl Op {
    /// Every op, in the order `--op all` runs them.
    pub const ALL: [Op; 6] = [
        Op::AllReduce,
        Op::AllGather,
        Op::ReduceScatter,
        Op::Broadcast,
        Op::Reduce,
        Op::AllToAll,
    ];

    /// The op's name (as `--op` takes it).
    pub fn name(self) -> &'static str {
        match self {
            Op::AllReduce => "all_reduce",
            Op::AllGather => "all_gather",
            Op::ReduceScatter => "reduce_scatter",
            Op::Broadcast => "broadcast",
            Op::Reduce => "reduce",
            Op::AllToAll => "all_to_all",
        }
    }

    /// Whether the op combines ranks' values with a reduction op.
    pub fn reduces(self) -> bool {
        matches!(self, Op::AllReduce | Op::ReduceScatter | Op::Reduce)
    }

    /// Whether the op has a root.
    pub fn rooted(self) -> bool {
        matches!(self, Op::Broadcast | Op::Reduce)
    }

    /// busbw / algbw, as nccl-tests: the fraction of the data each link carries in an
    /// optimal algorithm, so that busbw compares with the hardware's peak whatever `n`.
    pub fn bus_factor(self, n: usize) -> f64 {
        let n = n.max(1) as f64;
        match self {
            Op::AllReduce => 2.0 * (n - 1.0) / n,
            Op::AllGather | Op::ReduceScatter | Op::AllToAll => (n - 1.0) / n,
            Op::Broadcast | Op::Reduce => 1.0,
        }
    }

    /// Buffers of the op at `size` bytes with elements of `es` bytes over `n` ranks.
    pub fn geometry(self, size: u64, es: usize, n: usize) -> Geometry {
        let elems = usize::try_from(size).unwrap_or(usize::MAX) / es.max(1);
        let n = n.max(1);
        let (count, send, recv) = match self {
            Op::AllReduce | Op::Broadcast | Op::Reduce => (elems, elems, elems),
            Op::AllGather => {
                let c = elems / n;
                (c, c, c * n)
            }
            Op::ReduceScatter => {
                let c = elems / n;
                (c, c * n, c)
            }
            Op::AllToAll => {
                let c = elems / n;
                (c, c * n, c * n)
            }
        };
        Geometry {
            count,
            send,
            recv,
            size: send.max(recv) * es,
        }
    }

    /// Enqueues the op on the communicator's stream.
    ///
    /// # Safety
    ///
    /// As the CCL's call for the op (e.g. [`ferrocx::adaptor::Ccl::all_reduce`]): `send` and
    /// `recv` hold the op's input and output for `count` (see [`Op::geometry`]) until it
    /// completes on the communicator's stream.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn issue(
        self,
        comm: &Communicator,
        send: DevicePtr,
        recv: DevicePtr,
        count: usize,
        dtype: DataType,
        redop: ReduceOp,
        root: i32,
    ) -> Result<(), ferrocx::adaptor::AdaptorError> {
        let (ccl, h, s) = (comm.ccl(), comm.handle(), comm.stream());
        // SAFETY: the caller's contract, passed on.
        unsafe {
            match self {
                Op::AllReduce => ccl.all_reduce(send, recv, count, dtype, redop, h, s),
                Op::AllGather => ccl.all_gather(send, recv, count, dtype, h, s),
                Op::ReduceScatter => ccl.reduce_scatter(send, recv, count, dtype, redop, h, s),
                Op::Broadcast => ccl.broadcast(send, recv, count, dtype, root, h, s),
                Op::Reduce => ccl.reduce(send, recv, count, dtype, redop, root, h, s),
                Op::AllToAll => ccl.all_to_all(send, recv, count, dtype, h, s),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn geometry_follows_nccl_tests() {
        let g = Op::AllReduce.geometry(1024, 4, 3);
        assert_eq!((g.count, g.send, g.recv, g.size), (256, 256, 256, 1024));
        // The largest buffer is the size; blocks round down to whole elements per rank.
        let g = Op::AllGather.geometry(1024, 4, 3);
        assert_eq!((g.count, g.send, g.recv, g.size), (85, 85, 255, 1020));
        let g = Op::ReduceScatter.geometry(1024, 4, 4);
        assert_eq!((g.count, g.send, g.recv, g.size), (64, 256, 64, 1024));
        let g = Op::AllToAll.geometry(64, 8, 2);
        assert_eq!((g.count, g.send, g.recv, g.size), (4, 8, 8, 64));
        let g = Op::AllGather.geometry(4, 4, 3);
        assert_eq!((g.count, g.size), (0, 0));
    }

    #[test]
    fn bus_factors_are_nccl_tests_ones() {
        assert_eq!(Op::AllReduce.bus_factor(4), 1.5);
        assert_eq!(Op::AllGather.bus_factor(4), 0.75);
        assert_eq!(Op::ReduceScatter.bus_factor(2), 0.5);
        assert_eq!(Op::AllToAll.bus_factor(8), 0.875);
        assert_eq!(Op::Broadcast.bus_factor(8), 1.0);
        assert_eq!(Op::Reduce.bus_factor(3), 1.0);
        assert_eq!(Op::AllReduce.bus_factor(1), 0.0);
    }
}
