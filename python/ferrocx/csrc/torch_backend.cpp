// The native side of ferrocx's torch.distributed backend (see ferrocx/_native.py).
//
// A c10d::Backend registered on the Python process group for the cpu and cuda devices, so that
// `ProcessGroup::allreduce` reaches it through torch's dispatcher with no Python in between:
// the call DDP's reducer makes for every gradient bucket, from its autograd thread. It takes
// the common call itself, one dense contiguous tensor of a dtype and reduce op ferrocx has,
// outside a coalesced group:
//   - on a CUDA rank, enqueued on torch's current stream (or, with the communication stream on
//     and a caller that waits later, on a stream of the group ordered after the current one,
//     as torch's NCCL backend does), through the communicator's C entries;
//   - on a host rank, a call whose caller waits at once (enqueued, then waited for).
// Every other call (other dtypes and ops, several tensors, CPU tensors on a CUDA rank, a host
// call waited for later, calls inside a coalesced group) goes to the Python process group's
// own all_reduce, with the interpreter's lock, and its Work is held here.
//
// The Works of the native calls: `wait()` orders the then current stream after the call's
// stream (nothing to wait for on the host: the call is enqueued in stream order);
// `getFuture()` is completed at once for a call on the caller's still current stream (its
// value is ready in stream order) and is a CUDA future marked on the call's stream otherwise,
// as the Python Works do.

#include <torch/extension.h>

#include <ATen/core/ivalue.h>
#include <c10/core/Event.h>
#include <c10/core/Stream.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace py = pybind11;

// torch's version (ferrocx/_native.py passes it): `AllreduceOptions::asyncOp` and
// `c10::Stream::native_handle` are used from 2.8 on.
#ifndef FX_TORCH_MAJOR
#define FX_TORCH_MAJOR 0
#define FX_TORCH_MINOR 0
#endif
#define FX_TORCH_AT_LEAST(major, minor) \
  (FX_TORCH_MAJOR > (major) || (FX_TORCH_MAJOR == (major) && FX_TORCH_MINOR >= (minor)))

namespace {

// The communicator's C entries (ferrocx._ferrocx.Communicator.c_entries), version 2.
constexpr uint32_t kEntriesVersion = 2;
// The all_reduce entry's `stream` for the communicator's own stream (0 is CUDA's default
// stream, a caller's stream like any other).
constexpr uint64_t kOwnStream = UINT64_MAX;
using AllReduceFn = int32_t (*)(const void* comm, uint64_t send, uint64_t recv, uint64_t count,
                                uint32_t dtype, uint32_t op, uint64_t stream, char* err,
                                uint64_t err_len);
using WrapStreamFn = int32_t (*)(const void* comm, uint64_t native, uint64_t* out, char* err,
                                 uint64_t err_len);
using SynchronizeFn = int32_t (*)(const void* comm, char* err, uint64_t err_len);

// A Work of the Python process group, kept with its Python object (its methods are Python's).
class HeldWork : public c10d::Work {
 public:
  HeldWork(py::object obj, c10::intrusive_ptr<c10d::Work> inner)
      : obj_(std::move(obj)), inner_(std::move(inner)) {}

  ~HeldWork() override {
    if (Py_IsInitialized()) {
      py::gil_scoped_acquire gil;
      inner_.reset();
      obj_ = py::object();
    } else {
      // The interpreter is gone: its objects with it.
      obj_.release();
      inner_.release();
    }
  }

  // torch's trampoline forwards wait() and getFuture() to Python; the rest is asked here.
  bool wait(std::chrono::milliseconds timeout) override { return inner_->wait(timeout); }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return inner_->getFuture(); }

  bool isCompleted() override {
    py::gil_scoped_acquire gil;
    return obj_.attr("is_completed")().cast<bool>();
  }
  bool isSuccess() const override {
    py::gil_scoped_acquire gil;
    return obj_.attr("is_success")().cast<bool>();
  }
  std::exception_ptr exception() const override {
    py::gil_scoped_acquire gil;
    py::object e = obj_.attr("exception")();
    if (e.is_none()) {
      return nullptr;
    }
    return std::make_exception_ptr(std::runtime_error(py::str(e).cast<std::string>()));
  }
  std::vector<at::Tensor> result() override {
    py::gil_scoped_acquire gil;
    return obj_.attr("result")().cast<std::vector<at::Tensor>>();
  }
  void synchronize() override {
    py::gil_scoped_acquire gil;
    obj_.attr("synchronize")();
  }

 private:
  py::object obj_;
  c10::intrusive_ptr<c10d::Work> inner_;
};

