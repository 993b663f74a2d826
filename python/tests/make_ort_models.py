"""Write the ONNX models tests/ort.rs runs in ONNX Runtime with accalloc as its allocator.

Usage: python make_ort_models.py OUT_DIR

Both models take one float32 tensor named "input" and give one named "output", with a free batch
dimension, and have fixed pseudo-random weights (numpy's RandomState, seeded), so every run writes
the same bytes:

- mlp.onnx: input [batch, 64] -> three MatMul+Add layers (64 -> 256 -> 256 -> 16), Relu between.
- transformer.onnx: input [batch, 32, 64] -> one pre-norm transformer block: LayerNormalization,
  single-head attention (MatMul for Q, K, V, scaled MatMul of Q and K^T, Softmax, MatMul with V, an
  output projection), a residual, LayerNormalization, an MLP (64 -> 256 -> 64, Relu), a residual.
"""

import pathlib
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

# ONNX Runtime 1.32 runs these; LayerNormalization is an operator from opset 17.
OPSET = 17
IR_VERSION = 8


class Graph:
    """Nodes and initializers of one graph, with fresh names."""

    def __init__(self, seed):
        self.random = np.random.RandomState(seed)
        self.nodes = []
        self.initializers = []
        self.count = 0

    def name(self, prefix):
        self.count += 1
        return f"{prefix}_{self.count}"

    def weight(self, shape, scale=None):
        """A float32 initializer, normal with std 1/sqrt(fan_in) unless `scale` is given."""
        std = scale if scale is not None else 1.0 / np.sqrt(shape[0])
        value = (self.random.standard_normal(shape) * std).astype(np.float32)
        name = self.name("w")
        self.initializers.append(numpy_helper.from_array(value, name))
        return name

    def constant(self, value):
        name = self.name("c")
        self.initializers.append(numpy_helper.from_array(np.asarray(value, dtype=np.float32), name))
        return name

    def op(self, op_type, inputs, **attributes):
        output = self.name(op_type.lower())
        self.nodes.append(helper.make_node(op_type, inputs, [output], **attributes))
        return output

    def linear(self, x, fan_in, fan_out):
        y = self.op("MatMul", [x, self.weight((fan_in, fan_out))])
        return self.op("Add", [y, self.weight((fan_out,), scale=0.1)])

    def layer_norm(self, x, width):
        scale = self.constant(1.0 + 0.1 * self.random.standard_normal(width))
        bias = self.constant(0.1 * self.random.standard_normal(width))
        return self.op("LayerNormalization", [x, scale, bias], axis=-1, epsilon=1e-5)

    def model(self, input_shape, output_shape, name):
        """The model whose output is the last node's, renamed "output"."""
        self.nodes[-1].output[0] = "output"
        graph = helper.make_graph(
            self.nodes,
            name,
            [helper.make_tensor_value_info("input", TensorProto.FLOAT, input_shape)],
            [helper.make_tensor_value_info("output", TensorProto.FLOAT, output_shape)],
            self.initializers,
        )
        model = helper.make_model(
            graph,
            opset_imports=[helper.make_opsetid("", OPSET)],
            producer_name="accalloc tests",
        )
        model.ir_version = IR_VERSION
        onnx.checker.check_model(model)
        return model


def mlp():
    g = Graph(seed=1)
    x = g.op("Relu", [g.linear("input", 64, 256)])
    x = g.op("Relu", [g.linear(x, 256, 256)])
    g.linear(x, 256, 16)
    return g.model(["batch", 64], ["batch", 16], "mlp")


def transformer():
    width, hidden, seq = 64, 256, 32
    g = Graph(seed=2)
    h = g.layer_norm("input", width)
    q = g.op("MatMul", [h, g.weight((width, width))])
    k = g.op("MatMul", [h, g.weight((width, width))])
    v = g.op("MatMul", [h, g.weight((width, width))])
    scores = g.op("MatMul", [q, g.op("Transpose", [k], perm=[0, 2, 1])])
    scores = g.op("Mul", [scores, g.constant(1.0 / np.sqrt(width))])
    attention = g.op("MatMul", [g.op("Softmax", [scores], axis=-1), v])
    x = g.op("Add", ["input", g.op("MatMul", [attention, g.weight((width, width))])])
    h = g.op("Relu", [g.linear(g.layer_norm(x, width), width, hidden)])
    g.op("Add", [x, g.linear(h, hidden, width)])
    return g.model(["batch", seq, width], ["batch", seq, width], "transformer")


def main():
    if len(sys.argv) != 2:
        sys.exit(f"usage: {sys.argv[0]} OUT_DIR")
    out = pathlib.Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    for name, model in [("mlp", mlp()), ("transformer", transformer())]:
        path = out / f"{name}.onnx"
        onnx.save(model, path)
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
