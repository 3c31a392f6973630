//! `ferrocx bench --op all_gather --overlap`: how much of an all-gather a pipelined consumer
//! hides. Per size (the bytes of the gathered activations, f32), every rank holds `rows` rows
//! of `--matmul-k` columns, and three things are timed (host clock around `--iters` of each
//! and a synchronize, after `--warmup`; the slowest rank's time):
//!
//! - `t_all_gather`: the all-gather alone (`--algo ccl`/`auto`: `all_gather`; `p2p`:
//!   `all_gather_p2p` on `--streams` streams by the router's route; `window-copies`,
//!   `window-reads`: `all_gather_p2p` forced onto that route);
//! - `t_matmul`: the matmul of the gathered rows by a `k x n` matrix
//!   ([`ferrocx_kernels::matmul`]), on the communicator's stream;
//! - `t_pipelined`: `all_gather_p2p_each` with slice `j`'s matmul on slice `j`'s stream right
//!   after its event (on the route `--algo` forces, else the router's); with `--own-rows
//!   input` this rank's own rows are multiplied from its input at once, on the communicator's
//!   stream (they need no transfer).
//!
//! `--output-window` puts the gathered rows in symmetric memory registered as a window of peer
//! addresses, which the window-copies route pushes into (`Call::output_window`); `--in-place`
//! gathers in place (this rank's input is its rows of the output, so no copy of them takes the
//! device beside the matmul).
//!
//! `--timeline` runs each size once more with an event at every slice's (or piece's) arrival
//! and after every matmul, and rank 0 prints them as microseconds from the start.
//!
//! The overlap is `(t_all_gather + t_matmul) / t_pipelined`: 1 when nothing overlaps, up to 2
//! when the two take equal time and hide each other completely. The pipelined output is checked
//! against the plain one (all-gather then one matmul), element by element.

use std::error::Error;
use std::process::ExitCode;
use std::time::Instant;

use ferrocx::abi::{DataType, DevicePtr, Event, MemKind, ReduceOp, Stream};
use ferrocx::adaptor::{Device, DeviceBuffer};
use ferrocx::comm::{CommError, Communicator, Slice};
use ferrocx::route::Route;
use ferrocx::window::{SymmetricBuffer, Window, WindowFlags};
use ferrocx_kernels::matmul::Matmul;

use super::{show_size, sizes, AlgoArg, BenchArgs, OwnRows};

/// The three times of one size, in microseconds per operation.
struct Times {
    gather: f64,
    matmul: f64,
    pipelined: f64,
    /// `--timeline`'s lines (this rank's).
    timeline: Vec<String>,
}

/// Buffers of one size.
struct Buffers {
    x: DeviceBuffer,
    /// The gather's input: `x`, or with `--in-place` this rank's rows of `x_full` (a copy of
    /// `x` put there before each run).
    send: DevicePtr,
    /// The gathered rows: device memory, or with `--output-window` symmetric memory registered
    /// as a window (then `full_mem` holds it).
    x_full: DevicePtr,
    full_mem: Option<DeviceBuffer>,
    window: Option<(Window, SymmetricBuffer)>,
    w: DeviceBuffer,
    y: DeviceBuffer,
    y_plain: DeviceBuffer,
}

/// One slice's (or piece's) marks: source rank, first row, rows, arrival, matmul done.
type Mark = (usize, usize, usize, Event, Option<Event>);

/// `--timeline`: an event at each slice's (or piece's) arrival and after its matmul, and one
/// at the start, all on this rank's device. The events are made beforehand, so that marking
/// costs the enqueuing thread no more than a record.
struct Marks {
    start: Event,
    each: std::cell::RefCell<Vec<Mark>>,
    spare: std::cell::RefCell<Vec<Event>>,
}

impl Marks {
    /// Marks for up to `n` slices or pieces, the start recorded on `stream`.
    fn new(dev: &Device, stream: Stream, n: usize) -> Result<Self, Box<dyn Error>> {
        let start = dev.event_create(0)?;
        let spare = (0..2 * n)
            .map(|_| dev.event_create(0))
            .collect::<Result<Vec<_>, _>>()?;
        dev.event_record(start, stream)?;
        Ok(Marks {
            start,
            each: Default::default(),
            spare: std::cell::RefCell::new(spare),
        })
    }