// A native call's Work (see the file's comment).
class StreamWork : public c10d::Work {
 public:
  StreamWork(std::vector<at::Tensor> outputs, c10::Stream stream, bool own_stream,
             std::unique_ptr<c10::Event> end)
      : outputs_(std::move(outputs)),
        stream_(stream),
        own_stream_(own_stream),
        end_(std::move(end)) {}

  bool isCompleted() override { return true; }
  bool isSuccess() const override { return true; }
  std::vector<at::Tensor> result() override { return outputs_; }
  void synchronize() override { wait(kNoTimeout); }

  bool wait(std::chrono::milliseconds /*timeout*/) override {
    c10::impl::VirtualGuardImpl impl(stream_.device_type());
    c10::Stream cur = impl.getStream(stream_.device());
    if (cur != stream_) {
      std::lock_guard<std::mutex> lock(mu_);
      if (!end_) {
        // A call on the caller's stream, waited for on another: order that one after
        // everything the call's stream holds now (the call among it).
        end_ = std::make_unique<c10::Event>(stream_.device_type());
        end_->record(stream_);
      }
      end_->block(cur);
    }
    return true;
  }

  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override {
    std::lock_guard<std::mutex> lock(mu_);
    if (fut_) {
      return fut_;
    }
    c10::impl::VirtualGuardImpl impl(stream_.device_type());
    c10::Stream cur = impl.getStream(stream_.device());
    if (!own_stream_ && cur == stream_) {
      // Ready in stream order for work on this stream, where its consumers run.
      fut_ = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::ofTensors());
      fut_->markCompleted(c10::IValue(outputs_));
    } else {
      // Marked ready on the call's stream: a consumer's wait orders its stream after it.
      fut_ = c10::make_intrusive<c10::ivalue::Future>(
          c10::ListType::ofTensors(), std::vector<c10::Device>{stream_.device()});
      c10::Stream prev = impl.exchangeStream(stream_);
      try {
        fut_->markCompleted(c10::IValue(outputs_));
      } catch (...) {
        impl.exchangeStream(prev);
        throw;
      }
      impl.exchangeStream(prev);
    }
    return fut_;
  }

 private:
  std::vector<at::Tensor> outputs_;
  c10::Stream stream_;
  bool own_stream_;
  std::mutex mu_;
  std::unique_ptr<c10::Event> end_;
  c10::intrusive_ptr<c10::ivalue::Future> fut_;
};

class FerrocxBackend : public c10d::Backend {
 public:
  // `pg`: the Python process group (held weakly: it holds this backend); `comm`: its
  // communicator (held, for the entries' address); `entries`: its c_entries(); `dtypes`:
  // (an empty tensor of each dtype, ferrocx's code); `ops`: torch's RedOpType value ->
  // ferrocx's code, for dtypes other than bool; `cuda`: the rank's device is CUDA;
  // `comm_stream`: callers that wait later go on a communication stream; `error`: the
  // exception type of failures (ferrocx.Error); `raw_stream`: (stream id, device index,
  // device type) -> the native stream, where c10 cannot tell it.
  FerrocxBackend(int rank, int size, py::object pg, py::object comm, py::tuple entries,
                 py::list dtypes, py::dict ops, bool cuda, bool comm_stream, py::object error,
                 py::object raw_stream)
      : c10d::Backend(rank, size), cuda_(cuda), comm_stream_(comm_stream) {
    auto version = entries[0].cast<uint32_t>();
    TORCH_CHECK(version == kEntriesVersion, "ferrocx: the native torch backend takes entries v",
                kEntriesVersion, ", the ferrocx module gives v", version,
                " (rebuild: a stale build of the backend)");
    comm_ = reinterpret_cast<const void*>(static_cast<uintptr_t>(entries[1].cast<uint64_t>()));
    all_reduce_ = reinterpret_cast<AllReduceFn>(static_cast<uintptr_t>(entries[2].cast<uint64_t>()));
    wrap_stream_ =
        reinterpret_cast<WrapStreamFn>(static_cast<uintptr_t>(entries[3].cast<uint64_t>()));
    synchronize_ =
        reinterpret_cast<SynchronizeFn>(static_cast<uintptr_t>(entries[4].cast<uint64_t>()));
    for (auto item : dtypes) {
      auto pair = item.cast<py::tuple>();
      auto t = pair[0].cast<at::Tensor>();
      dtypes_[static_cast<int>(t.scalar_type())] = pair[1].cast<uint32_t>();
    }
    for (auto item : ops) {
      ops_[item.first.cast<int>()] = item.second.cast<uint32_t>();
    }
    pg_ = py::module_::import("weakref").attr("ref")(pg);
    comm_obj_ = std::move(comm);
    error_ = std::move(error);
    raw_stream_ = std::move(raw_stream);
  }

