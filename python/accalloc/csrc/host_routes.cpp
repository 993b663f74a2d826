// Where PyTorch would take an operator on the device somewhere else than the CPU's kernel: the
// host accelerator must give the CPU's results, so it routes these to the CPU's own kernels too.
// - Convolution: PyTorch sends it to convolution_overrideable (forward) and
//   convolution_backward_overrideable (backward) on an out-of-tree device. The CPU has no kernel for
//   either, so the fallback cannot serve them: they run the CPU's at::convolution and its backward.
// - Attention: scaled_dot_product_attention asks a dispatch stub which algorithm the device has;
//   without one it takes the unfused math path. The device answers what the CPU answers (and the
//   CPU's fused kernels then run through the fallback).
// - Operators with a CPU kernel and a CompositeExplicitAutograd one (native_layer_norm,
//   native_group_norm, addr, ...): a device without its own kernel gets the composite, another
//   algorithm with other rounding. And the functional and in-place forms of structured operators
//   (add.Tensor, mul_, ...): a device gets CompositeExplicitAutogradNonFunctional wrappers that
//   allocate on the device and call the out= form, two dispatches where the CPU has one.
//   route_cpu_kernels sends them all to the fallback, so to the CPU's own kernels.
#include "host_device.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/native/transformers/attention.h>
#include <ATen/ops/_fused_sdp_choice_cpu_dispatch.h>
#include <ATen/ops/convolution.h>
#include <ATen/ops/convolution_backward.h>
#include <torch/library.h>

#include <map>
#include <memory>
#include <string>

