//! The CCL part, as one rank of N processes runs it: a communicator, every collective against
//! a reference on reproducible random data, grouped point-to-point, IPC between ranks, buffer
//! and window registration, error codes for bad arguments, and (last, on its own communicator)
//! abort.
//!
//! The suite needs the device's `mem_alloc`, `mem_free`, `mem_copy` and `stream_synchronize`
//! and the CCL's `get_last_error`, `get_unique_id`, `comm_init_rank` and `comm_destroy` to run at
//! all. Every rank runs the same checks in the same order, so collective calls match up; a rank
//! whose collective fails marks the communicator broken and skips the collectives after it
//! (its peers time out once, then do the same), so one failure costs one timeout, not one per
//! check.

mod abort;
mod arguments;
mod collectives;
pub(crate) mod ipc;
mod resources;

use std::cell::RefCell;
use std::time::Duration;

use ferrocx::abi::{CclLimits, Comm, DataType, ReduceOp, Stream};
use ferrocx::adaptor::{AdaptorError, Ccl, Device};

use crate::boundary::{ensure, fail, skip, CclApi, DeviceApi, Mark, Res, Stop, Verdict};
use crate::buffer::{DevBuf, OwnedStream};
use crate::device::{init_once, missing_entries, needs};
use crate::report::{Outcome, Report};
use crate::runner::Runner;

/// Device entries the CCL part needs to run at all.
pub const REQUIRED_DEVICE_ENTRIES: [&str; 4] =
    ["mem_alloc", "mem_free", "mem_copy", "stream_synchronize"];
/// CCL entries the CCL part needs to run at all.
pub const REQUIRED_CCL_ENTRIES: [&str; 4] = [
    "get_last_error",
    "get_unique_id",
    "comm_init_rank",
    "comm_destroy",
];

/// The unique ids of a run, made once (by the driver, as rank 0 would) and given to every
/// rank: one for the communicator of the suite, one for the abort check's own.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UniqueIds {
    /// The suite's communicator.
    pub main: Vec<u8>,
    /// The abort check's communicator.
    pub abort: Vec<u8>,
}

impl UniqueIds {
    /// Initialises the CCL (once per process; an absent `init` is fine) and creates both ids.
    pub fn create(ccl: &Ccl) -> Result<UniqueIds, AdaptorError> {
        let api = CclApi::new(ccl);
        match init_ccl_once(&api) {
            Ok(()) | Err(AdaptorError::Unsupported { .. }) => {}
            Err(e) => return Err(e),
        }
        Ok(UniqueIds {
            main: api.seen(ccl.unique_id())?,
            abort: api.seen(ccl.unique_id())?,
        })
    }

    /// `main:abort` in hexadecimal, for the environment.
    pub fn to_hex(&self) -> String {
        format!("{}:{}", hex(&self.main), hex(&self.abort))
    }

