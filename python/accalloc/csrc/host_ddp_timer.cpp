// DistributedDataParallel's time statistics on the device (ddp._get_ddp_logging_data()'s forward,
// backward and communication times): DDP asks a timer registered for the device type, and without one
// it warns that it collects them only for the CPU and CUDA. The device's work is done when its call
// returns (host memory, synchronous kernels and collectives), so the host's clock times it, as DDP's
// timer for the CPU does.
#include <c10/core/Device.h>

#if __has_include(<torch/csrc/distributed/c10d/reducer_timer.hpp>)
#include <torch/csrc/distributed/c10d/reducer_timer.hpp>

namespace accalloc_host {

class HostTimer final : public c10d::Timer {
 public:
  explicit HostTimer(c10::Device /*device*/) {}

  // Nanoseconds from `start` to `end`; none where either was not recorded in this iteration, or the
  // end came first (no communication this iteration, say).
  std::optional<int64_t> measureDifference(Event start, Event end) override {
    int64_t from = getTimeRef(start);
    int64_t to = getTimeRef(end);
    if (from == c10d::kUnsetTime || to == c10d::kUnsetTime || to < from) {
      return std::nullopt;
    }
    return to - from;
  }
};

}  // namespace accalloc_host

// The registry's registerer lives in c10d's namespace.
namespace c10d {
C10_REGISTER_TYPED_CLASS(TimerRegistry, c10::kPrivateUse1, accalloc_host::HostTimer)
}  // namespace c10d
#endif