namespace accalloc_host {
namespace {

at::Tensor convolution_overrideable(const at::Tensor& input, const at::Tensor& weight,
                                    const std::optional<at::Tensor>& bias, at::IntArrayRef stride,
                                    at::IntArrayRef padding, at::IntArrayRef dilation, bool transposed,
                                    at::IntArrayRef output_padding, int64_t groups) {
  check_same_device("aten::convolution_overrideable",
                    {{"input", &input}, {"weight", &weight}, {"bias", tensor_or_null(bias)}});
  CpuCall call(input.device());
  std::optional<at::Tensor> cpu_bias;
  if (bias.has_value() && bias->defined()) {
    cpu_bias = call.cpu(*bias);
  }
  at::Tensor output = at::convolution(call.cpu(input), call.cpu(weight), cpu_bias, stride, padding, dilation,
                                      transposed, output_padding, groups);
  at::Tensor result = call.device(output);
  if (graph_capturing()) {
    record_for_graph("aten::convolution_overrideable", "",
                     {input, weight, bias, stride.vec(), padding.vec(), dilation.vec(), transposed,
                      output_padding.vec(), groups},
                     {result});
  }
  return result;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> convolution_backward_overrideable(
    const at::Tensor& grad_output, const at::Tensor& input, const at::Tensor& weight, at::IntArrayRef stride,
    at::IntArrayRef padding, at::IntArrayRef dilation, bool transposed, at::IntArrayRef output_padding,
    int64_t groups, std::array<bool, 3> output_mask) {
  check_same_device("aten::convolution_backward_overrideable",
                    {{"grad_output", &grad_output}, {"input", &input}, {"weight", &weight}});
  CpuCall call(input.device());
  // The bias has one element per output channel (the CPU's backward only needs its size).
  std::vector<int64_t> bias_sizes{transposed ? weight.size(1) * groups : weight.size(0)};
  auto [grad_input, grad_weight, grad_bias] =
      at::convolution_backward(call.cpu(grad_output), call.cpu(input), call.cpu(weight),
                               output_mask[2] ? at::OptionalIntArrayRef(bias_sizes) : std::nullopt, stride,
                               padding, dilation, transposed, output_padding, groups, output_mask);
  std::tuple<at::Tensor, at::Tensor, at::Tensor> results{call.device(grad_input), call.device(grad_weight),
                                                          call.device(grad_bias)};
  if (graph_capturing()) {
    record_for_graph("aten::convolution_backward_overrideable", "",
                     {grad_output, input, weight, stride.vec(), padding.vec(), dilation.vec(), transposed,
                      output_padding.vec(), groups, c10::List<bool>({output_mask[0], output_mask[1], output_mask[2]})},
                     {std::get<0>(results), std::get<1>(results), std::get<2>(results)});
  }
  return results;
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("convolution_overrideable", convolution_overrideable);
  m.impl("convolution_backward_overrideable", convolution_backward_overrideable);
}

int64_t fused_sdp_choice(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                         const std::optional<at::Tensor>& attn_mask, double dropout_p, bool is_causal,
                         std::optional<double> scale, bool enable_gqa) {
  CpuCall call(query.device());
  // The CPU's choice depends on which inputs need gradients (the fused kernels have none for a mask).
  auto cpu = [&](const at::Tensor& t) {
    at::Tensor alias = call.cpu(t);
    return t.requires_grad() ? alias.requires_grad_(true) : alias;
  };
  std::optional<at::Tensor> cpu_mask;
  if (attn_mask.has_value() && attn_mask->defined()) {
    cpu_mask = cpu(*attn_mask);
  }
  // The CPU's kernel itself (at::cpu::), not a call through the dispatcher: scaled_dot_product_attention
  // asks this from its composite, above the Python key, so that under torch.compile (a FakeTensorMode)
  // the query is a fake tensor, and a dispatched call would hand the mode the real CPU aliases it refuses.
  // The choice reads only shapes, dtypes, strides and which inputs need gradients.
  return at::cpu::_fused_sdp_choice(cpu(query), cpu(key), cpu(value), cpu_mask, dropout_p, is_causal, scale,
                                    enable_gqa);
}

}  // namespace

// Every operator with a kernel for `cpu_key` and a composite one, and none of the device's own for
// `device_key`, sent to `fallback` there (the registrations are kept for good).
template <c10::BoxedKernel::BoxedKernelFunction* fallback>
void route_composites(c10::DispatchKey cpu_key, c10::DispatchKey device_key) {
  static auto* by_namespace = new std::map<std::string, std::unique_ptr<torch::Library>>();
  c10::Dispatcher& dispatcher = c10::Dispatcher::singleton();
  for (const c10::OperatorName& name : dispatcher.getAllOpNames()) {
    std::optional<c10::OperatorHandle> op = dispatcher.findOp(name);
    if (!op.has_value() || !op->hasSchema() || !op->hasKernelForDispatchKey(cpu_key) ||
        !(op->hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutograd) ||
          op->hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutogradNonFunctional)) ||
        op->hasKernelForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd) ||
        op->hasKernelForDispatchKey(device_key)) {
      continue;
    }
    auto separator = name.name.find("::");
    if (separator == std::string::npos) {
      continue;
    }
    std::string ns = name.name.substr(0, separator);
    std::string overload = name.name.substr(separator + 2);
    if (!name.overload_name.empty()) {
      overload += "." + name.overload_name;
    }
    auto& library = (*by_namespace)[ns];
    if (!library) {
      library = std::make_unique<torch::Library>(torch::Library::IMPL, ns, device_key, __FILE__, __LINE__);
    }
    library->impl(overload.c_str(), torch::CppFunction::makeFromBoxedFunction<fallback>());
  }
}

void route_cpu_kernels() {
  static const bool routed = [] {
    at::native::_fused_sdp_choice_stub.set_privateuse1_dispatch_ptr(&fused_sdp_choice);
    route_composites<&cpu_kernel_fallback>(c10::DispatchKey::CPU, kPrivateUse1Key);
    // The same for sparse COO tensors: the composite sum of a sparse tensor is sparse where the CPU's
    // is dense, and so on.
    route_composites<&sparse_kernel_fallback>(c10::DispatchKey::SparseCPU, c10::DispatchKey::SparsePrivateUse1);
    return true;
  }();
  (void)routed;
}

}  // namespace accalloc_host