    /// Reads [`UniqueIds::to_hex`]'s form.
    pub fn from_hex(s: &str) -> Option<UniqueIds> {
        let (a, b) = s.split_once(':')?;
        Some(UniqueIds {
            main: unhex(a)?,
            abort: unhex(b)?,
        })
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if s.len() % 2 != 0 {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

/// `init` of the CCL once per process and adaptor; later calls return the first outcome.
pub(crate) fn init_ccl_once(api: &CclApi) -> Res<()> {
    use std::collections::HashMap;
    use std::sync::Mutex;
    static DONE: Mutex<Option<HashMap<String, Res<()>>>> = Mutex::new(None);
    let mut done = DONE.lock().unwrap_or_else(|p| p.into_inner());
    done.get_or_insert_with(HashMap::new)
        .entry(api.ccl.name().to_string())
        .or_insert_with(|| api.seen(api.ccl.init()))
        .clone()
}

/// Runs the CCL checks as rank `rank` of `world`; every rank of the run must call it with the
/// same ids at about the same time. `timeout` bounds every wait on a peer (it is the
/// communicators' `timeout_ms`).
pub fn check_ccl_rank(
    dev: &Device,
    ccl: &Ccl,
    rank: usize,
    world: usize,
    ids: &UniqueIds,
    timeout: Duration,
) -> Report {
    let mut r = Runner::new(None);
    run(&mut r, dev, ccl, rank, world, ids, timeout);
    r.finish()
}

/// What the checks of one rank share.
pub(crate) struct Ctx<'a> {
    pub dev: &'a DeviceApi,
    pub ccl: &'a CclApi,
    pub comm: Comm,
    pub s: Stream,
    pub rank: usize,
    pub world: usize,
    /// The device this rank's communicators use.
    pub device: i32,
    pub timeout: Duration,
    /// What the adaptor claims (`get_limits`; no limits for an older table).
    pub limits: CclLimits,
    /// The check whose collective failed, after which the communicator is not trusted.
    broken: RefCell<Option<String>>,
}

impl Ctx<'_> {
    /// "Not claimed" when `dtype` (or `op`) lies outside the adaptor's declared limits: the
    /// check is not run (on every rank alike, so collectives still match up).
    pub(crate) fn claims(&self, dtype: DataType, op: Option<ReduceOp>) -> Verdict {
        if !self.limits.allows_dtype(dtype) {
            return Err(Stop(Outcome::not_claimed(&format!(
                "the adaptor's limits do not list the data type {}",
                crate::reference::dt_name(dtype)
            ))));
        }
        match op {
            Some(op) if !self.limits.allows_op(op) => Err(Stop(Outcome::not_claimed(&format!(
                "the adaptor's limits do not list the reduction {}",
                crate::reference::op_name(op)
            )))),
            _ => Ok(()),
        }
    }

    /// A data type and a reduction the adaptor claims, for the all-reduces the suite uses as
    /// barriers (`i32` sum where claimed).
    pub(crate) fn any_reduction(&self) -> Result<(DataType, ReduceOp), Stop> {
        let dtype = [DataType::I32, DataType::F32, DataType::I64, DataType::F64]
            .into_iter()
            .chain(DataType::ALL)
            .find(|&d| self.limits.allows_dtype(d));
        let op = [ReduceOp::SUM, ReduceOp::MAX, ReduceOp::MIN]
            .into_iter()
            .chain(ReduceOp::ALL)
            .find(|&o| self.limits.allows_op(o));
        match (dtype, op) {
            (Some(d), Some(o)) => Ok((d, o)),
            _ => Err(Stop(Outcome::not_claimed(
                "the adaptor's limits list no data type or no reduction for an all-reduce",
            ))),
        }
    }

    /// Skips when the communicator failed in an earlier check.
    pub(crate) fn usable(&self) -> Verdict {
        match &*self.broken.borrow() {
            Some(b) => Err(skip(format!(
                "the communicator failed in an earlier check ({b})"
            ))),
            None => Ok(()),
        }
    }

    /// Marks the communicator broken by check `what`.
    pub(crate) fn spoil(&self, what: &str) {
        self.broken
            .borrow_mut()
            .get_or_insert_with(|| what.to_string());
    }

    /// Enqueues a collective (or a group) and waits for the stream; a failure marks the
    /// communicator broken and names `what`.
    pub(crate) fn run(&self, what: &str, enqueue: impl FnOnce() -> Res<()>) -> Verdict {
        self.usable()?;
        let r = enqueue().and_then(|()| self.dev.seen(self.dev.dev.stream_synchronize(self.s)));
        match r {
            Ok(()) => Ok(()),
            Err(e @ AdaptorError::Unsupported { .. }) => Err(e.into()),
            Err(e) => {
                self.spoil(what);
                let Stop(o) = Stop::from(e);
                Err(match o {
                    Outcome::Fail(reason) => fail(format!("{what}: {reason}")),
                    o => Stop(o),
                })
            }
        }
    }

    /// A barrier: an all-reduce of one element.
    pub(crate) fn barrier(&self, what: &str) -> Verdict {
        let (dtype, op) = self.any_reduction()?;
        let b = DevBuf::device(self.dev, 8)?;
        b.upload(&[0; 8])?;
        self.run(what, || {
            // SAFETY: `b` holds 8 bytes, one element of any type, in place; `run` waits for
            // the stream before it drops.
            self.ccl.seen(unsafe {
                self.ccl
                    .ccl
                    .all_reduce(b.ptr(), b.ptr(), 1, dtype, op, self.comm, self.s)
            })
        })
    }

    /// Every rank's `value`, in rank order (an all-gather).
    pub(crate) fn all_gather_u64(&self, what: &str, value: u64) -> Result<Vec<u64>, Stop> {
        // Eight bytes as whichever type the adaptor claims (every type's size divides 8).
        let dtype = [DataType::U64, DataType::I64, DataType::F64, DataType::U8]
            .into_iter()
            .chain(DataType::ALL)
            .find(|&d| self.limits.allows_dtype(d))
            .ok_or_else(|| {
                Stop(Outcome::not_claimed(
                    "the adaptor's limits list no data type to exchange values with",
                ))
            })?;
        let per = 8 / dtype.size().expect("a known type");
        let send = DevBuf::device(self.dev, 8)?;
        let recv = DevBuf::device(self.dev, 8 * self.world)?;
        send.upload(&value.to_ne_bytes())?;
        self.run(what, || {
            // SAFETY: `send` holds 8 and `recv` `8 * world` bytes, `per` elements of `dtype` per
            // rank; `run` waits for the stream before they drop.
            self.ccl.seen(unsafe {
                self.ccl
                    .ccl
                    .all_gather(send.ptr(), recv.ptr(), per, dtype, self.comm, self.s)
            })
        })?;
        let bytes = recv.download(8 * self.world)?;
        Ok(bytes
            .chunks_exact(8)
            .map(|c| u64::from_ne_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
            .collect())
    }
}

/// The CCL checks of one rank, into `r`.
pub(crate) fn run(
    r: &mut Runner<'_>,
    dev: &Device,
    ccl: &Ccl,
    rank: usize,
    world: usize,
    ids: &UniqueIds,
    timeout: Duration,
) {
    let mark = Mark::now();
    let dapi = DeviceApi::new(dev);
    let capi = CclApi::new(ccl);
    let mut missing: Vec<String> = missing_entries(&dapi, &REQUIRED_DEVICE_ENTRIES)
        .iter()
        .map(|e| format!("device `{e}`"))
        .collect();
    let present = ccl.tables().root.present();
    missing.extend(
        REQUIRED_CCL_ENTRIES
            .iter()
            .filter(|e| !present.contains(e))
            .map(|e| format!("CCL `{e}`")),
    );
    let required = r.check("ccl", "required entries", || {
        ensure(missing.is_empty(), || {
            format!(
                "absent: {} (the CCL checks need them to run)",
                missing.join(", ")
            )
        })
    });
    if required != Outcome::Pass {
        r.boundary("ccl", mark);
        return;
    }
    r.check("device", "init", || Ok(init_once(&dapi)?));
    let init = r.check("ccl", "init", || Ok(init_ccl_once(&capi)?));
    // An absent `init` means there is nothing to initialise.
    let init = if init.is_absent() {
        Outcome::Pass
    } else {
        init
    };
    // The thread works on device 0, the communicators' device.
    if dapi.root().set_device.is_some() {
        let _ = dapi.seen(dapi.dev.set_device(0));
    }
    r.check("ccl", "get_version", || {
        let v = capi.seen(ccl.version())?;
        ensure(v >= 0, || format!("get_version reports {v}"))
    });
    // One device per rank where the adaptor has several (NCCL refuses two ranks on one GPU);
    // it is made current before the stream, the buffers and the communicator are created.
    let devices = dapi.dev.device_count().unwrap_or(1).max(1);
    let device = rank as i32 % devices;
    if devices > 1 {
        let _ = dapi.seen(dapi.dev.set_device(device));
    }
    let stream = OwnedStream::with_flags(&dapi, 0).ok();
    let s = stream.as_ref().map_or(Stream::NULL, |s| s.s);
    let mut comm = None;
    let made = match needs("init", &init) {
        Some(skip) => {
            r.record(
                "ccl",
                "communicator: comm_init_rank, count, rank, device",
                skip.clone(),
            );
            skip
        }
        None => r.check(
            "ccl",
            "communicator: comm_init_rank, count, rank, device",
            || {
                let c = capi.seen(ccl.comm_init_rank(
                    rank as i32,
                    world as i32,
                    device,
                    &ids.main,
                    timeout.as_millis() as u64,
                    &[],
                ))?;
                comm = Some(c);
                describe(&capi, c, rank, world, device)
            },
        ),
    };
    let skip = match comm {
        Some(_) => None,
        None => Some(
            needs("a communicator", &made).unwrap_or(Outcome::Skip("needs a communicator".into())),
        ),
    };
    let ctx = Ctx {
        device,
        dev: &dapi,
        ccl: &capi,
        comm: comm.unwrap_or(Comm::NULL),
        s,
        rank,
        world,
        timeout,
        limits: ccl.limits().unwrap_or_default(),
        broken: RefCell::new(None),
    };
    let mut plan = collectives::plan(&ctx);
    plan.extend(ipc::plan(&ctx));
    plan.extend(resources::plan(&ctx));
    plan.extend(arguments::plan(&ctx));
    plan.extend(closing(&ctx));
    plan.extend(abort::plan(&ctx, ids));
    for Planned {
        group,
        name,
        body,
        needs_comm,
    } in plan
    {
        match &skip {
            Some(o) if needs_comm => r.record(group, name, o.clone()),
            _ => {
                r.check(group, name, body);
            }
        }
    }
    drop(stream);
    r.boundary("ccl", mark);
}

/// A check of the CCL part, planned before it runs (so that, without a communicator, every
/// check is still listed, as skipped).
pub(crate) struct Planned<'a> {
    pub group: &'static str,
    pub name: String,
    pub body: Box<dyn FnOnce() -> Verdict + 'a>,
    /// Whether it uses the communicator (without one it is skipped).
    pub needs_comm: bool,
}

impl<'a> Planned<'a> {
    /// A check of `group` named `name`.
    pub(crate) fn new(
        group: &'static str,
        name: impl Into<String>,
        body: impl FnOnce() -> Verdict + 'a,
    ) -> Planned<'a> {
        Planned {
            group,
            name: name.into(),
            body: Box::new(body),
            needs_comm: true,
        }
    }

