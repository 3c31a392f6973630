"""The ``"ferrocx"`` backend of ``torch.distributed``.

``import ferrocx.torch`` registers it for ``cpu`` and ``cuda`` tensors; then
``torch.distributed.init_process_group("ferrocx")`` works under ``torchrun`` and under
``ferrocx launch``. Each process group is a :class:`ProcessGroupFerrocx` over one ferrocx
communicator made from the environment (the configuration ``FERROCX_CONFIG`` names: one
cluster, or several, e.g. GPU ranks on CUDA + NCCL beside CPU ranks on the host backend).

- CUDA tensors (a rank whose cluster runs the ``cuda`` device): every call is enqueued on
  torch's current stream, with no host synchronization; ``Work.wait()`` orders the then current
  stream after it. An ``all_reduce`` whose caller waits later (``async_op=True``, DDP's
  gradient buckets) runs as with torch's NCCL backend where the native backend is in use (the
  default; ``FERROCX_TORCH_COMM_STREAM=0`` turns it off, ``=1`` turns it on for the Python
  process group too): on a communication stream of the group, after what the current stream
  holds, so that the caller's stream goes on with its own work (the backward pass). ``Work.get_future()`` of a call on the current
  stream is a future completed at once, its value ready in stream order (for work on that
  stream, as the call's tensors are: DDP's reducer and comm hooks use it there); of a call on
  the communication stream, a CUDA future (its ``wait()`` orders the caller's stream after it).
- CPU tensors (a rank on the ``host`` device): calls are enqueued on the communicator's stream
  and ``Work.wait()`` waits for them (so ``isend``/``irecv`` really run in the background).
  CPU tensors on a CUDA rank are staged through device memory, synchronously.
- The native backend (``ferrocx._native``: C++, built against the torch that imports it on
  first use) takes ``ProcessGroup.allreduce`` from torch's dispatcher with no Python in
  between, the call DDP's reducer makes per bucket from its autograd thread; every other call,
  and an all_reduce it does not take, is this module's Python. ``FERROCX_TORCH_NATIVE=0``, or a
  machine where it cannot be built (warned once), keeps everything in Python.
- A caller that waits at once (torch's functions without ``async_op``: ``asyncOp`` false in the
  options) gets no Work from the common calls, as from torch's own NCCL backend: on CUDA the
  call is then on torch's current stream, on the host device it has completed on return.
- The interpreter's lock is released while ferrocx works.

Reduce ops: ``SUM``, ``AVG``, ``MIN``, ``MAX``, ``PRODUCT`` (for ``bool``: ``MIN``/``PRODUCT`` is
a logical and, ``MAX``/``SUM`` a logical or). Anything ferrocx cannot do (another op or dtype,
mismatched shapes across ranks, a dead rank within the configured timeout) raises
:class:`ferrocx.Error` with ferrocx's message.
"""

from __future__ import annotations

import atexit
import os
import queue
import socket
import threading
from datetime import timedelta
from typing import Callable, List, Optional

import torch
import torch.distributed as dist

from . import _ferrocx as _fx
from . import _native
from ._ferrocx import Error

__all__ = ["ProcessGroupFerrocx", "Error", "BACKEND"]

#: The backend's name, for ``init_process_group``.
BACKEND = "ferrocx"

_DTYPES = {
    torch.float32: _fx.F32,
    torch.float64: _fx.F64,
    torch.float16: _fx.F16,
    torch.bfloat16: _fx.BF16,
    torch.int8: _fx.I8,
    torch.uint8: _fx.U8,
    torch.int32: _fx.I32,
    torch.int64: _fx.I64,
    torch.bool: _fx.U8,
}

_R = dist.ReduceOp
_SUM = _R.RedOpType.SUM


def _opname(op) -> str:
    for name, v in dist.ReduceOp.RedOpType.__members__.items():
        if op == v:
            return name
    return str(op)


# torch's reduce ops and ferrocx's, looked up by comparison (SUM first: the common case).
_BOOL = torch.bool
_REDOPS = (
    (_R.RedOpType.SUM, _fx.SUM),
    (_R.RedOpType.AVG, _fx.AVG),
    (_R.RedOpType.MAX, _fx.MAX),
    (_R.RedOpType.MIN, _fx.MIN),
    (_R.RedOpType.PRODUCT, _fx.PROD),
)
# On bool: SUM and MAX are a logical or, PRODUCT and MIN a logical and.
_BOOL_REDOPS = (
    (_R.RedOpType.SUM, _fx.MAX),
    (_R.RedOpType.MAX, _fx.MAX),
    (_R.RedOpType.MIN, _fx.MIN),
    (_R.RedOpType.PRODUCT, _fx.MIN),
)


def _redop(op, dtype: torch.dtype) -> int:
    """ferrocx's reduce op for torch's ``op`` on ``dtype``."""
    table = _BOOL_REDOPS if dtype is _BOOL else _REDOPS
    for t, f in table:
        if op == t:
            return f
    if dtype is _BOOL and op == _R.RedOpType.AVG:
        raise Error(f"ferrocx: reduce op {_opname(op)} has no meaning on bool tensors (SUM, MAX, MIN, PRODUCT do)")
    raise Error(f"ferrocx: unsupported reduce op {_opname(op)} (ferrocx reduces with SUM, AVG, MIN, MAX, PRODUCT)")


def _no_cuda(idx: int) -> int:
    raise Error("ferrocx: this torch has no CUDA")


#: torch's current CUDA stream on device ``idx``, as the raw ``CUstream`` (an int): the C
#: function itself (``torch.cuda.current_stream()`` makes a Python stream object each call).
_raw_stream: Callable[[int], int] = getattr(torch._C, "_cuda_getCurrentRawStream", _no_cuda)

_NO_TIMEOUT = timedelta(0)

# What a short path answers where the call is not its to make (the general path makes it).
_GENERAL = object()

# Whether torch's options tell a call that its caller waits at once (`asyncOp`, torch >= 2.8).
# Whether an all_reduce of CUDA tensors whose caller does not wait at once (DDP's gradient
# buckets, ``async_op=True``) runs on a communication stream of the group, ordered after the
# current stream, as torch's NCCL backend runs it (``FERROCX_TORCH_COMM_STREAM``: 1 on, 0 off,
# unset: on with the native backend, off without). With the native backend the hand-off costs
# what NCCL's does, and the bucket all-reduces overlap the backward pass: DDP step on 2 H200
# 0.97-1.01x torch's nccl against 1.17-1.23x on the caller's stream. In Python the hand-off
# and a CUDA future cost more per call than they save on some machine sizes (DDP step on 4
# H100 1.04-1.05x with it against 1.11x without; on 2 GPUs 1.14x against 1.12x).
_COMM_STREAM_ENV = os.environ.get("FERROCX_TORCH_COMM_STREAM", "").strip()
_COMM_STREAM = _COMM_STREAM_ENV == "1"

