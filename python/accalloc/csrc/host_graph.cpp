// Graphs on the host accelerator: torch.accelerator.Graph (PyTorch 2.15's graph API for any
// accelerator) captures the device's work and replays it.
//
// The memory side is CUDA's: while a graph captures, the device's allocations go to the graph's
// private pool (its own, {n, 0}, or the one given), which it keeps until reset, so a captured
// tensor keeps its address and other graphs may share the pool; statistics move by PyTorch's pool
// rules (accalloc's pools). The work side differs where it must: the host device has no driver
// that records kernels, so the capture records each operator the device runs (its kernel, boxed,
// with its arguments), and a replay runs them again in order. An argument made before the capture
// is used as it is (the graph keeps it alive, as a CUDA graph keeps its addresses); one a recorded
// operator made is the result that operator gave in this replay. A result still alive after the
// capture (a graph's output) gets the replay's bytes once its last reader has run. So a replay
// computes what the captured work would compute on the inputs as they are now; unlike a CUDA graph,
// it allocates its intermediate results as it goes (in the default pool) and copies each output.
// The capture runs the work once to record it, but leaves what it found as it was: the bytes of every
// tensor from before the capture that the work writes (x += 1, an optimizer's step) are kept when
// first written and put back at capture_end, so that, as on CUDA, only replays change them.
// Everything the device runs while a capture is underway is part of it (the host device has one
// stream), from any thread, as work on a capturing CUDA stream is.
#include "host_device.h"

#include <ATen/core/GraphImplInterface.h>
#include <ATen/ops/empty.h>

#include <atomic>
#include <fstream>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace accalloc_host {
namespace {

// A tensor argument of a recorded call: one from outside the capture (kept, and used as it is at
// each replay), or a view of a storage a recorded call made (rebuilt over that call's replayed
// result).
struct TensorRef {
  at::Tensor external;
  int64_t made = -1;
  std::vector<int64_t> sizes;
  std::vector<int64_t> strides;
  int64_t offset = 0;
  c10::TensorOptions options;
};

struct Argument {
  enum class Kind { Plain, Tensor, TensorList, OptionalTensorList } kind = Kind::Plain;
  c10::IValue plain;
  std::vector<std::optional<TensorRef>> tensors;
};

struct RecordedCall {
  c10::OperatorHandle op;
  std::vector<Argument> arguments;
  // Per return slot, the storages it made (one for a tensor, one per element of a list; -1: none
  // made, the result is an argument or a view of one).
  std::vector<std::vector<int64_t>> made;
};

// A storage a recorded call made: the captured one (weakly: a graph's output stays alive only while
// its user holds it) and the last call that reads it.
struct MadeStorage {
  c10::weak_intrusive_ptr<c10::StorageImpl> captured;
  size_t last_reader = 0;
};

class HostGraph;

// The graph capturing now, if any (one at a time in the process), and the lock its recording takes.
std::atomic<HostGraph*> g_capturing{nullptr};
std::mutex g_record_mutex;

class HostGraph final : public at::GraphImplInterface {
 public:
  explicit HostGraph(const at::GraphImplArgs& /*args*/) {}
  ~HostGraph() override { release_pool(); }

  void capture_begin(at::MempoolId_t pool, at::GraphCaptureMode /*mode*/) override {
    TORCH_CHECK(!captured_, "this graph has been captured already: reset() it before capturing again");
    c10::DeviceIndex device = current_device();
    if (pool.first == 0 && pool.second == 0) {
      // A graph's own pool: {n, 0}, n counting from 1 in the process, as PyTorch's graphs number
      // theirs (a user's pools are {0, n}).
      static std::atomic<uint64_t> next{1};
      pool = {next.fetch_add(1), 0};
    }
    HostGraph* expected = nullptr;
    TORCH_CHECK(g_capturing.compare_exchange_strong(expected, this),
                "another graph is capturing on the accalloc device: one capture at a time");
    AccallocPoolId id{pool.first, pool.second};
    AccallocStatus status =
        accalloc_pool_begin_on(allocator().accalloc_type(), device, id, ACCALLOC_ROUTE_STREAM, nullptr);
    if (status != ACCALLOC_OK) {
      g_capturing.store(nullptr);
      accalloc_torch::check(status, "accalloc_pool_begin (graph capture)");
    }
    pool_ = pool;
    device_ = device;
    has_pool_ = true;
  }

