"""PyTorch's own operator database (OpInfo, the sample inputs PyTorch's test_ops uses) on the host
accelerator: for each sample, the result on the device equals the result on the CPU. Instantiated for
the PrivateUse1 device by instantiate_device_type_tests, as PyTorch's device-generic tests are.

Operators run on the device through PyTorch's CPU fallback over accalloc's memory, after the device
kernels that create, view and copy tensors; what this checks is that those kernels hand the CPU kernels
the right tensors (sizes, strides, offsets, dtypes) and bring the right results back.
"""
import torch
from torch.testing._internal.common_device_type import instantiate_device_type_tests, ops
from torch.testing._internal.common_methods_invocations import op_db
from torch.testing._internal.common_utils import TestCase

import conftest  # noqa: F401  (registers the accelerator before the tests are instantiated)

# What a model's forward and backward use most, plus the view and indexing operators that depend on
# the device's own kernels most.
OPERATORS = {
    "add", "sub", "mul", "div", "matmul", "mm", "sum", "mean", "exp", "log", "abs", "clamp", "where",
    "max", "min", "argmax", "cumsum", "topk", "sort", "relu", "sigmoid", "tanh", "nn.functional.gelu",
    "nn.functional.softmax", "nn.functional.layer_norm", "nn.functional.linear",
    "nn.functional.embedding", "nn.functional.cross_entropy", "transpose", "t", "permute", "reshape",
    "view", "flatten", "squeeze", "unsqueeze", "expand", "narrow", "select", "cat", "stack",
    "index_select", "gather", "masked_fill",
}
SELECTED = [op for op in op_db if op.name in OPERATORS and op.variant_test_name == ""]


def to_cpu(value):
    if isinstance(value, torch.Tensor):
        return value.cpu()
    if isinstance(value, (tuple, list)):
        return type(value)(to_cpu(v) for v in value)
    return value


class TestOperatorsAgainstTheCpu(TestCase):
    @ops(SELECTED, allowed_dtypes=(torch.float32,))
    def test_samples_agree_with_the_cpu(self, device, dtype, op):
        samples = list(op.sample_inputs("cpu", dtype))
        self.assertGreater(len(samples), 0)
        for sample in samples:
            expected = op(sample.input, *sample.args, **sample.kwargs)
            moved = sample.transform(lambda t: t.to(device) if isinstance(t, torch.Tensor) else t)
            got = op(moved.input, *moved.args, **moved.kwargs)
            if isinstance(got, torch.Tensor):
                self.assertEqual(got.device.type, torch.device(device).type)
            # The fallback makes non-contiguous inputs contiguous, which can change a reduction's
            # order: results agree to float32 rounding, not always bit for bit.
            torch.testing.assert_close(to_cpu(got), expected, equal_nan=True, atol=1e-4, rtol=1e-4)


instantiate_device_type_tests(TestOperatorsAgainstTheCpu, globals(), only_for=("privateuse1",))