_ASYNC_OPT = all(
    hasattr(getattr(dist.distributed_c10d, o)(), "asyncOp")
    for o in ("AllreduceOptions", "BroadcastOptions", "AllgatherOptions", "ReduceScatterOptions")
)


# By the dtype's identity (torch's dtypes are singletons; hashing one costs more).
_DTYPE_IDS = {id(k): v for k, v in _DTYPES.items()}


def _dtype(t: torch.Tensor) -> int:
    d = _DTYPE_IDS.get(id(t.dtype))
    if d is None:
        names = ", ".join(str(k).replace("torch.", "") for k in _DTYPES)
        raise Error(f"ferrocx: unsupported dtype {t.dtype} (ferrocx takes {names})")
    return d


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return s.getsockname()[1]


# The environment is process-wide: communicators are made one at a time.
_ENV_LOCK = threading.Lock()


def _with_env(overrides: dict, make: Callable):
    """Runs ``make()`` with ``overrides`` in ``os.environ`` (``None`` removes a variable)."""
    with _ENV_LOCK:
        saved = {k: os.environ.get(k) for k in overrides}
        try:
            for k, v in overrides.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
            return make()
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


# `ferrocx launch` hosts ferrocx's store at MASTER_PORT; torch's env:// rendezvous would bind
# the same port on rank 0. At import the ranks agree, through the launcher's store, on another
# port for torch, and keep the launcher's for ferrocx's communicators.
_LAUNCH_PORT = "FERROCX_LAUNCH_STORE_PORT"


def _move_torch_off_launcher_store() -> None:
    if os.environ.get("FERROCX_STORE_HOSTED") != "1" or _LAUNCH_PORT in os.environ:
        return
    if "MASTER_PORT" not in os.environ or "RANK" not in os.environ:
        return
    mine = str(_free_port()) if os.environ.get("RANK") == "0" else None
    port = _fx.store_exchange("ferrocx/torch/master_port", mine)
    os.environ[_LAUNCH_PORT] = os.environ["MASTER_PORT"]
    os.environ["MASTER_PORT"] = port


# The Future of every CPU work whose future was asked for is completed here, in issue order
# (a SimpleQueue: its put is a C call, where a Queue's takes Python locks and a condition).
_completions: "queue.SimpleQueue[Optional[_Work]]" = queue.SimpleQueue()
_completer: Optional[threading.Thread] = None
_completer_lock = threading.Lock()


def _complete_forever() -> None:
    while True:
        work = _completions.get()
        if work is None:
            return
        try:
            work.wait()
        except BaseException:  # noqa: BLE001 - the future carries it
            pass
        del work


def _ensure_completer() -> None:
    global _completer
    if _completer is not None:
        return
    with _completer_lock:
        if _completer is None:
            _completer = threading.Thread(target=_complete_forever, name="ferrocx-futures", daemon=True)
            _completer.start()
            atexit.register(_stop_completer)


def _stop_completer() -> None:
    """Completes what is queued and stops the thread before the interpreter finalizes (a
    thread that would take the interpreter's lock after that is killed mid-call)."""
    global _completer
    with _completer_lock:
        t, _completer = _completer, None
    if t is not None:
        _completions.put(None)
        t.join()


# Guards completing works and making their futures (rare and short: one lock for all).
_WORK_LOCK = threading.RLock()


class _Work(dist.Work):
    """A ferrocx call as a ``torch.distributed.Work``: a call the host need not wait for (a
    CUDA call enqueued on its stream, or a call that has completed), or, on the host device, a
    pending one (``_done`` false): then the call is on the communicator's stream, ``wait()``
    synchronizes that stream (raising a failure of its work) and ``_post`` (copies into the
    caller's tensors) runs once it completes.

    No ``__init__`` of its own: making one costs torch's constructor alone, and the state below
    is class-wide until a work sets its own (``_work`` and the short paths set what they need).
    """

    _pg: "Optional[ProcessGroupFerrocx]" = None
    # The raw CUDA stream of a CUDA call (with ``_idx``).
    _raw = 0
    _outputs: list = []
    _post: Optional[Callable] = None
    _error: Optional[BaseException] = None
    _done = True
    _future: "Optional[torch.futures.Future]" = None
    # The future `_future` follows, while the work is pending (see `_pending`).
    _source: "Optional[torch.futures.Future]" = None
    _keep = None
    # The CUDA device the call's stream is on (-1: none).
    _idx = -1

    def _finish(self) -> None:
        if self._done:
            return
        # The stream's failures are reported when it is synchronized (sticky, as CUDA's):
        # waiting for the whole stream is what raises them. Not under the lock: another
        # thread may wait for the same stream meanwhile.
        try:
            self._pg._comm.synchronize()
            error = None
        except BaseException as e:  # noqa: BLE001 - kept for exception()/the future
            error = e
        with _WORK_LOCK:
            if self._done:
                return
            post, self._post = self._post, None
            if error is None and post is not None:
                try:
                    post()
                except BaseException as e:  # noqa: BLE001
                    error = e
            self._error = error
            self._keep = None
            self._done = True
            source = self._source
        if source is not None and not source.done():
            source.set_result(_Failure(self._error) if self._error is not None else self._outputs)

    def wait(self, timeout: timedelta = _NO_TIMEOUT) -> bool:
        if not self._done:
            self._finish()
        if self._error is not None:
            raise self._error
        return True

    def is_completed(self) -> bool:
        if not self._done and self._pg._comm.query():
            self._finish()
        return self._done

    def is_success(self) -> bool:
        return self.is_completed() and self._error is None

    def exception(self):
        return self._error

    def result(self) -> List[torch.Tensor]:
        return self._outputs

    def synchronize(self) -> None:
        self.wait()

    def source_rank(self) -> int:
        raise Error("ferrocx: source_rank is only for receives from any source, which ferrocx does not do")

    def get_future(self) -> torch.futures.Future:
        """The call's future, its value the list of output tensors (as torch's backends give):
        completed at once where the call has (or has by now: one query of the stream), else
        completed in issue order by a thread that waits for the communicator's stream."""
        fut = self._future
        if fut is not None:
            return fut
        if not self._done and self._pg._comm.query():
            self._finish()
        with _WORK_LOCK:
            if self._future is None:
                if self._done:
                    self._future = _completed(self._outputs, self._error)
                else:
                    self._source, self._future = _pending()
                    _ensure_completer()
                    _completions.put(self)
            return self._future