  ~FerrocxBackend() override {
    if (Py_IsInitialized()) {
      py::gil_scoped_acquire gil;
      pg_ = py::object();
      comm_obj_ = py::object();
      error_ = py::object();
      raw_stream_ = py::object();
    } else {
      pg_.release();
      comm_obj_.release();
      error_.release();
      raw_stream_.release();
    }
  }

  const std::string getBackendName() const override { return "ferrocx"; }

  // Calls inside a coalesced group go to Python (which collects them).
  void setGrouped(bool grouped) { grouped_.store(grouped); }

  // Whether a CUDA call whose caller waits later goes on the communication stream.
  void setCommStream(bool on) { comm_stream_.store(on); }

  // The communication stream of device `index` as (stream id, device index, device type),
  // once a call has made it, else None.
  py::object commStreamOf(int index) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = comm_streams_.find(index);
    if (it == comm_streams_.end()) {
      return py::none();
    }
    const c10::Stream& st = it->second;
    return py::make_tuple(static_cast<int64_t>(st.id()), static_cast<int>(st.device_index()),
                          static_cast<int>(st.device_type()));
  }

  // How many all_reduce calls each side took (tests: which path a call went).
  std::pair<uint64_t, uint64_t> counts() const { return {native_calls_.load(), python_calls_.load()}; }

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override {
#if FX_TORCH_AT_LEAST(2, 8)
    const bool async_op = opts.asyncOp;
#else
    // No way to tell: the caller may wait later.
    const bool async_op = true;
#endif
    if (tensors.size() == 1 && !grouped_.load() && !opts.sparseIndices.has_value()) {
      const at::Tensor& t = tensors[0];
      if (t.layout() == c10::kStrided && t.is_contiguous() && t.scalar_type() != at::kBool) {
        auto d = dtypes_.find(static_cast<int>(t.scalar_type()));
        auto o = ops_.find(static_cast<int>(opts.reduceOp.op_));
        if (d != dtypes_.end() && o != ops_.end()) {
          if (t.is_cuda() && cuda_) {
            return cudaAllReduce(tensors, d->second, o->second, async_op);
          }
          if (t.is_cpu() && !cuda_ && !async_op) {
            return hostAllReduce(tensors, d->second, o->second);
          }
        }
      }
    }
    return pythonAllReduce(tensors, opts);
  }

 private:
  [[noreturn]] void raise(const char* msg) {
    py::gil_scoped_acquire gil;
    PyErr_SetString(error_.ptr(), msg);
    throw py::error_already_set();
  }

  void enqueue(const at::Tensor& t, uint32_t dtype, uint32_t op, uint64_t stream) {
    char err[2048];
    err[0] = 0;
    auto addr = static_cast<uint64_t>(reinterpret_cast<uintptr_t>(t.data_ptr()));
    if (all_reduce_(comm_, addr, addr, static_cast<uint64_t>(t.numel()), dtype, op, stream, err,
                    sizeof(err)) != 0) {
      raise(err);
    }
  }

  c10::intrusive_ptr<c10d::Work> hostAllReduce(std::vector<at::Tensor>& tensors, uint32_t dtype,
                                               uint32_t op) {
    enqueue(tensors[0], dtype, op, kOwnStream);
    char err[2048];
    err[0] = 0;
    if (synchronize_(comm_, err, sizeof(err)) != 0) {
      raise(err);
    }
    native_calls_++;
    // A caller that waits at once gets no Work (as from torch's NCCL backend): it has
    // completed.
    return c10::intrusive_ptr<c10d::Work>();
  }

  c10::intrusive_ptr<c10d::Work> cudaAllReduce(std::vector<at::Tensor>& tensors, uint32_t dtype,
                                               uint32_t op, bool async_op) {
    const at::Tensor& t = tensors[0];
    c10::Device dev = t.device();
    c10::impl::VirtualGuardImpl impl(c10::DeviceType::CUDA);
    c10::Stream cur = impl.getStream(dev);
    if (async_op && comm_stream_.load()) {
      c10::Stream cs = commStream(impl, dev);
      {
        // The communication stream after everything the current stream holds.
        std::lock_guard<std::mutex> lock(mu_);
        auto& ev = order_[dev.index()];
        if (!ev) {
          ev = std::make_unique<c10::Event>(c10::DeviceType::CUDA);
        }
        ev->record(cur);
        ev->block(cs);
      }
      enqueue(t, dtype, op, handle(cs));
      // The caching allocator keeps the tensor's memory until the call is done with it.
      impl.recordDataPtrOnStream(t.storage().data_ptr(), cs);
      auto end = std::make_unique<c10::Event>(c10::DeviceType::CUDA);
      end->record(cs);
      native_calls_++;
      return c10::make_intrusive<StreamWork>(tensors, cs, true, std::move(end));
    }
    enqueue(t, dtype, op, handle(cur));
    native_calls_++;
    if (!async_op) {
      // The caller waits at once: the call is on its current stream, nothing to wait for.
      return c10::intrusive_ptr<c10d::Work>();
    }
    return c10::make_intrusive<StreamWork>(tensors, cur, false, nullptr);
  }

  // The group's communication stream of `dev` (one from torch's pool, taken once).
  c10::Stream commStream(const c10::impl::VirtualGuardImpl& impl, c10::Device dev) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = comm_streams_.find(dev.index());
    if (it != comm_streams_.end()) {
      return it->second;
    }
    c10::Stream s = impl.getStreamFromGlobalPool(dev, /*isHighPriority=*/false);
    comm_streams_.emplace(dev.index(), s);
    return s;
  }

  // The device adaptor's handle of torch stream `s` (wrapped once).
  uint64_t handle(const c10::Stream& s) {
    auto key = std::make_pair(static_cast<int>(s.device_index()), static_cast<int64_t>(s.id()));
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = handles_.find(key);
      if (it != handles_.end()) {
        return it->second;
      }
    }
    uint64_t native = 0;
    bool known = false;
