// The Python stacks of the memory history on the host accelerator (torch.accalloc.memory.
// _record_memory_history(stacks="python")). accalloc's own history (accalloc_record_memory_history)
// keeps each event's action, address, size, stream and time; this keeps, per device, the stack of each
// allocation and free that PyTorch's face made (accalloc_torch::history_recorder), in the same order,
// and the stack of each live block. accalloc.torch joins the two when it takes a snapshot: an event
// takes the next stack recorded for its address and kind (python/accalloc/torch/_memory_history.py).
//
// Stacks are gathered as PyTorch's CUDA allocator gathers them (torch::CapturedTraceback, which takes
// the GIL), outside this file's lock; a stack is let go outside it too (letting go of Python frames
// takes the GIL: under the lock, a thread waiting for the GIL would keep another out that holds it).
// A child of fork() never gets here: accalloc refuses its requests (the recorder is told only of
// allocations made and blocks known), so the lock a fork copied is never taken there.
#include "host_device.h"

#include <torch/csrc/profiler/combined_traceback.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace accalloc_host {
namespace {

using Stack = std::shared_ptr<torch::CapturedTraceback>;

struct Event {
  bool allocated;
  uintptr_t address;
  Stack stack;
};

struct DeviceHistory {
  std::deque<Event> events;
  std::unordered_map<uintptr_t, Stack> live;
};

std::mutex history_lock;
std::map<int32_t, DeviceHistory> histories;
size_t max_events = 0;

void record(void* ptr, bool allocated, AccallocDeviceType type, int32_t device) {
  if (type != allocator().accalloc_type()) {
    return;
  }
  Stack stack = torch::CapturedTraceback::gather(/*python=*/true, /*script=*/false, /*cpp=*/false);
  std::vector<Stack> let_go;  // destroyed after the lock is released
  const auto address = reinterpret_cast<uintptr_t>(ptr);
  {
    std::lock_guard<std::mutex> guard(history_lock);
    if (max_events == 0) {
      return;  // stopped while this stack was gathered
    }
    DeviceHistory& history = histories[device];
    history.events.push_back(Event{allocated, address, stack});
    while (history.events.size() > max_events) {
      let_go.push_back(std::move(history.events.front().stack));
      history.events.pop_front();
    }
    if (allocated) {
      Stack& live = history.live[address];
      let_go.push_back(std::move(live));
      live = std::move(stack);
    } else if (auto found = history.live.find(address); found != history.live.end()) {
      let_go.push_back(std::move(found->second));
      history.live.erase(found);
    }
  }
}

// JSON's form of a string.
void append_json_string(std::string& out, const std::string& text) {
  out += '"';
  for (const char c : text) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char escaped[8];
          std::snprintf(escaped, sizeof escaped, "\\u%04x", static_cast<unsigned char>(c));
          out += escaped;
        } else {
          out += c;
        }
    }
  }
  out += '"';
}

// {"frames": [[filename, line, name], ...], "devices": {"0": {"events": [[allocated, address, [frame,
// ...]], ...], "live": [[address, [frame, ...]], ...]}}}, frames by index, innermost first.
std::string stacks_json() {
  std::map<int32_t, DeviceHistory> copy;
  {
    std::lock_guard<std::mutex> guard(history_lock);
    copy = histories;
  }
  std::vector<torch::CapturedTraceback*> stacks;
  for (const auto& [device, history] : copy) {
    for (const Event& event : history.events) {
      stacks.push_back(event.stack.get());
    }
    for (const auto& [address, stack] : history.live) {
      stacks.push_back(stack.get());
    }
  }
  const torch::SymbolizedTracebacks symbolized = torch::symbolize(stacks);
  std::string out = "{\"frames\": [";
  for (size_t i = 0; i < symbolized.all_frames.size(); ++i) {
    const auto& frame = symbolized.all_frames[i];
    out += i == 0 ? "[" : ", [";
    append_json_string(out, frame.filename);
    out += ", " + std::to_string(frame.lineno) + ", ";
    append_json_string(out, frame.funcname);
    out += "]";
  }
  out += "], \"devices\": {";
  size_t next = 0;
  auto frames_of = [&]() {
    std::string list = "[";
    const std::vector<uint64_t>& indices = symbolized.tracebacks[next++];
    for (size_t k = 0; k < indices.size(); ++k) {
      list += (k == 0 ? "" : ", ") + std::to_string(indices[k]);
    }
    return list + "]";
  };
  bool first_device = true;
  for (const auto& [device, history] : copy) {
    out += (first_device ? "\"" : ", \"") + std::to_string(device) + "\": {\"events\": [";
    first_device = false;
    bool first = true;
    for (const Event& event : history.events) {
      out += first ? "[" : ", [";
      first = false;
      out += (event.allocated ? "true, " : "false, ") + std::to_string(event.address) + ", " + frames_of() + "]";
    }
    out += "], \"live\": [";
    first = true;
    for (const auto& [address, stack] : history.live) {
      out += (first ? "[" : ", [") + std::to_string(address) + ", " + frames_of() + "]";
      first = false;
    }
    out += "]}";
  }
  return out + "}}";
}

}  // namespace
}  // namespace accalloc_host

extern "C" {

// Start (`enabled` non-zero, keeping the newest `max_entries` allocations and frees per device) or stop
// recording the Python stack of each allocation and free on the host accelerator; either clears what
// was recorded. Returns 0.
__attribute__((visibility("default"))) int accalloc_torch_record_stacks(int enabled, size_t max_entries) {
  using namespace accalloc_host;
  std::map<int32_t, DeviceHistory> let_go;  // destroyed after the lock is released
  {
    std::lock_guard<std::mutex> guard(history_lock);
    let_go.swap(histories);
    max_events = enabled != 0 ? std::max<size_t>(max_entries, 1) : 0;
    accalloc_torch::history_recorder().store(enabled != 0 ? &record : nullptr, std::memory_order_release);
  }
  return 0;
}

// The stacks recorded, as JSON (see stacks_json), symbolized once: a NUL-terminated text of malloc's
// for accalloc_torch_free_text, or NULL when there is no memory for it.
__attribute__((visibility("default"))) char* accalloc_torch_stacks_json() {
  const std::string text = accalloc_host::stacks_json();
  auto* copy = static_cast<char*>(std::malloc(text.size() + 1));
  if (copy != nullptr) {
    std::memcpy(copy, text.c_str(), text.size() + 1);
  }
  return copy;
}

// Give back a text accalloc_torch_stacks_json made.
__attribute__((visibility("default"))) void accalloc_torch_free_text(char* text) { std::free(text); }

}  // extern "C"