    /// Marks a check that runs without a communicator.
    pub(crate) fn without_comm(self) -> Planned<'a> {
        Planned {
            needs_comm: false,
            ..self
        }
    }
}

/// The async error after the suite, then finalize and destroy.
fn closing<'a>(ctx: &'a Ctx<'a>) -> Vec<Planned<'a>> {
    let capi = ctx.ccl;
    let c = ctx.comm;
    vec![
        Planned::new("ccl", "comm_get_async_error after the suite", move || {
            ctx.usable()?;
            match capi.seen(capi.ccl.comm_async_error(c)) {
                Err(AdaptorError::Unsupported { .. }) => {
                    Err(Stop(Outcome::absent("`comm_get_async_error`")))
                }
                r => {
                    let st = r?;
                    ensure(st.is_success(), || {
                        format!("the communicator reports {st} after every check passed")
                    })
                }
            }
        }),
        Planned::new("ccl", "comm_finalize and comm_destroy", move || {
            let fin = if capi.root().comm_finalize.is_some() && ctx.usable().is_ok() {
                capi.seen(capi.ccl.comm_finalize(c))
            } else {
                Ok(())
            };
            let destroyed = capi.seen(capi.ccl.comm_destroy(c));
            fin?;
            destroyed?;
            Ok(())
        }),
    ]
}