#if FX_TORCH_AT_LEAST(2, 8)
    try {
      native = static_cast<uint64_t>(reinterpret_cast<uintptr_t>(s.native_handle()));
      known = true;
    } catch (const std::exception&) {
      // A torch whose device guard cannot tell: Python's stream object can.
    }
#endif
    if (!known) {
      py::gil_scoped_acquire gil;
      native = raw_stream_(static_cast<int64_t>(s.id()), static_cast<int>(s.device_index()),
                           static_cast<int>(s.device_type()))
                   .cast<uint64_t>();
    }
    uint64_t h = 0;
    char err[2048];
    err[0] = 0;
    if (wrap_stream_(comm_, native, &h, err, sizeof(err)) != 0) {
      raise(err);
    }
    std::lock_guard<std::mutex> lock(mu_);
    handles_.emplace(key, h);
    return h;
  }

  c10::intrusive_ptr<c10d::Work> pythonAllReduce(std::vector<at::Tensor>& tensors,
                                                 const c10d::AllreduceOptions& opts) {
    py::gil_scoped_acquire gil;
    py::object pg = pg_();
    if (pg.is_none()) {
      throw std::runtime_error("ferrocx: the process group of this backend is gone");
    }
    python_calls_++;
    py::object r = pg.attr("_allreduce_py")(tensors, opts);
    if (r.is_none()) {
      return c10::intrusive_ptr<c10d::Work>();
    }
    auto inner = r.cast<c10::intrusive_ptr<c10d::Work>>();
    return c10::make_intrusive<HeldWork>(std::move(r), std::move(inner));
  }

  bool cuda_;
  std::atomic<bool> comm_stream_;
  std::atomic<bool> grouped_{false};
  std::atomic<uint64_t> native_calls_{0};
  std::atomic<uint64_t> python_calls_{0};
  const void* comm_ = nullptr;
  AllReduceFn all_reduce_ = nullptr;
  WrapStreamFn wrap_stream_ = nullptr;
  SynchronizeFn synchronize_ = nullptr;
  std::map<int, uint32_t> dtypes_;
  std::map<int, uint32_t> ops_;
  std::mutex mu_;
  std::map<std::pair<int, int64_t>, uint64_t> handles_;
  std::map<int, c10::Stream> comm_streams_;
  std::map<int, std::unique_ptr<c10::Event>> order_;
  py::object pg_;
  py::object comm_obj_;
  py::object error_;
  py::object raw_stream_;
};

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "ferrocx's torch.distributed backend: the native all_reduce (see ferrocx._native)";
  m.attr("ENTRIES_VERSION") = kEntriesVersion;
  py::module_::import("torch.distributed");
  py::class_<FerrocxBackend, c10d::Backend, c10::intrusive_ptr<FerrocxBackend>>(m, "Backend")
      .def(py::init<int, int, py::object, py::object, py::tuple, py::list, py::dict, bool, bool,
                    py::object, py::object>(),
           py::arg("rank"), py::arg("size"), py::arg("pg"), py::arg("comm"), py::arg("entries"),
           py::arg("dtypes"), py::arg("ops"), py::arg("cuda"), py::arg("comm_stream"),
           py::arg("error"), py::arg("raw_stream"))
      .def("set_grouped", &FerrocxBackend::setGrouped, py::arg("grouped"))
      .def("set_comm_stream", &FerrocxBackend::setCommStream, py::arg("on"))
      .def("comm_stream_of", &FerrocxBackend::commStreamOf, py::arg("index"),
           "(stream id, device index, device type) of the communication stream, or None")
      .def("counts", &FerrocxBackend::counts,
           "(native calls, calls handed to Python) of all_reduce so far");
}
