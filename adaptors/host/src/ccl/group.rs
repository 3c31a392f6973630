//! Point-to-point calls and their grouping: between `group_start` and `group_end` a thread's
//! sends and receives are held, then issued as one task per communicator.

use std::cell::RefCell;
use std::sync::Arc;

use ferrocx_plugin_sdk::prelude::*;

use super::comm::HostComm;
use super::handles::get;
use super::p2p::Transfer;
use super::task::{Coll, CollTask};
use crate::stream;

struct Pending {
    comm: Arc<HostComm>,
    stream: Stream,
    transfer: Transfer,
}

thread_local! {
    static GROUP: RefCell<(u32, Vec<Pending>)> = const { RefCell::new((0, Vec::new())) };
}

/// Issues transfers grouped by communicator: one ticket and one task per communicator.
fn issue(pending: Vec<Pending>) -> Result<()> {
    let mut by_comm: Vec<(Arc<HostComm>, Stream, Vec<Transfer>)> = Vec::new();
    for p in pending {
        match by_comm.iter_mut().find(|(c, _, _)| Arc::ptr_eq(c, &p.comm)) {
            Some((_, s, ts)) => {
                if *s != p.stream {
                    return Err(Error::unsupported(
                        "the host CCL runs a group's transfers of one communicator on one stream; \
                         this group used two",
                    ));
                }
                ts.push(p.transfer);
            }
            None => by_comm.push((p.comm, p.stream, vec![p.transfer])),
        }
    }
    for (comm, s, transfers) in by_comm {
        let st = stream::get(s)?;
        let ticket = comm.ticket();
        st.enqueue_coll(CollTask {
            comm,
            ticket,
            op: Coll::Transfers(transfers),
            resume: false,
        })?;
    }
    Ok(())
}

/// Issues a send or receive, or holds it until the group ends.
pub(super) fn p2p(c: Comm, s: Stream, transfer: Transfer) -> Result<()> {
    let comm = get(c)?;
    stream::get(s)?;
    let p = Pending {
        comm,
        stream: s,
        transfer,
    };
    let grouped = GROUP.with(|g| {
        let mut g = g.borrow_mut();
        if g.0 > 0 {
            g.1.push(p);
            None
        } else {
            Some(p)
        }
    });
    match grouped {
        None => Ok(()),
        Some(p) => issue(vec![p]),
    }
}

/// `group_start`: one level deeper.
pub(super) fn start() {
    GROUP.with(|g| g.borrow_mut().0 += 1);
}

/// `group_end`: one level shallower; at the outermost, issues what the group held.
pub(super) fn end() -> Result<()> {
    let pending = GROUP.with(|g| {
        let mut g = g.borrow_mut();
        if g.0 == 0 {
            return Err(Error::invalid_argument("group_end without group_start"));
        }
        g.0 -= 1;
        Ok(if g.0 == 0 {
            std::mem::take(&mut g.1)
        } else {
            Vec::new()
        })
    })?;
    issue(pending)
}