    /// An event made beforehand, or a new one if they ran out.
    fn event(&self, dev: &Device) -> Result<Event, CommError> {
        match self.spare.borrow_mut().pop() {
            Some(e) => Ok(e),
            None => dev
                .event_create(0)
                .map_err(|e| CommError::PointToPoint(e.to_string())),
        }
    }

    /// Records the arrival of `rows` rows from `rank` (first row `row`) on `stream`.
    fn arrived(
        &self,
        dev: &Device,
        rank: usize,
        row: usize,
        rows: usize,
        stream: Stream,
    ) -> Result<(), CommError> {
        let e = self.event(dev)?;
        self.each.borrow_mut().push((rank, row, rows, e, None));
        dev.event_record(e, stream)
            .map_err(|e| CommError::PointToPoint(e.to_string()))
    }

    /// Records the end of the last arrival's matmul, enqueued on `stream`.
    fn done(&self, dev: &Device, stream: Stream) -> Result<(), CommError> {
        let e = self.event(dev)?;
        if let Some(last) = self.each.borrow_mut().last_mut() {
            last.4 = Some(e);
        }
        dev.event_record(e, stream)
            .map_err(|e| CommError::PointToPoint(e.to_string()))
    }

    /// The marks as lines of text (after a synchronize), `end` recorded at the run's end; the
    /// events are destroyed.
    fn report(self, dev: &Device, end: Event) -> Result<Vec<String>, Box<dyn Error>> {
        let us = |e: Event| -> Result<f64, Box<dyn Error>> {
            Ok(f64::from(dev.event_elapsed_ms(self.start, e)?) * 1e3)
        };
        let mut out = Vec::new();
        for &(rank, row, rows, arrived, done) in self.each.borrow().iter() {
            let done_at = match done {
                Some(d) => format!("{:>9.1}", us(d)?),
                None => "        -".into(),
            };
            out.push(format!(
                "#   from rank {rank:>3}  rows {row:>9}..{:<9}  arrived {:>9.1} us  matmul done {done_at} us",
                row + rows,
                us(arrived)?
            ));
        }
        out.push(format!("#   end {:>9.1} us", us(end)?));
        for &(_, _, _, a, d) in self.each.borrow().iter() {
            dev.event_destroy(a)?;
            if let Some(d) = d {
                dev.event_destroy(d)?;
            }
        }
        for &e in self.spare.borrow().iter() {
            dev.event_destroy(e)?;
        }
        dev.event_destroy(self.start)?;
        dev.event_destroy(end)?;
        Ok(out)
    }
}

struct Overlap<'a> {
    comm: &'a Communicator,
    args: &'a BenchArgs,
    matmul: Matmul,
    k: usize,
    n: usize,
    /// The route the pipelined gather took (the last call's).
    route: std::cell::Cell<Option<Route>>,
}