  void capture_end() override {
    TORCH_CHECK(g_capturing.load() == this, "capture_end: this graph is not capturing");
    {
      // A call recording on another thread finishes first.
      std::lock_guard<std::mutex> lock(g_record_mutex);
      g_capturing.store(nullptr);
    }
    captured_ = true;
    // What the capture's run wrote over, as it was before.
    for (auto& [storage, bytes] : saved_) {
      size_t n = std::min(bytes.size(), storage.nbytes());
      if (n > 0) {
        allocator().copy_data(storage.mutable_data(), bytes.data(), n);
      }
    }
    saved_.clear();
    // Which storages each call reads last, for the replay to let them go (and deliver outputs).
    last_read_at_.assign(calls_.size(), {});
    for (size_t m = 0; m < made_.size(); ++m) {
      last_read_at_[made_[m].last_reader].push_back(static_cast<int64_t>(m));
    }
    accalloc_torch::check(
        accalloc_pool_end_on(allocator().accalloc_type(), device_, AccallocPoolId{pool_.first, pool_.second}),
        "accalloc_pool_end (graph capture)");
  }

  void instantiate() override { TORCH_CHECK(captured_, "instantiate: the graph has not been captured"); }

  void replay() override {
    TORCH_CHECK(captured_, "replay: the graph has not been captured");
    TORCH_CHECK(g_capturing.load() == nullptr, "replay during a capture is not supported");
    std::vector<c10::Storage> replayed(made_.size());
    for (size_t k = 0; k < calls_.size(); ++k) {
      const RecordedCall& call = calls_[k];
      torch::jit::Stack stack;
      stack.reserve(call.arguments.size());
      for (const Argument& argument : call.arguments) {
        stack.push_back(rebuild(argument, replayed));
      }
      call.op.redispatchBoxed(key_set(), &stack);
      const size_t returns = call.op.schema().returns().size();
      const size_t begin = stack.size() - returns;
      for (size_t r = 0; r < returns; ++r) {
        const c10::IValue& value = stack[begin + r];
        const std::vector<int64_t>& made = call.made[r];
        if (value.isTensor() && !made.empty() && made[0] >= 0) {
          replayed[made[0]] = value.toTensor().storage();
        } else if (value.isTensorList()) {
          std::vector<at::Tensor> list = value.toTensorList().vec();
          for (size_t e = 0; e < list.size() && e < made.size(); ++e) {
            if (made[e] >= 0 && list[e].defined()) {
              replayed[made[e]] = list[e].storage();
            }
          }
        }
      }
      // Storages no later call reads: a graph output alive still takes the replayed bytes now, and
      // the replay's copy goes.
      for (int64_t m : last_read_at_[k]) {
        deliver(m, replayed[m]);
        replayed[m] = c10::Storage();
      }
    }
  }

  void reset() override {
    TORCH_CHECK(g_capturing.load() != this, "reset: the graph is capturing");
    calls_.clear();
    made_.clear();
    last_read_at_.clear();
    by_storage_.clear();
    captured_ = false;
    release_pool();
  }

  at::MempoolId_t pool() const override { return pool_; }

  void enable_debug_mode() override { debug_ = true; }

  void debug_dump(const std::string& path) override {
    TORCH_CHECK(debug_, "debug_dump: call enable_debug_mode() before capturing");
    std::ofstream out(path);
    TORCH_CHECK(out, "debug_dump: cannot write ", path);
    for (const RecordedCall& call : calls_) {
      out << call.op.schema().operator_name() << "\n";
    }
  }

  // Before an operator runs during the capture: the bytes of each tensor from before the capture
  // that it writes (`written`: the arguments it writes), kept the first time.
  void save_written(const std::vector<c10::IValue>& written) {
    auto save = [&](const at::Tensor& t) {
      if (!t.defined() || !t.has_storage() || t.device().type() != kType) {
        return;
      }
      c10::StorageImpl* storage = t.storage().unsafeGetStorageImpl();
      if (made_by_a_call(storage) >= 0 || storage->data() == nullptr) {
        return;  // the capture's own result: no one had it before
      }
      for (const auto& [kept, bytes] : saved_) {
        if (kept.unsafeGetStorageImpl() == storage) {
          return;
        }
      }
      std::vector<char> bytes(storage->nbytes());
      allocator().copy_data(bytes.data(), storage->data(), bytes.size());
      saved_.emplace_back(t.storage(), std::move(bytes));
    };
    for (const c10::IValue& value : written) {
      if (value.isTensor()) {
        save(value.toTensor());
      } else if (value.isTensorList()) {
        for (const at::Tensor& t : value.toTensorList().vec()) {
          save(t);
        }
      }
    }
  }

