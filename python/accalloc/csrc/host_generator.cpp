// The device's random number generators: torch.Generator(device="accalloc") makes one. Its numbers
// are a CPU generator's, the same stream for the same seed, since the device runs the CPU's kernels:
// the fallback (host_cpu_call.cpp) hands those kernels the CPU generator inside (cpu_generator_of).
#include "host_device.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/Generator.h>
#include <c10/core/GeneratorImpl.h>

#include <mutex>

namespace accalloc_host {
namespace {

class HostGenerator final : public c10::GeneratorImpl {
 public:
  explicit HostGenerator(c10::DeviceIndex index)
      : c10::GeneratorImpl(c10::Device(kType, index), c10::DispatchKeySet(kPrivateUse1Key)),
        cpu_(at::make_generator<at::CPUGeneratorImpl>()) {}

  // Each call takes the CPU generator's own lock too: the kernels that draw from it take that one.
  void set_current_seed(uint64_t seed) override {
    std::lock_guard<std::mutex> lock(cpu_.mutex());
    cpu_.set_current_seed(seed);
  }
  void set_offset(uint64_t offset) override {
    std::lock_guard<std::mutex> lock(cpu_.mutex());
    cpu_.set_offset(offset);
  }
  uint64_t get_offset() const override {
    std::lock_guard<std::mutex> lock(cpu_.mutex());
    return cpu_.get_offset();
  }
  uint64_t current_seed() const override {
    std::lock_guard<std::mutex> lock(cpu_.mutex());
    return cpu_.current_seed();
  }
  uint64_t seed() override {
    std::lock_guard<std::mutex> lock(cpu_.mutex());
    return cpu_.seed();
  }
  void set_state(const c10::TensorImpl& state) override {
    std::lock_guard<std::mutex> lock(cpu_.mutex());
    cpu_.unsafeGetGeneratorImpl()->set_state(state);
  }
  c10::intrusive_ptr<c10::TensorImpl> get_state() const override {
    std::lock_guard<std::mutex> lock(cpu_.mutex());
    return cpu_.unsafeGetGeneratorImpl()->get_state();
  }

  const at::Generator& cpu() const { return cpu_; }

 private:
  HostGenerator* clone_impl() const override {
    auto* copy = new HostGenerator(device().index());
    std::lock_guard<std::mutex> lock(cpu_.mutex());
    copy->cpu_ = cpu_.clone();
    return copy;
  }

  mutable at::Generator cpu_;  // mutable: its lock is taken in the const calls too
};

}  // namespace

at::Generator new_generator(c10::DeviceIndex index) { return at::make_generator<HostGenerator>(index); }

at::Generator cpu_generator_of(const at::Generator& generator) {
  if (!generator.defined() || generator.device().type() != kType) {
    return generator;
  }
  return static_cast<HostGenerator*>(generator.unsafeGetGeneratorImpl())->cpu();
}

}  // namespace accalloc_host
