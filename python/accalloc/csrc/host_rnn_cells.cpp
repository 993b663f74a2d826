// The fused cells PyTorch's LSTM and GRU use on every device but the CPU (aten/src/ATen/native/RNN.cpp
// takes _thnn_fused_lstm_cell and _thnn_fused_gru_cell, and their backward, for CUDA, XPU and
// PrivateUse1 alike), which only CUDA and XPU implement. The CPU has no kernel for them, so the
// fallback cannot serve them: here they are, from the CPU's own operators over the device's memory,
// with the formulas of PyTorch's unfused cells (the CPU's path). The workspace a forward leaves for
// its backward is this file's own: the LSTM's four gates after their nonlinearities; the GRU's reset,
// update and new gates, the hidden state and the hidden part of the new gate. The double backward
// (create_graph=True) takes PyTorch's differentiable formulas, which need no workspace.
#include "host_device.h"

#include <ATen/TensorOperators.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/zeros_like.h>
#include <torch/library.h>

#include <optional>
#include <tuple>

namespace accalloc_host {
namespace {

at::Tensor with_bias(CpuCall& call, const at::Tensor& gates, const std::optional<at::Tensor>& bias) {
  at::Tensor cpu = call.cpu(gates);
  return bias.has_value() && bias->defined() ? cpu + call.cpu(*bias) : cpu;
}

at::Tensor on_device(CpuCall& call, const at::Tensor& t) { return t.defined() ? call.device(t) : t; }

// hy, cy and the workspace (the gates: input, forget and output after a sigmoid, cell after a tanh).
std::tuple<at::Tensor, at::Tensor, at::Tensor> fused_lstm_cell(const at::Tensor& input_gates,
                                                               const at::Tensor& hidden_gates, const at::Tensor& cx,
                                                               const std::optional<at::Tensor>& input_bias,
                                                               const std::optional<at::Tensor>& hidden_bias) {
  check_same_device("aten::_thnn_fused_lstm_cell", {{"input_gates", &input_gates}, {"hidden_gates", &hidden_gates},
                                                    {"cx", &cx}, {"input_bias", tensor_or_null(input_bias)},
                                                    {"hidden_bias", tensor_or_null(hidden_bias)}});
  CpuCall call(input_gates.device());
  std::vector<at::Tensor> gates =
      (with_bias(call, input_gates, input_bias) + with_bias(call, hidden_gates, hidden_bias)).chunk(4, 1);
  at::Tensor input = gates[0].sigmoid();
  at::Tensor forget = gates[1].sigmoid();
  at::Tensor cell = gates[2].tanh();
  at::Tensor output = gates[3].sigmoid();
  at::Tensor cy = forget * call.cpu(cx) + input * cell;
  at::Tensor hy = output * cy.tanh();
  std::tuple<at::Tensor, at::Tensor, at::Tensor> results{
      call.device(hy), call.device(cy), call.device(at::cat({input, forget, cell, output}, 1))};
  if (graph_capturing()) {
    record_for_graph("aten::_thnn_fused_lstm_cell", "", {input_gates, hidden_gates, cx, input_bias, hidden_bias},
                     {std::get<0>(results), std::get<1>(results), std::get<2>(results)});
  }
  return results;
}

// The gradients of the gates (input and hidden alike), of cx, and of the biases (their sum over the
// batch) where the cell has them.
std::tuple<at::Tensor, at::Tensor, at::Tensor> fused_lstm_cell_backward(const std::optional<at::Tensor>& grad_hy,
                                                                        const std::optional<at::Tensor>& grad_cy,
                                                                        const at::Tensor& cx, const at::Tensor& cy,
                                                                        const at::Tensor& workspace, bool has_bias) {
  check_same_device("aten::_thnn_fused_lstm_cell_backward_impl",
                    {{"grad_hy", tensor_or_null(grad_hy)}, {"grad_cy", tensor_or_null(grad_cy)}, {"cx", &cx}, {"cy", &cy},
                     {"workspace", &workspace}});
  CpuCall call(workspace.device());
  std::vector<at::Tensor> gates = call.cpu(workspace).chunk(4, 1);
  const at::Tensor &input = gates[0], &forget = gates[1], &cell = gates[2], &output = gates[3];
  at::Tensor tanh_cy = call.cpu(cy).tanh();
  at::Tensor d_hy = grad_hy.has_value() && grad_hy->defined() ? call.cpu(*grad_hy) : at::zeros_like(tanh_cy);
  at::Tensor d_cy = d_hy * output * (1 - tanh_cy * tanh_cy);
  if (grad_cy.has_value() && grad_cy->defined()) {
    d_cy = d_cy + call.cpu(*grad_cy);
  }
  at::Tensor d_gates = at::cat({d_cy * cell * input * (1 - input), d_cy * call.cpu(cx) * forget * (1 - forget),
                                d_cy * input * (1 - cell * cell), d_hy * tanh_cy * output * (1 - output)},
                               1);
  at::Tensor d_bias = has_bias ? d_gates.sum(0) : at::Tensor();
  std::tuple<at::Tensor, at::Tensor, at::Tensor> results{call.device(d_gates), call.device(d_cy * forget),
                                                         on_device(call, d_bias)};
  if (graph_capturing()) {
    record_for_graph("aten::_thnn_fused_lstm_cell_backward_impl", "", {grad_hy, grad_cy, cx, cy, workspace, has_bias},
                     {std::get<0>(results), std::get<1>(results), std::get<2>(results)});
  }
  return results;
}

// hy and the workspace (reset, update and new gates, hx, and the hidden part of the new gate).
std::tuple<at::Tensor, at::Tensor> fused_gru_cell(const at::Tensor& input_gates, const at::Tensor& hidden_gates,
                                                  const at::Tensor& hx, const std::optional<at::Tensor>& input_bias,
                                                  const std::optional<at::Tensor>& hidden_bias) {
  check_same_device("aten::_thnn_fused_gru_cell", {{"input_gates", &input_gates}, {"hidden_gates", &hidden_gates},
                                                   {"hx", &hx}, {"input_bias", tensor_or_null(input_bias)},
                                                   {"hidden_bias", tensor_or_null(hidden_bias)}});
  CpuCall call(input_gates.device());
  std::vector<at::Tensor> in = with_bias(call, input_gates, input_bias).chunk(3, 1);
  std::vector<at::Tensor> hidden = with_bias(call, hidden_gates, hidden_bias).chunk(3, 1);
  at::Tensor reset = (hidden[0] + in[0]).sigmoid();
  at::Tensor update = (hidden[1] + in[1]).sigmoid();
  at::Tensor fresh = (in[2] + hidden[2] * reset).tanh();
  at::Tensor cpu_hx = call.cpu(hx);
  at::Tensor hy = (cpu_hx - fresh) * update + fresh;
  std::tuple<at::Tensor, at::Tensor> results{
      call.device(hy), call.device(at::cat({reset, update, fresh, cpu_hx, hidden[2]}, 1))};
  if (graph_capturing()) {
    record_for_graph("aten::_thnn_fused_gru_cell", "", {input_gates, hidden_gates, hx, input_bias, hidden_bias},
                     {std::get<0>(results), std::get<1>(results)});
  }
  return results;
}

// The gradients of the input gates, the hidden gates, hx, and the two biases where the cell has them.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> fused_gru_cell_backward(
    const at::Tensor& grad_hy, const at::Tensor& workspace, bool has_bias) {
  check_same_device("aten::_thnn_fused_gru_cell_backward", {{"grad_hy", &grad_hy}, {"workspace", &workspace}});
  CpuCall call(workspace.device());
  std::vector<at::Tensor> saved = call.cpu(workspace).chunk(5, 1);
  const at::Tensor &reset = saved[0], &update = saved[1], &fresh = saved[2], &hx = saved[3], &hidden_new = saved[4];
  at::Tensor d_hy = call.cpu(grad_hy);
  at::Tensor d_update = d_hy * (hx - fresh) * update * (1 - update);
  at::Tensor d_fresh = d_hy * (1 - update) * (1 - fresh * fresh);
  at::Tensor d_reset = d_fresh * hidden_new * reset * (1 - reset);
  at::Tensor d_input = at::cat({d_reset, d_update, d_fresh}, 1);
  at::Tensor d_hidden = at::cat({d_reset, d_update, d_fresh * reset}, 1);
  at::Tensor d_input_bias = has_bias ? d_input.sum(0) : at::Tensor();
  at::Tensor d_hidden_bias = has_bias ? d_hidden.sum(0) : at::Tensor();
  std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> results{
      call.device(d_input), call.device(d_hidden), call.device(d_hy * update), on_device(call, d_input_bias),
      on_device(call, d_hidden_bias)};
  if (graph_capturing()) {
    record_for_graph("aten::_thnn_fused_gru_cell_backward", "", {grad_hy, workspace, has_bias},
                     {std::get<0>(results), std::get<1>(results), std::get<2>(results), std::get<3>(results),
                      std::get<4>(results)});
  }
  return results;
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_thnn_fused_lstm_cell", fused_lstm_cell);
  m.impl("_thnn_fused_lstm_cell_backward_impl", fused_lstm_cell_backward);
  m.impl("_thnn_fused_gru_cell", fused_gru_cell);
  m.impl("_thnn_fused_gru_cell_backward", fused_gru_cell_backward);
}

}  // namespace
}  // namespace accalloc_host