  // One operator the device ran during the capture: its arguments as given (before it ran) and the
  // stack's results from `returns_begin`.
  void record(const c10::OperatorHandle& op, const std::vector<c10::IValue>& arguments,
              const torch::jit::Stack& results, size_t returns_begin) {
    RecordedCall call{op, {}, {}};
    const size_t index = calls_.size();
    std::vector<c10::StorageImpl*> argument_storages;
    auto refer = [&](const at::Tensor& t) -> std::optional<TensorRef> {
      if (!t.defined()) {
        return std::nullopt;
      }
      TensorRef ref;
      if (t.has_storage()) {
        c10::StorageImpl* storage = t.storage().unsafeGetStorageImpl();
        argument_storages.push_back(storage);
        int64_t made = made_by_a_call(storage);
        if (made >= 0) {
          ref.made = made;
          ref.sizes = t.sizes().vec();
          ref.strides = t.strides().vec();
          ref.offset = t.storage_offset();
          ref.options = t.options();
          made_[made].last_reader = index;
          return ref;
        }
      }
      ref.external = t;
      return ref;
    };
    for (const c10::IValue& value : arguments) {
      Argument argument;
      if (value.isTensor()) {
        argument.kind = Argument::Kind::Tensor;
        argument.tensors.push_back(refer(value.toTensor()));
      } else if (value.isTensorList()) {
        argument.kind = Argument::Kind::TensorList;
        for (const at::Tensor& t : value.toTensorList().vec()) {
          argument.tensors.push_back(refer(t));
        }
      } else if (value.isOptionalTensorList()) {
        argument.kind = Argument::Kind::OptionalTensorList;
        for (const std::optional<at::Tensor>& t : value.toOptionalTensorVector()) {
          argument.tensors.push_back(t.has_value() ? refer(*t) : std::nullopt);
        }
      } else {
        argument.plain = value;
      }
      call.arguments.push_back(std::move(argument));
    }
    auto make = [&](const at::Tensor& t) -> int64_t {
      if (!t.defined() || !t.has_storage()) {
        return -1;
      }
      c10::StorageImpl* storage = t.storage().unsafeGetStorageImpl();
      for (c10::StorageImpl* argument : argument_storages) {
        if (argument == storage) {
          return -1;  // the result is an argument, or a view of one
        }
      }
      if (made_by_a_call(storage) >= 0) {
        return -1;  // a storage a former call made (two results of one call over one storage)
      }
      const int64_t made = static_cast<int64_t>(made_.size());
      made_.push_back(MadeStorage{c10::weak_intrusive_ptr<c10::StorageImpl>(t.storage().getWeakStorageImpl()),
                                  index});
      by_storage_[storage] = made;
      return made;
    };
    for (size_t i = returns_begin; i < results.size(); ++i) {
      const c10::IValue& value = results[i];
      std::vector<int64_t> made;
      if (value.isTensor()) {
        made.push_back(make(value.toTensor()));
      } else if (value.isTensorList()) {
        for (const at::Tensor& t : value.toTensorList().vec()) {
          made.push_back(make(t));
        }
      }
      call.made.push_back(std::move(made));
    }
    calls_.push_back(std::move(call));
  }

 private:
  // The number of the storage a recorded call made, if `storage` is that one (still alive: a storage
  // freed during the capture may leave its address to another).
  int64_t made_by_a_call(c10::StorageImpl* storage) const {
    auto found = by_storage_.find(storage);
    if (found == by_storage_.end()) {
      return -1;
    }
    auto alive = made_[found->second].captured.lock();
    return alive.get() == storage ? found->second : -1;
  }

  c10::IValue rebuild(const Argument& argument, const std::vector<c10::Storage>& replayed) const {
    auto tensor = [&](const std::optional<TensorRef>& ref) -> at::Tensor {
      if (!ref.has_value()) {
        return at::Tensor();
      }
      if (ref->made < 0) {
        return ref->external;
      }
      at::Tensor view = at::empty({0}, ref->options);
      view.set_(replayed[ref->made], ref->offset, ref->sizes, ref->strides);
      return view;
    };
    switch (argument.kind) {
      case Argument::Kind::Plain:
        return argument.plain;
      case Argument::Kind::Tensor:
        return tensor(argument.tensors[0]);
      case Argument::Kind::TensorList: {
        c10::List<at::Tensor> list;
        for (const auto& ref : argument.tensors) {
          list.push_back(tensor(ref));
        }
        return list;
      }
      case Argument::Kind::OptionalTensorList: {
        c10::List<std::optional<at::Tensor>> list;
        for (const auto& ref : argument.tensors) {
          list.push_back(ref.has_value() ? std::optional<at::Tensor>(tensor(ref)) : std::nullopt);
        }
        return list;
      }
    }
    return argument.plain;
  }