impl Overlap<'_> {
    /// Enqueues the all-gather alone, by `--algo`, ordered before later work of the stream.
    fn gather(&self, b: &Buffers, count: usize) -> Result<(), Box<dyn Error>> {
        let call = self.comm.call();
        // SAFETY: the buffers hold `count` and `world * count` f32 and live until the stream
        // is synchronized.
        unsafe {
            match self.args.algo {
                a if a.p2p().is_some() => {
                    let h = self.p2p_call(b).all_gather_p2p(
                        b.send,
                        b.x_full,
                        count,
                        DataType::F32,
                        self.args.streams as usize,
                    )?;
                    h.join(self.comm.stream())?;
                }
                AlgoArg::Auto => call.all_gather(b.send, b.x_full, count, DataType::F32)?,
                _ => call
                    .via(Route::Ccl)
                    .all_gather(b.send, b.x_full, count, DataType::F32)?,
            }
        }
        Ok(())
    }

    /// A call on the route `--algo` forces (`window-copies`, `window-reads`), else the
    /// router's.
    fn p2p_call<'b>(&'b self, b: &'b Buffers) -> ferrocx::comm::Call<'b> {
        let call = match self.args.algo.p2p().flatten() {
            Some(route) => self.comm.call().via(route),
            None => self.comm.call(),
        };
        match &b.window {
            Some((window, _)) => call.output_window(window),
            None => call,
        }
    }

    /// Enqueues the matmul of every gathered row into `y`.
    fn matmul(&self, b: &Buffers, y: &DeviceBuffer, rows: usize) -> Result<(), Box<dyn Error>> {
        let (k, n) = (self.k, self.n);
        // SAFETY: `x_full` holds `rows x k`, `w` `k x n` and `y` `rows x n` f32, alive until
        // the stream is synchronized.
        unsafe {
            self.matmul.enqueue(
                self.comm.device(),
                self.comm.stream(),
                [b.x_full, b.w.ptr(), y.ptr()],
                (rows, n, k),
            )?
        };
        Ok(())
    }

    /// Enqueues the pipelined gather and per-slice matmuls, the communicator's stream after
    /// them.
    fn pipelined(
        &self,
        b: &Buffers,
        m: usize,
        marks: Option<&Marks>,
    ) -> Result<(), Box<dyn Error>> {
        let (k, n) = (self.k, self.n);
        let dev = self.comm.device();
        // A slice, or a piece of one (`--pieces`): its rows of the gathered activations, and
        // the same rows of `y`. Whole slices are multiplied on their own streams, right after
        // them; pieces on the communicator's stream after each piece's event, so the copies of
        // a slice's later pieces (on the slice's stream) run under the matmul of its first —
        // except when the gather pushes into an output window: the slice's stream then holds
        // only the waits for its pieces, and each piece's matmul goes there, with no hop.
        let pieces = self.args.pieces > 1;
        let me = self.comm.rank();
        let hook = |s: &Slice| {
            let row = (s.ptr.0 - b.x_full.0) as usize / (k * 4);
            let y = DevicePtr(b.y.ptr().0 + (row * n * 4) as u64);
            // This rank's own rows with `--own-rows input`: its input, at once, on the
            // communicator's stream, while the gather copies them and the peers' slices.
            let own_input = s.rank == me && self.args.own_rows == OwnRows::Input;
            let (on, rows) = if own_input {
                (self.comm.stream(), b.send)
            } else if pieces && b.window.is_none() {
                dev.stream_wait_event(self.comm.stream(), s.event)
                    .map_err(|e| CommError::PointToPoint(e.to_string()))?;
                (self.comm.stream(), s.ptr)
            } else {
                (s.stream, s.ptr)
            };
            if let Some(m) = marks {
                m.arrived(dev, s.rank, row, s.count / k, s.stream)?;
            }
            // SAFETY: the rows `row..row + s.count / k` of the gathered output (whole rows:
            // pieces are cut at rows) are in place when `on` reaches this point, and `x` (this
            // rank's whole own slice: pieces cut only the peers' slices) holds them from the
            // start and is only read by the gather; the rows of `y` it writes are its own; the
            // buffers live until the synchronize.
            unsafe {
                self.matmul
                    .enqueue(dev, on, [rows, b.w.ptr(), y], (s.count / k, n, k))
            }
            .map_err(CommError::PointToPoint)?;
            match marks {
                Some(m) => m.done(dev, on),
                None => Ok(()),
            }
        };
        let piece_rows = m.div_ceil(self.args.pieces as usize);
        // SAFETY: as in `gather`.
        let h = unsafe {
            self.p2p_call(b)
                .pieces(piece_rows * k)
                .all_gather_p2p_each(
                    b.send,
                    b.x_full,
                    m * k,
                    DataType::F32,
                    self.args.streams as usize,
                    hook,
                )?
        };
        self.route.set(Some(h.route()));
        h.join(self.comm.stream())?;
        Ok(())
    }

    /// Microseconds per run of `work`: `--warmup` untimed, then `--iters` between the clock's
    /// reads and a synchronize.
    fn time(&self, work: &dyn Fn() -> Result<(), Box<dyn Error>>) -> Result<f64, Box<dyn Error>> {
        for _ in 0..self.args.warmup {
            work()?;
        }
        self.comm.synchronize()?;
        self.comm.barrier()?;
        let start = Instant::now();
        for _ in 0..self.args.iters {
            work()?;
        }
        self.comm.synchronize()?;
        Ok(start.elapsed().as_secs_f64() * 1e6 / f64::from(self.args.iters))
    }

    /// Element-wise maxima over the ranks.
    fn slowest(&self, v: &[f64]) -> Result<Vec<f64>, Box<dyn Error>> {
        let bytes: Vec<u8> = v.iter().flat_map(|t| t.to_ne_bytes()).collect();
        let buf = DeviceBuffer::from_host(self.comm.device(), &bytes, MemKind::DEVICE)?;
        // SAFETY: `buf` holds `v.len()` f64 and lives past the synchronize.
        unsafe {
            self.comm
                .all_reduce(buf.ptr(), buf.ptr(), v.len(), DataType::F64, ReduceOp::MAX)?
        };
        self.comm.synchronize()?;
        Ok(buf
            .to_vec()?
            .chunks_exact(8)
            .map(|c| f64::from_ne_bytes(c.try_into().unwrap_or([0; 8])))
            .collect())
    }

    /// One size: `m` rows per rank. The times, and the most elements where a rank's
    /// pipelined output differs from its plain one.
    fn size(&self, m: usize) -> Result<(Times, u64), Box<dyn Error>> {
        let (k, n, world) = (self.k, self.n, self.comm.world());
        let dev = self.comm.device();
        let me = self.comm.rank();
        let x: Vec<u8> = (0..m * k)
            .flat_map(|i| (((me * 131 + i * 7) % 9) as f32 - 4.0).to_ne_bytes())
            .collect();
        let w: Vec<u8> = (0..k * n)
            .flat_map(|i| (((i * 5) % 7) as f32 - 3.0).to_ne_bytes())
            .collect();
        let mut b = Buffers {
            x: DeviceBuffer::from_host(dev, &x, MemKind::DEVICE)?,
            send: DevicePtr::NULL,
            x_full: DevicePtr::NULL,
            full_mem: None,
            window: None,
            w: DeviceBuffer::from_host(dev, &w, MemKind::DEVICE)?,
            y: DeviceBuffer::new(dev, world * m * n * 4, MemKind::DEVICE)?,
            y_plain: DeviceBuffer::new(dev, world * m * n * 4, MemKind::DEVICE)?,
        };
        if self.args.output_window {
            let mem = self.comm.alloc_symmetric(world * m * k * 4)?;
            // SAFETY: a live symmetric allocation of its size, deregistered below before the
            // memory is freed.
            let window = unsafe {
                self.comm.register_window(
                    mem.ptr(),
                    mem.size(),
                    WindowFlags::NO_MULTICAST | WindowFlags::PEERS,
                )
            }?;
            b.x_full = mem.ptr();
            b.window = Some((window, mem));
        } else {
            let mem = DeviceBuffer::new(dev, world * m * k * 4, MemKind::DEVICE)?;
            b.x_full = mem.ptr();
            b.full_mem = Some(mem);
        }
        b.send = match self.args.in_place {
            true => DevicePtr(b.x_full.0 + (me * m * k * 4) as u64),
            false => b.x.ptr(),
        };
        if self.args.in_place {
            // SAFETY: `x` holds `m * k` f32 and this rank's rows of `x_full` as many.
            unsafe { dev.mem_copy(b.send, b.x.ptr(), m * k * 4) }?;
        }
        let rows = world * m;
        let gather = self.time(&|| self.gather(&b, m * k))?;
        let matmul = self.time(&|| self.matmul(&b, &b.y_plain, rows))?;
        let pipelined = self.time(&|| self.pipelined(&b, m, None))?;
        // The check: the plain way's output against the pipelined one's.
        self.gather(&b, m * k)?;
        self.matmul(&b, &b.y_plain, rows)?;
        self.comm.synchronize()?;
        let plain = b.y_plain.to_vec()?;
        b.y.fill(0xff)?;
        self.pipelined(&b, m, None)?;
        self.comm.synchronize()?;
        let piped = b.y.to_vec()?;
        let wrong = plain
            .chunks_exact(4)
            .zip(piped.chunks_exact(4))
            .filter(|(a, b)| a != b)
            .count();
        let mut timeline = Vec::new();
        if self.args.timeline {
            // The run is held at a gate on the communicator's stream (everything the gather
            // enqueues waits for its start there) until all of it is enqueued, so the marks
            // time the device's work, not the enqueuing.
            let gate = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
            let held = gate.clone();
            let end = dev.event_create(0)?;
            self.comm.barrier()?;
            ferrocx::comm::p2p::launch_host(dev, self.comm.stream(), move || {
                let t0 = Instant::now();
                while !held.load(std::sync::atomic::Ordering::Acquire)
                    && t0.elapsed().as_secs() < 10
                {
                    std::thread::yield_now();
                }
            })?;
            let pieces = self.args.pieces.max(1) as usize;
            let marks = Marks::new(dev, self.comm.stream(), world * pieces + 1)?;
            let run = self.pipelined(&b, m, Some(&marks));
            let recorded = dev.event_record(end, self.comm.stream());
            gate.store(true, std::sync::atomic::Ordering::Release);
            run?;
            recorded?;
            self.comm.synchronize()?;
            timeline = marks.report(dev, end)?;
        }
        if let Some((window, mem)) = b.window.take() {
            self.comm.synchronize()?;
            self.comm.deregister_window(window)?;
            drop(mem);
        }
        drop(b.full_mem.take());
        // The most wrong elements on any rank: 0 only when every rank's output is right.
        let all = self.slowest(&[gather, matmul, pipelined, wrong as f64])?;
        let wrong = all[3] as u64;
        Ok((
            Times {
                gather: all[0],
                matmul: all[1],
                pipelined: all[2],
                timeline,
            },
            wrong,
        ))
    }
}