/// `comm_count`, `comm_user_rank`, `comm_device` and the async error of a new communicator.
fn describe(capi: &CclApi, c: Comm, rank: usize, world: usize, ctx_device: i32) -> Verdict {
    let ccl = &capi.ccl;
    let root = capi.root();
    if root.comm_count.is_some() {
        let n = capi.seen(ccl.comm_count(c))?;
        ensure(n == world as i32, || {
            format!("comm_count is {n}, the communicator has {world} ranks")
        })?;
    }
    if root.comm_user_rank.is_some() {
        let me = capi.seen(ccl.comm_user_rank(c))?;
        ensure(me == rank as i32, || {
            format!("comm_user_rank is {me}, this is rank {rank}")
        })?;
    }
    if root.comm_device.is_some() {
        let mut d = -1;
        crate::boundary::raw_call!(capi, root, comm_device(c, &mut d))?;
        ensure(d == ctx_device, || {
            format!("comm_device is {d}, the communicator was made on device {ctx_device}")
        })?;
    }
    if root.comm_get_async_error.is_some() {
        let st = capi.seen(ccl.comm_async_error(c))?;
        ensure(
            st.is_success() || st == ferrocx::abi::Status::NOT_READY,
            || format!("a new communicator reports the asynchronous error {st}"),
        )?;
    }
    Ok(())
}