  // The replayed bytes of made storage `m` into the captured one, if a graph output keeps it.
  void deliver(int64_t m, const c10::Storage& replayed) const {
    auto captured = made_[m].captured.lock();
    if (!captured || !replayed) {
      return;
    }
    size_t bytes = std::min(captured->nbytes(), replayed.nbytes());
    if (bytes > 0 && captured->data() != replayed.data()) {
      allocator().copy_data(captured->mutable_data(), replayed.data(), bytes);
    }
  }

  void release_pool() {
    if (!has_pool_) {
      return;
    }
    has_pool_ = false;
    if (g_capturing.load() == this) {
      g_capturing.store(nullptr);
      (void)accalloc_pool_end_on(allocator().accalloc_type(), device_, AccallocPoolId{pool_.first, pool_.second});
    }
    // The pool's use from capture_begin: at none, empty_cache gives its free segments back.
    (void)accalloc_pool_release_on(allocator().accalloc_type(), device_, AccallocPoolId{pool_.first, pool_.second});
  }

  std::vector<RecordedCall> calls_;
  std::vector<MadeStorage> made_;
  std::vector<std::vector<int64_t>> last_read_at_;
  std::unordered_map<c10::StorageImpl*, int64_t> by_storage_;
  // Storages from before the capture that its work wrote, and their bytes before (host memory of
  // the process's own, not the device's: the device's statistics do not see it).
  std::vector<std::pair<c10::Storage, std::vector<char>>> saved_;
  at::MempoolId_t pool_{0, 0};
  c10::DeviceIndex device_ = 0;
  bool has_pool_ = false;
  bool captured_ = false;
  bool debug_ = false;
};

}  // namespace

bool graph_capturing() { return g_capturing.load(std::memory_order_relaxed) != nullptr; }

void record_for_graph(const c10::OperatorHandle& op, const std::vector<c10::IValue>& arguments,
                      const torch::jit::Stack& results, size_t returns_begin) {
  std::lock_guard<std::mutex> lock(g_record_mutex);
  HostGraph* graph = g_capturing.load();
  if (graph != nullptr) {
    graph->record(op, arguments, results, returns_begin);
  }
}

void save_for_graph(const std::vector<c10::IValue>& written) {
  std::lock_guard<std::mutex> lock(g_record_mutex);
  HostGraph* graph = g_capturing.load();
  if (graph != nullptr) {
    graph->save_written(written);
  }
}

void record_for_graph(const char* name, const char* overload, std::vector<c10::IValue> arguments,
                      std::vector<c10::IValue> results) {
  static std::mutex handles_mutex;
  static std::unordered_map<std::string, c10::OperatorHandle> handles;
  std::optional<c10::OperatorHandle> op;
  {
    std::lock_guard<std::mutex> lock(handles_mutex);
    std::string key = std::string(name) + "." + overload;
    auto found = handles.find(key);
    if (found == handles.end()) {
      found = handles.emplace(key, c10::Dispatcher::singleton().findSchemaOrThrow(name, overload)).first;
    }
    op = found->second;
  }
  record_for_graph(*op, arguments, results, 0);
}

void register_graphs() {
  // The registry's key is the device type's name as PyTorch spells it now (the name the device was
  // given, in capitals): so after the rename.
  const std::string key = c10::DeviceTypeName(kType, /*lower_case=*/false);
  if (!at::GraphImplRegistry()->Has(key)) {
    at::GraphImplRegistry()->Register(
        key, [](at::GraphImplArgs args) -> std::unique_ptr<at::GraphImplInterface> {
          return std::make_unique<HostGraph>(args);
        });
  }
}

}  // namespace accalloc_host

extern "C" {

// Make torch.accelerator.Graph capture and replay on the device (after the device has its name).
__attribute__((visibility("default"))) void accalloc_torch_register_graphs() { accalloc_host::register_graphs(); }

}  // extern "C"