class _StreamWork(_Work):
    """A CUDA call, enqueued on stream ``_raw`` of device ``_idx`` (torch's current one, or the
    group's communication stream ``_stream``): done as far as the host is concerned; ``wait()``
    orders the then current stream after it."""

    # The torch stream object of a call on the group's communication stream (else None), and
    # its (stream id, device index, device type) for torch's current-stream functions.
    _stream = None
    _sid = None

    def wait(self, timeout: timedelta = _NO_TIMEOUT) -> bool:
        idx = self._idx
        cur = _raw_stream(idx)
        if cur != self._raw:
            # The current stream changed since the call: order it after the call's stream.
            pg = self._pg
            if pg is not None:
                pg._comm.order(pg._handle(self._raw), pg._handle(cur))
            else:
                torch.cuda.current_stream(idx).wait_stream(self._call_stream())
        return True

    def _call_stream(self) -> "torch.cuda.Stream":
        st = self._stream
        return st if st is not None else torch.cuda.ExternalStream(self._raw, device=self._idx)

    def get_future(self) -> torch.futures.Future:
        """The call's future, its value the list of output tensors.

        A call on the current stream (all but those on the communication stream, asked for
        before the caller switches streams) gets a future completed at once, with no device
        event: its value is ready in stream order, as the call's tensors are after it returns,
        and its consumers run on this stream. A ``then`` callback of a completed future runs
        at once, here (DDP's Python comm hooks); DDP's reducer reads its buckets in the
        backward pass's final callback, on the stream that called ``backward()``, which the
        autograd engine orders after every stream the hooks ran on (its leaf streams). A
        consumer on another stream orders itself as after any kernel of this stream
        (``Work.wait()`` there). torch's NCCL backend records an event per call instead; made
        from Python (event, stream context, the value pickled to find its tensors) that cost
        about 76 us per DDP bucket on H100s.

        A call on another stream (the communication stream, or the caller has switched since)
        gets a CUDA future marked ready on the call's stream: ``wait()`` and ``then``
        callbacks order the consumer's stream after the call."""
        fut = self._future
        if fut is not None:
            return fut
        idx = self._idx
        if _raw_stream(idx) == self._raw:
            fut = _CFuture(_NO_DEVICES)
            fut.set_result(self._outputs)
        elif self._sid is not None:
            # A CUDA future marks its value ready on the current stream: make that the call's
            # (the communication stream) for the moment, so that a consumer of the value waits
            # for the call. torch's C functions, not its Python stream context and future
            # class (about 100 us a bucket from DDP's autograd thread, on H100s).
            fut = _CFuture(_cuda_devices(idx))
            prev = _get_stream(idx)
            _set_stream(*self._sid)
            try:
                fut.set_result(self._outputs)
            finally:
                _set_stream(*prev)
        else:
            fut = torch.futures.Future(devices=[torch.device("cuda", idx)])
            with torch.cuda.stream(self._call_stream()):
                fut.set_result(self._outputs)
        self._future = fut
        return fut


_CFuture = torch._C.Future
_NO_DEVICES: list = []
# torch's current CUDA stream of a device as (stream id, device index, device type), and the
# setter taking the same: the C functions behind `torch.cuda.current_stream`/`set_stream`.
_get_stream = getattr(torch._C, "_cuda_getCurrentStream", _no_cuda)
_set_stream = getattr(torch._C, "_cuda_setStream", _no_cuda)
_DEVICE_LISTS: dict = {}


def _cuda_devices(idx: int) -> list:
    """``[torch.device("cuda", idx)]``, made once per device (a CUDA future's devices)."""
    d = _DEVICE_LISTS.get(idx)
    if d is None:
        d = _DEVICE_LISTS[idx] = [torch.device("cuda", idx)]
    return d