/// Runs the overlap measurement on this rank; rank 0 prints the table.
pub fn run(args: &BenchArgs, comm: &Communicator) -> Result<ExitCode, Box<dyn Error>> {
    let (rank, world) = (comm.rank(), comm.world());
    let matmul = Matmul::new(comm.device())?;
    let o = Overlap {
        comm,
        args,
        matmul,
        k: args.matmul_k as usize,
        n: args.matmul_n as usize,
        route: std::cell::Cell::new(None),
    };
    let sweep = sizes(args.min_bytes, args.max_bytes, args.step_factor);
    let per_row = 4 * o.k * world;
    let kept: Vec<u64> = sweep
        .iter()
        .copied()
        .filter(|&s| s as usize >= per_row)
        .collect();
    if kept.is_empty() {
        return Err(format!(
            "--overlap: no size from -b {} to -e {} holds one row of --matmul-k {} f32 per \
             rank on {world} ranks (at least {per_row} bytes): raise -e",
            show_size(args.min_bytes),
            show_size(args.max_bytes),
            o.k
        )
        .into());
    }
    if rank == 0 {
        println!(
            "# ferrocx bench --overlap: all_gather (--algo {}, {} stream(s), {} piece(s) a \
             slice) + matmul of f32 rows by {}x{} on {world} ranks; device {}, CCL {}, matmul: {}",
            args.algo.name(),
            args.streams,
            args.pieces,
            o.k,
            o.n,
            comm.device().name(),
            comm.ccl().name(),
            o.matmul.name()
        );
        if kept.len() < sweep.len() {
            println!("# sizes below {per_row} bytes (one row per rank) are skipped");
        }
        println!(
            "# {:>12} {:>10} {:>16} {:>14} {:>16} {:>8} {:>7}",
            "size(B)",
            "rows/rank",
            "t_all_gather(us)",
            "t_matmul(us)",
            "t_pipelined(us)",
            "overlap",
            "#wrong"
        );
    }
    let mut wrong_total = 0;
    for size in kept {
        let m = size as usize / per_row;
        let (t, wrong) = o.size(m)?;
        wrong_total += wrong;
        if rank == 0 {
            let bytes = m * per_row;
            println!(
                "  {:>12} {:>10} {:>16.1} {:>14.1} {:>16.1} {:>8.2} {:>7}",
                bytes,
                m,
                t.gather,
                t.matmul,
                t.pipelined,
                (t.gather + t.matmul) / t.pipelined,
                wrong
            );
            for line in &t.timeline {
                println!("{line}");
            }
        }
    }
    if rank == 0 {
        if let Some(route) = o.route.get() {
            println!("# pipelined all_gather_p2p route: {route}");
        }
    }
    if wrong_total > 0 {
        if rank == 0 {
            eprintln!("ferrocx bench: {wrong_total} wrong element(s) in the pipelined output");
        }
        return Ok(ExitCode::from(1));
    }
    Ok(ExitCode::SUCCESS)
}
