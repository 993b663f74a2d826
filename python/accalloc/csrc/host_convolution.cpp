// Convolution on the host accelerator. PyTorch sends a convolution on an out-of-tree device to
// convolution_overrideable (forward) and convolution_backward_overrideable (backward); the CPU has no
// kernel for either, so the boxed fallback cannot serve them. Both run the CPU's own convolution over
// the device's memory in a CpuCall: the same algorithm, the same results, no copies.
#include "host_device.h"

#include <ATen/ops/convolution.h>
#include <ATen/ops/convolution_backward.h>
#include <torch/library.h>

namespace accalloc_host {
namespace {

at::Tensor convolution_overrideable(const at::Tensor& input, const at::Tensor& weight,
                                    const std::optional<at::Tensor>& bias, at::IntArrayRef stride,
                                    at::IntArrayRef padding, at::IntArrayRef dilation, bool transposed,
                                    at::IntArrayRef output_padding, int64_t groups) {
  CpuCall call(input.device());
  std::optional<at::Tensor> cpu_bias;
  if (bias.has_value() && bias->defined()) {
    cpu_bias = call.cpu(*bias);
  }
  at::Tensor output = at::convolution(call.cpu(input), call.cpu(weight), cpu_bias, stride, padding, dilation,
                                      transposed, output_padding, groups);
  return call.device(output);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> convolution_backward_overrideable(
    const at::Tensor& grad_output, const at::Tensor& input, const at::Tensor& weight, at::IntArrayRef stride,
    at::IntArrayRef padding, at::IntArrayRef dilation, bool transposed, at::IntArrayRef output_padding,
    int64_t groups, std::array<bool, 3> output_mask) {
  CpuCall call(input.device());
  // The bias has one element per output channel (the CPU's backward only needs its size).
  std::vector<int64_t> bias_sizes{transposed ? weight.size(1) * groups : weight.size(0)};
  auto [grad_input, grad_weight, grad_bias] =
      at::convolution_backward(call.cpu(grad_output), call.cpu(input), call.cpu(weight),
                               output_mask[2] ? at::OptionalIntArrayRef(bias_sizes) : std::nullopt, stride,
                               padding, dilation, transposed, output_padding, groups, output_mask);
  return {call.device(grad_input), call.device(grad_weight), call.device(grad_bias)};
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("convolution_overrideable", convolution_overrideable);
  m.impl("convolution_backward_overrideable", convolution_backward_overrideable);
}

}  // namespace
}  // namespace accalloc_host