class _Failure:
    """A failed call's error, as the value of a future's source (see `_pending`)."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException):
        self.error = error


def _follow(source):
    v = source.value()
    if type(v) is _Failure:
        raise v.error
    return v


def _pending():
    """``(source, future)``: torch's C++ future ``future`` completes when ``source`` is given a
    result: that value, or, for a :class:`_Failure`, the failure as the C++ future's error (a
    ``RuntimeError`` quoting ferrocx's). The error lives in the C++ future, so it reaches every
    consumer, C++ (DDP's reducer, the native backend) or Python: torch's ``set_exception`` keeps
    it in the Python wrapper alone, and a future handed through C++ comes back to Python as a
    fresh wrapper that would return the exception as its value."""
    source = _CFuture(_NO_DEVICES)
    return source, source.then(_follow)


def _completed(value, error: Optional[BaseException]) -> "torch.futures.Future":
    """A future completed with ``value`` (torch's C++ future, as torch's backends return: a CPU
    future, no device events), or failed with ``error`` (see `_pending`)."""
    if error is not None:
        source, fut = _pending()
        source.set_result(_Failure(error))
        return fut
    fut = _CFuture(_NO_DEVICES)
    fut.set_result(value)
    return fut


def _work(pg, outputs, pending: bool = False, post=None, stream=None) -> _Work:
    """The work of a call over ``outputs``: on CUDA stream ``stream`` (device index, raw
    stream), else pending on the host device's stream (``post`` runs once it completes), else
    completed (``post`` runs now)."""
    if stream is not None:
        w = _StreamWork()
        w._idx, w._raw = stream
    else:
        w = _Work()
    w._pg = pg
    w._outputs = outputs
    if pending:
        w._done = False
        w._post = post
    elif post is not None:
        post()
    return w


class ProcessGroupFerrocx(dist.ProcessGroup):
    """A ``torch.distributed`` process group over a ferrocx communicator (see the module docs)."""

    def __init__(self, store, rank: int, size: int, timeout: timedelta):
        super().__init__(rank, size)
        self._rank = rank
        self._size = size
        if os.environ.get(_LAUNCH_PORT):
            # Under `ferrocx launch`: the launcher's store, which it hosts.
            env = {"MASTER_PORT": os.environ[_LAUNCH_PORT], "FERROCX_STORE_HOSTED": "1"}
        else:
            # Under torchrun (or any env:// rendezvous): rank 0 of the group hosts ferrocx's
            # store on a port the ranks agree on through torch's store.
            if rank == 0:
                store.set("ferrocx/master_port", str(_free_port()))
            port = store.get("ferrocx/master_port").decode()
            env = {"MASTER_PORT": port, "FERROCX_STORE_HOSTED": None, "FERROCX_JOB_ID": None}
        env.update(RANK=str(rank), WORLD_SIZE=str(size))
        if str(size) != os.environ.get("WORLD_SIZE"):
            # A subgroup: its ranks are numbered from 0 (on one host, as the local ones; the
            # configuration's rank sets and the device choice then follow the group's ranks).
            env.update(LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(size))
        self._comm = _with_env(env, _fx.Communicator.from_env)
        self._cuda = self._comm.device == "cuda"
        self._streams: dict = {}
        # Device index -> (torch stream, raw stream, ferrocx handle): the communication streams.
        self._comm_streams: dict = {}
        self._group: Optional[List] = None
        self._name = ""
        self._desc = ""
        self._batch: list = []
        # The native backend taking all_reduce (a `_NativeProcessGroupFerrocx`), else None.
        self._native = None

    # -- identity -------------------------------------------------------------------------
    def getBackendName(self) -> str:  # noqa: N802 - torch's name
        return BACKEND

    def _get_backend_name(self) -> str:
        return BACKEND

    def name(self) -> str:
        return BACKEND

    def size(self) -> int:
        return self._size

    # The group's name and description: torch keeps them in a group's C++ backends, and this
    # group has none, so it keeps them itself (functional collectives find groups by name).
    def _set_group_name(self, name: str) -> None:
        self._name = name

    def setGroupName(self, name: str) -> None:  # noqa: N802 - torch's name
        self._name = name

    def getGroupName(self) -> str:  # noqa: N802 - torch's name
        return self._name

    @property
    def group_name(self) -> str:
        return self._name

    def _set_group_desc(self, desc: str) -> None:
        self._desc = desc

    def setGroupDesc(self, desc: str) -> None:  # noqa: N802 - torch's name
        self._desc = desc

    def getGroupDesc(self) -> str:  # noqa: N802 - torch's name
        return self._desc

    @property
    def group_desc(self) -> str:
        return self._desc

    def rank(self) -> int:
        return self._rank

    @property
    def comm(self) -> "_fx.Communicator":
        """The ferrocx communicator under this group."""
        return self._comm

    def __repr__(self) -> str:
        return f"ProcessGroupFerrocx(rank={self._rank}, size={self._size}, {self._comm!r})"

    # batch_isend_irecv asks the backend of the device whether it coalesces: this group does.
    supports_coalescing = True
    # new_group asks it whether it splits (when the default group is bound to a device): no,
    # every group makes its own communicator.
    supports_splitting = False

    def _get_backend(self, device=None):
        return self

    def start_coalescing(self, device=None) -> None:
        self._comm.group_start()
        self._group = []
        if self._native is not None:
            self._native.set_grouped(True)

    def end_coalescing(self, device=None):
        works, self._group = self._group or [], None
        if self._native is not None:
            self._native.set_grouped(False)
        batch, self._batch = self._batch, []
        self._comm.group_end()
        if batch:
            return self._batch_as_all_to_allv(batch)
        return self._issue([], lambda s: None, stream_of=works)

    def _batch_as_all_to_allv(self, batch):
        """The sends and receives of a batch in a job across clusters, as one all-to-all with
        per-peer byte counts: the bridge moves every channel at once, where calls issued one
        after another (a receive before the send its peer waits for) would deadlock. Every
        rank of the group takes part, as in a batch that is the group's first call."""
        w = self._size
        dev = batch[0][1].device
        sends: List[list] = [[] for _ in range(w)]
        recvs: List[list] = [[] for _ in range(w)]
        for is_send, c, peer, back in batch:
            (sends if is_send else recvs)[peer].append((c, back))

        def u8(t):
            return t.reshape(-1).view(torch.uint8)

        sc = [sum(u8(c).numel() for c, _ in sends[p]) for p in range(w)]
        rc = [sum(u8(c).numel() for c, _ in recvs[p]) for p in range(w)]
        sd = [sum(sc[:p]) for p in range(w)]
        rd = [sum(rc[:p]) for p in range(w)]
        parts = [u8(c) for p in range(w) for c, _ in sends[p]]
        sbuf = torch.cat(parts) if parts else torch.empty(1, dtype=torch.uint8, device=dev)
        rbuf = torch.empty(max(sum(rc), 1), dtype=torch.uint8, device=dev)
        comm = self._comm

        def enq(s, remap=None):
            comm.all_to_allv(self._addr(sbuf, remap), sc, sd, self._addr(rbuf, remap), rc, rd, _fx.U8, s)

        def post():
            off = 0
            for p in range(w):
                for c, back in recvs[p]:
                    n = u8(c).numel()
                    u8(c).copy_(rbuf[off : off + n])
                    off += n
                    if back is not None:
                        back()

        outs = [c for p in range(w) for c, _ in recvs[p]]
        return self._issue([sbuf, rbuf], enq, outputs=outs, post=post)

    _start_coalescing = start_coalescing
    _end_coalescing = end_coalescing

    # -- issuing --------------------------------------------------------------------------
    def _cuda_stream(self, device: torch.device):
        """torch's current stream on `device` as (device index, raw stream), and its ferrocx
        handle (wrapped once per stream)."""
        idx = device.index if device.index is not None else torch.cuda.current_device()
        raw = _raw_stream(idx)
        h = self._streams.get(raw)
        if h is None:
            h = self._comm.wrap_stream(raw)
            self._streams[raw] = h
        return (idx, raw), h

    def _issue(self, tensors: List[torch.Tensor], enqueue: Callable, outputs=None, post=None, stream_of=None):
        """Runs ``enqueue(stream)`` over ``tensors`` (their addresses must stay valid until the
        work completes) and returns its Work; ``post`` runs once the call has completed (at
        once on CUDA, where it is stream-ordered after it)."""
        outputs = tensors if outputs is None else outputs
        work = self._issue_work(tensors, enqueue, outputs, post, stream_of)
        # The buffers stay alive until the work has completed (ferrocx reads and writes them
        # then): temporaries such as a concatenated input have no other owner.
        work._keep = tensors or stream_of
        if self._group is not None:
            self._group.extend(tensors)
        return work

    def _issue_work(self, tensors, enqueue, outputs, post, stream_of):
        if not tensors and stream_of is not None:
            # The end of a coalesced group: done when its last call is.
            if self._cuda:
                return _work(self, outputs, stream=self._cuda_stream(torch.device("cuda"))[0])
            return _work(self, outputs, pending=True, post=post)
        on_cuda = tensors[0].is_cuda
        if len(tensors) > 1 and any(t.is_cuda != on_cuda for t in tensors):
            raise Error("ferrocx: a call takes tensors of one device type (some are CUDA, some CPU)")
        if on_cuda:
            if not self._cuda:
                raise Error(
                    f"ferrocx: CUDA tensors on rank {self._rank}, whose cluster {self._comm.cluster!r} "
                    f"runs the {self._comm.device!r} device (CPU tensors only)"
                )
            stream, handle = self._cuda_stream(tensors[0].device)
            enqueue(handle)
            if self._group is not None:
                return _work(self, outputs, stream=stream)
            return _work(self, outputs, post=post, stream=stream)
        if self._cuda:
            return self._issue_staged(tensors, enqueue, outputs, post)
        enqueue(None)
        if self._group is not None:
            return _work(self, outputs)
        return _work(self, outputs, pending=True, post=post)

    def _issue_staged(self, tensors, enqueue, outputs, post):
        """CPU tensors on a CUDA rank: through device copies, synchronously."""
        dev = torch.device("cuda", torch.cuda.current_device())
        staged = [t.to(dev) for t in tensors]
        ptrs = {t.data_ptr(): s.data_ptr() for t, s in zip(tensors, staged)}
        _, handle = self._cuda_stream(dev)
        enqueue(handle, remap=ptrs)
        for t, s in zip(tensors, staged):
            t.copy_(s)
        torch.cuda.current_stream(dev).synchronize()
        return _work(self, outputs, post=post)

    @staticmethod
    def _contig(t: torch.Tensor):
        """``t`` if contiguous, else a contiguous copy and the copy-back."""
        if t.is_contiguous():
            return t, None
        c = t.contiguous()
        return c, (lambda: t.copy_(c))

    @staticmethod
    def _chain(*fns):
        fns = [f for f in fns if f is not None]
        if not fns:
            return None

        def run():
            for f in fns:
                f()

        return run

    def _one(self, tensor_list, what: str) -> torch.Tensor:
        if len(tensor_list) != 1:
            raise Error(f"ferrocx: {what} takes one tensor per call, got {len(tensor_list)}")
        return tensor_list[0]

    @staticmethod
    def _addr(t: torch.Tensor, remap) -> int:
        p = t.data_ptr()
        return remap.get(p, p) if remap else p

    def _go(self, call, args, dev: int, outputs, opts, keep=None):
        """The short path of the common call (contiguous tensors of a dtype ferrocx takes, on
        this rank's device, outside a coalesced group): enqueues ``call(*args, stream)`` for
        tensors on CUDA device ``dev`` (-1: the host) and returns its Work.

        A caller that waits at once (``opts.asyncOp`` false: torch's functions without
        ``async_op``) gets None, as from torch's own NCCL backend: the call is then on torch's
        current stream (CUDA), or has completed (the host device, waited for here), and there
        is nothing left to wait for. ``_GENERAL`` where the tensors are not on this rank's
        device: the general path then stages or refuses them. ``keep``: another tensor the
        call reads, kept alive until the call has completed."""
        if dev >= 0:
            if not self._cuda:
                return _GENERAL
            raw = _raw_stream(dev)
            h = self._streams.get(raw)
            if h is None:
                h = self._streams[raw] = self._comm.wrap_stream(raw)
            call(*args, h)
            if opts is not None and _ASYNC_OPT and opts.asyncOp is False:
                return None
            w = _StreamWork()
            w._idx = dev
            w._raw = raw
        elif self._cuda:
            return _GENERAL
        else:
            call(*args, None)
            if opts is not None and _ASYNC_OPT and opts.asyncOp is False:
                self._comm.synchronize()
                return None
            w = _Work()
            w._pg = self
            w._done = False
        w._outputs = outputs
        if keep is not None:
            w._keep = keep
        return w

    # -- collectives ----------------------------------------------------------------------
    def allreduce(self, tensors, opts=None):
        if type(tensors) is list and len(tensors) == 1 and self._group is None:
            t = tensors[0]
            dt = t.dtype
            d = _DTYPE_IDS.get(id(dt))
            if d is not None and t.is_contiguous():
                op = opts.reduceOp if opts is not None else _SUM
                o = _fx.SUM if op == _SUM and dt is not _BOOL else _redop(op, dt)
                p = t.data_ptr()
                dev = t.get_device()
                if dev >= 0 and self._cuda:
                    # `_go`'s CUDA branch written out: the call DDP and training loops make most.
                    waits = opts is not None and _ASYNC_OPT and opts.asyncOp is False
                    if _COMM_STREAM and not waits:
                        return self._allreduce_comm_stream(t, p, d, o, dev, tensors)
                    raw = _raw_stream(dev)
                    h = self._streams.get(raw)
                    if h is None:
                        h = self._streams[raw] = self._comm.wrap_stream(raw)
                    self._comm.all_reduce(p, p, t.numel(), d, o, h)
                    if waits:
                        return None
                    w = _StreamWork()
                    w._idx = dev
                    w._raw = raw
                    w._outputs = tensors
                    return w
                if dev < 0 and not self._cuda:
                    # `_go`'s host branch written out: DDP's buckets on CPU ranks.
                    self._comm.all_reduce(p, p, t.numel(), d, o, None)
                    if opts is not None and _ASYNC_OPT and opts.asyncOp is False:
                        self._comm.synchronize()
                        return None
                    w = _Work()
                    w._pg = self
                    w._done = False
                    w._outputs = tensors
                    return w
        if isinstance(tensors, torch.Tensor):
            tensors = [tensors]
        op = opts.reduceOp if opts is not None else _R.SUM
        return self._allreduce(self._one(tensors, "allreduce"), op)

    def _allreduce_comm_stream(self, t, p, d, o, dev, tensors):
        """An all_reduce of CUDA tensor ``t`` (address ``p``) whose caller waits later, on the
        group's communication stream of device ``dev``, after the work enqueued so far on the
        current stream (as torch's NCCL backend runs it): the caller's stream goes on with its
        own work (DDP's backward pass) while it runs. The tensor's memory is marked in use on
        that stream for torch's allocator; ``wait()`` orders the current stream after it."""
        cs = self._comm_streams.get(dev)
        if cs is None:
            st = torch.cuda.Stream(device=dev)
            cs = self._comm_streams[dev] = (
                st,
                st.cuda_stream,
                self._comm.wrap_stream(st.cuda_stream),
                (st.stream_id, st.device_index, st.device_type),
            )
        st, raw, h, sid = cs
        # The communication stream after the current one: one event of the communicator's,
        # recorded and waited for in Rust (torch's `wait_stream` makes Python event and
        # stream objects: about 10 us more a call from DDP's autograd thread).
        self._comm.order(self._handle(_raw_stream(dev)), h)
        self._comm.all_reduce(p, p, t.numel(), d, o, h)
        t.record_stream(st)
        w = _StreamWork()
        w._pg = self
        w._idx = dev
        w._raw = raw
        w._stream = st
        w._sid = sid
        w._outputs = tensors
        return w

    def _set_comm_stream(self, on: bool) -> None:
        """Turns the communication stream on or off for this process's groups from now on
        (``FERROCX_TORCH_COMM_STREAM`` sets it at import; tests switch it)."""
        global _COMM_STREAM
        _COMM_STREAM = bool(on)

    def _comm_stream_of(self, dev: int):
        """The torch stream of this group's communication stream on device ``dev``, once a
        call has made it, else None."""
        cs = self._comm_streams.get(dev)
        return cs[0] if cs is not None else None

    def _handle(self, raw: int) -> int:
        """The device adaptor's handle of the raw CUDA stream ``raw`` (wrapped once)."""
        h = self._streams.get(raw)
        if h is None:
            h = self._streams[raw] = self._comm.wrap_stream(raw)
        return h

    def _allreduce(self, t: torch.Tensor, op):
        d, o = _dtype(t), _redop(op, t.dtype)
        c, back = self._contig(t)
        comm, n = self._comm, c.numel()

        def enq(s, remap=None):
            a = self._addr(c, remap)
            comm.all_reduce(a, a, n, d, o, s)

        return self._issue([c], enq, outputs=[t], post=back)

    def allreduce_coalesced(self, tensors, opts=None):
        op = opts.reduceOp if opts is not None else _R.SUM
        works = [self._allreduce(t, op) for t in tensors]
        for w in works[:-1]:
            w.wait()
        return works[-1] if works else self._issue([], lambda s: None, stream_of=[])

    def broadcast(self, tensors, opts=None):
        if type(tensors) is list and len(tensors) == 1 and self._group is None:
            t = tensors[0]
            d = _DTYPE_IDS.get(id(t.dtype))
            if d is not None and t.is_contiguous():
                root = opts.rootRank if opts is not None else 0
                p = t.data_ptr()
                w = self._go(self._comm.broadcast, (p, p, t.numel(), d, root), t.get_device(), tensors, opts)
                if w is not _GENERAL:
                    return w
        if isinstance(tensors, torch.Tensor):
            tensors = [tensors]
        root = opts.rootRank if opts is not None else 0
        t = self._one(tensors, "broadcast")
        d = _dtype(t)
        c, back = self._contig(t)
        comm, n = self._comm, c.numel()

        def enq(s, remap=None):
            a = self._addr(c, remap)
            comm.broadcast(a, a, n, d, root, s)

        return self._issue([c], enq, outputs=[t], post=back)

    def reduce(self, tensors, opts=None):
        if isinstance(tensors, torch.Tensor):
            tensors = [tensors]
        root = opts.rootRank if opts is not None else 0
        op = opts.reduceOp if opts is not None else _R.SUM
        t = self._one(tensors, "reduce")
        d, o = _dtype(t), _redop(op, t.dtype)
        c, back = self._contig(t)
        comm, n = self._comm, c.numel()

        def enq(s, remap=None):
            a = self._addr(c, remap)
            comm.reduce(a, a, n, d, o, root, s)

        return self._issue([c], enq, outputs=[t], post=back if self._rank == root else None)

    def _gather_into(self, out: torch.Tensor, inp: torch.Tensor, outputs, post=None):
        if out.dtype != inp.dtype:
            raise Error(f"ferrocx: all_gather output is {out.dtype}, input {inp.dtype}")
        if out.numel() != inp.numel() * self._size:
            raise Error(
                f"ferrocx: all_gather output holds {out.numel()} elements, not {self._size} x {inp.numel()}"
            )
        d = _dtype(inp)
        ci, _ = self._contig(inp)
        co, back = self._contig(out)
        comm, n = self._comm, ci.numel()

        def enq(s, remap=None):
            comm.all_gather(self._addr(ci, remap), self._addr(co, remap), n, d, s)

        return self._issue([ci, co], enq, outputs=outputs, post=self._chain(back, post))

    def allgather(self, output_tensors, input_tensors, opts=None):
        inp = self._one(input_tensors, "allgather")
        outs = self._one(output_tensors, "allgather")
        if len(outs) != self._size:
            raise Error(f"ferrocx: all_gather takes {self._size} output tensors, got {len(outs)}")
        for o in outs:
            if o.numel() != inp.numel() or o.dtype != inp.dtype:
                raise Error(
                    f"ferrocx: all_gather outputs must match the input ({inp.numel()} x {inp.dtype}), "
                    f"got {o.numel()} x {o.dtype}"
                )
        flat = torch.empty((self._size * inp.numel(),), dtype=inp.dtype, device=inp.device)

        def post():
            for i, o in enumerate(outs):
                o.copy_(flat[i * inp.numel() : (i + 1) * inp.numel()].view_as(o))

        return self._gather_into(flat, inp, [outs], post)

    def all_gather_single(self, output, input, opts=None):
        if self._group is None:
            dt = input.dtype
            d = _DTYPE_IDS.get(id(dt))
            n = input.numel()
            if (
                d is not None
                and output.dtype is dt
                and output.numel() == n * self._size
                and input.is_contiguous()
                and output.is_contiguous()
            ):
                dev = input.get_device()
                if output.get_device() == dev:
                    args = (input.data_ptr(), output.data_ptr(), n, d)
                    w = self._go(self._comm.all_gather, args, dev, [output], opts, keep=input)
                    if w is not _GENERAL:
                        return w
        return self._gather_into(output, input, [output])

    _allgather_base = all_gather_single

    def all_gather_single_coalesced(self, outputs, inputs, opts=None):
        works = [self.all_gather_single(o, i) for o, i in zip(outputs, inputs)]
        for w in works[:-1]:
            w.wait()
        return works[-1]

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def allgather_coalesced(self, output_lists, input_list, opts=None):
        works = [self.allgather([o], [i]) for o, i in zip(output_lists, input_list)]
        for w in works[:-1]:
            w.wait()
        return works[-1]

    def _reduce_scatter_from(self, out: torch.Tensor, inp: torch.Tensor, op, outputs, pre_stage=None):
        if out.dtype != inp.dtype:
            raise Error(f"ferrocx: reduce_scatter output is {out.dtype}, input {inp.dtype}")
        if inp.numel() != out.numel() * self._size:
            raise Error(
                f"ferrocx: reduce_scatter input holds {inp.numel()} elements, not {self._size} x {out.numel()}"
            )
        d, o = _dtype(out), _redop(op, out.dtype)
        ci, _ = self._contig(inp)
        co, back = self._contig(out)
        comm, n = self._comm, co.numel()

        def enq(s, remap=None):
            comm.reduce_scatter(self._addr(ci, remap), self._addr(co, remap), n, d, o, s)

        return self._issue([ci, co], enq, outputs=outputs, post=back)

    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
        op = opts.reduceOp if opts is not None else _R.SUM
        out = self._one(output_tensors, "reduce_scatter")
        ins = self._one(input_tensors, "reduce_scatter")
        if len(ins) != self._size:
            raise Error(f"ferrocx: reduce_scatter takes {self._size} input tensors, got {len(ins)}")
        for i in ins:
            if i.numel() != out.numel() or i.dtype != out.dtype:
                raise Error(
                    f"ferrocx: reduce_scatter inputs must match the output ({out.numel()} x {out.dtype}), "
                    f"got {i.numel()} x {i.dtype}"
                )
        flat = torch.cat([i.reshape(-1) for i in ins])
        return self._reduce_scatter_from(out, flat, op, [out])

    def reduce_scatter_single(self, output, input, opts=None):
        if self._group is None:
            dt = output.dtype
            d = _DTYPE_IDS.get(id(dt))
            n = output.numel()
            if (
                d is not None
                and input.dtype is dt
                and input.numel() == n * self._size
                and input.is_contiguous()
                and output.is_contiguous()
            ):
                dev = output.get_device()
                if input.get_device() == dev:
                    op = opts.reduceOp if opts is not None else _SUM
                    o = _fx.SUM if op == _SUM and dt is not _BOOL else _redop(op, dt)
                    args = (input.data_ptr(), output.data_ptr(), n, d, o)
                    w = self._go(self._comm.reduce_scatter, args, dev, [output], opts, keep=input)
                    if w is not _GENERAL:
                        return w
        op = opts.reduceOp if opts is not None else _R.SUM
        return self._reduce_scatter_from(output, input, op, [output])

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None):
        # The reduce op alone: each call returns its Work, whatever the caller's asyncOp.
        each = dist.ReduceScatterOptions()
        if opts is not None:
            each.reduceOp = opts.reduceOp
        works = [self.reduce_scatter_single(o, i, each) for o, i in zip(outputs, inputs)]
        for w in works[:-1]:
            w.wait()
        return works[-1]

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        if output.dtype != input.dtype:
            raise Error(f"ferrocx: all_to_all output is {output.dtype}, input {input.dtype}")
        d = _dtype(input)
        w = self._size
        ci, _ = self._contig(input)
        co, back = self._contig(output)
        if not output_split_sizes and not input_split_sizes:
            if ci.numel() % w or co.numel() != ci.numel():
                raise Error(
                    f"ferrocx: all_to_all_single without splits needs equal input and output sizes "
                    f"divisible by {w}, got {ci.numel()} and {co.numel()}"
                )
            n = ci.numel() // w
            comm = self._comm

            def enq(s, remap=None):
                comm.all_to_all(self._addr(ci, remap), self._addr(co, remap), n, d, s)

            return self._issue([ci, co], enq, outputs=[output], post=back)
        row_in = ci.numel() // max(ci.shape[0], 1) if ci.dim() else 1
        row_out = co.numel() // max(co.shape[0], 1) if co.dim() else 1

        def counts(splits, rows, total, what):
            if not splits:
                if total % w:
                    raise Error(f"ferrocx: all_to_all_single {what} of {total} rows does not split in {w}")
                splits = [total // w] * w
            if len(splits) != w:
                raise Error(f"ferrocx: all_to_all_single takes {w} {what} split sizes, got {len(splits)}")
            if sum(splits) != total:
                raise Error(f"ferrocx: all_to_all_single {what} splits sum to {sum(splits)}, not {total} rows")
            c = [int(s) * rows for s in splits]
            disp = [sum(c[:i]) for i in range(w)]
            return c, disp

        sc, sd = counts(list(input_split_sizes), row_in, ci.shape[0] if ci.dim() else ci.numel(), "input")
        rc, rd = counts(list(output_split_sizes), row_out, co.shape[0] if co.dim() else co.numel(), "output")
        comm = self._comm

        def enqv(s, remap=None):
            comm.all_to_allv(self._addr(ci, remap), sc, sd, self._addr(co, remap), rc, rd, d, s)

        return self._issue([ci, co], enqv, outputs=[output], post=back)

    alltoall_base = all_to_all_single

    def alltoall(self, output_tensors, input_tensors, opts=None):
        if len(input_tensors) != self._size or len(output_tensors) != self._size:
            raise Error(f"ferrocx: all_to_all takes {self._size} input and output tensors")
        inp = torch.cat([t.reshape(-1) for t in input_tensors])
        out = torch.empty((sum(t.numel() for t in output_tensors),), dtype=inp.dtype, device=inp.device)
        sizes_in = [t.numel() for t in input_tensors]
        sizes_out = [t.numel() for t in output_tensors]
        work = self.all_to_all_single(out, inp, sizes_out, sizes_in)
        inner = work._post

        def post():
            if inner is not None:
                inner()
            off = 0
            for t in output_tensors:
                t.copy_(out[off : off + t.numel()].view_as(t))
                off += t.numel()

        if work._done:
            post()
        else:
            work._post = post
        work._outputs = output_tensors
        return work

    def barrier(self, opts=None):
        if self._cuda:
            dev = torch.device("cuda", torch.cuda.current_device())
            _, handle = self._cuda_stream(dev)
            self._comm.barrier(handle)
            torch.cuda.current_stream(dev).synchronize()
            return _work(self, [])
        self._comm.barrier(None)
        return _work(self, [], pending=True)

    def gather(self, output_tensors, input_tensors, opts=None):
        root = opts.rootRank if opts is not None else 0
        inp = self._one(input_tensors, "gather")
        d = _dtype(inp)
        n = inp.numel()
        ci, _ = self._contig(inp)
        outs = output_tensors[0] if self._rank == root else []
        if self._rank == root:
            if len(outs) != self._size:
                raise Error(f"ferrocx: gather takes {self._size} output tensors on the root, got {len(outs)}")
            for o in outs:
                if o.numel() != n or o.dtype != inp.dtype:
                    raise Error(
                        f"ferrocx: gather outputs must match the input ({n} x {inp.dtype}), got {o.numel()} x {o.dtype}"
                    )
        flat = torch.empty((self._size * n if self._rank == root else 1,), dtype=inp.dtype, device=inp.device)
        comm = self._comm

        def enq(s, remap=None):
            comm.gather(self._addr(ci, remap), self._addr(flat, remap), n, d, root, s)

        def post():
            for i, o in enumerate(outs):
                o.copy_(flat[i * n : (i + 1) * n].view_as(o))

        return self._issue([ci, flat], enq, outputs=[outs], post=post)

    def scatter(self, output_tensors, input_tensors, opts=None):
        root = opts.rootRank if opts is not None else 0
        out = self._one(output_tensors, "scatter")
        d = _dtype(out)
        n = out.numel()
        if self._rank == root:
            ins = input_tensors[0]
            if len(ins) != self._size:
                raise Error(f"ferrocx: scatter takes {self._size} input tensors on the root, got {len(ins)}")
            for i in ins:
                if i.numel() != n or i.dtype != out.dtype:
                    raise Error(
                        f"ferrocx: scatter inputs must match the output ({n} x {out.dtype}), got {i.numel()} x {i.dtype}"
                    )
            flat = torch.cat([i.reshape(-1) for i in ins])
        else:
            flat = torch.empty((1,), dtype=out.dtype, device=out.device)
        co, back = self._contig(out)
        comm = self._comm

        def enq(s, remap=None):
            comm.scatter(self._addr(flat, remap), self._addr(co, remap), n, d, root, s)

        return self._issue([flat, co], enq, outputs=[out], post=back)

    # -- point to point -------------------------------------------------------------------
    def _p2p(self, tensors, peer: int, send: bool):
        t = self._one(tensors, "send" if send else "recv")
        d = _dtype(t)
        if not 0 <= peer < self._size or peer == self._rank:
            raise Error(f"ferrocx: rank {self._rank} cannot {'send to' if send else 'receive from'} rank {peer} of {self._size}")
        c, back = self._contig(t)
        if self._group is not None and self._comm.spans_clusters:
            self._batch.append((send, c, peer, back))
            return _work(self, [t])
        comm, n = self._comm, c.numel()

        def enq(s, remap=None):
            a = self._addr(c, remap)
            if send:
                comm.send(a, n, d, peer, s)
            else:
                comm.recv(a, n, d, peer, s)

        return self._issue([c], enq, outputs=[t], post=None if send else back)

    def send(self, tensors, dst: int, tag: int = 0):
        if (
            type(tensors) is list
            and len(tensors) == 1
            and self._group is None
            and dst != self._rank
            and 0 <= dst < self._size
        ):
            t = tensors[0]
            d = _DTYPE_IDS.get(id(t.dtype))
            if d is not None and t.is_contiguous():
                w = self._go(self._comm.send, (t.data_ptr(), t.numel(), d, dst), t.get_device(), tensors, None)
                if w is not _GENERAL:
                    return w
        return self._p2p(tensors, dst, True)

    def recv(self, tensors, src: int, tag: int = 0):
        if (
            type(tensors) is list
            and len(tensors) == 1
            and self._group is None
            and src != self._rank
            and 0 <= src < self._size
        ):
            t = tensors[0]
            d = _DTYPE_IDS.get(id(t.dtype))
            if d is not None and t.is_contiguous():
                w = self._go(self._comm.recv, (t.data_ptr(), t.numel(), d, src), t.get_device(), tensors, None)
                if w is not _GENERAL:
                    return w
        return self._p2p(tensors, src, False)

    def recv_anysource(self, tensors, tag: int = 0):
        raise Error("ferrocx: receives from any source are not supported; name the source rank")

    recvAnysource = recv_anysource  # noqa: N815 - torch's name


def _raw_of(stream_id: int, device_index: int, device_type: int) -> int:
    """The native handle of torch's stream (id, device index, device type)."""
    return torch.cuda.Stream(stream_id=stream_id, device_index=device_index, device_type=device_type).cuda_stream


class _NativeProcessGroupFerrocx(ProcessGroupFerrocx):
    """The process group with the native backend (``ferrocx._native``) registered for the
    ``cpu`` and ``cuda`` devices: ``allreduce`` is torch's own, which reaches the native
    backend through torch's dispatcher with no Python (DDP's reducer calls it once per bucket
    from its autograd thread); the backend takes the common call and hands the others to
    ``_allreduce_py``, this class's Python ``allreduce``. Every other call is Python's."""

    # torch's method itself (the class dict's entry, which binds as a method).
    allreduce = dist.ProcessGroup.__dict__["allreduce"]
    _allreduce_py = ProcessGroupFerrocx.allreduce

    def __init__(self, store, rank: int, size: int, timeout: timedelta, native):
        super().__init__(store, rank, size, timeout)
        dtypes = [(torch.empty(0, dtype=k), v) for k, v in _DTYPES.items() if k is not torch.bool]
        ops = {int(t): f for t, f in _REDOPS}
        backend = native.Backend(
            rank,
            size,
            self,
            self._comm,
            self._comm.c_entries(),
            dtypes,
            ops,
            self._cuda,
            _COMM_STREAM_ENV != "0",
            Error,
            _raw_of,
        )
        for dev in ("cpu", "cuda"):
            self._register_backend(torch.device(dev), dist.ProcessGroup.BackendType.CUSTOM, backend)
        self._set_default_backend(dist.ProcessGroup.BackendType.CUSTOM)
        self._native = backend

    def _set_comm_stream(self, on: bool) -> None:
        super()._set_comm_stream(on)
        self._native.set_comm_stream(bool(on))

    def _comm_stream_of(self, dev: int):
        sid = self._native.comm_stream_of(dev)
        if sid is None:
            return None
        return torch.cuda.Stream(stream_id=sid[0], device_index=sid[1], device_type=sid[2])


def _create(store, rank: int, size: int, timeout: timedelta) -> ProcessGroupFerrocx:
    native = _native.module()
    if native is not None:
        return _NativeProcessGroupFerrocx(store, rank, size, timeout, native)
    return ProcessGroupFerrocx(store, rank, size, timeout)


def _register() -> None:
    if "ferrocx" in dist.Backend.backend_list:
        return
    _move_torch_off_launcher_store()
    dist.Backend.register_backend(BACKEND, _create, devices=["cpu", "cuda"])


_register()
