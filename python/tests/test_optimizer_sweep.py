"""PyTorch's optimizer database (torch.testing._internal.common_optimizers.optim_db: every torch.optim
optimizer with the configurations PyTorch tests) on the accalloc device against the CPU: each
configuration, as written and with foreach=True and fused=True where the optimizer takes them, three
steps over the same parameters and gradients, the same parameters after. An implementation the CPU
refuses must be refused on the device too, and the other way round. SparseAdam, which takes sparse
gradients only, is given sparse COO gradients on both."""
import pytest
import torch
from torch.testing._internal.common_optimizers import optim_db

STEPS = 3


def stepped(info, kwargs, device):
    """The parameters after STEPS steps of the optimizer on `device` (the same start and gradients
    everywhere), or what it raised (matrices: Muon takes nothing else)."""
    torch.manual_seed(0)
    start = [torch.randn(5, 3), torch.randn(3, 4)]
    params = [torch.nn.Parameter(p.to(device)) for p in start]
    kwargs = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
    try:
        optimizer = info.optim_cls(params, **kwargs)
        for step in range(STEPS):
            for i, p in enumerate(params):
                torch.manual_seed(10 * step + i)
                grad = torch.randn(p.shape)
                p.grad = (grad.to_sparse() if info.optim_cls is torch.optim.SparseAdam else grad).to(device)
            if info.step_requires_closure:
                optimizer.step(lambda: sum((p * p).sum() for p in params))
            else:
                optimizer.step()
    except Exception as e:  # noqa: BLE001 - compared with what the other side raised
        return f"{type(e).__name__}: {e}"
    return [p.detach().cpu() for p in params]


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("info", optim_db, ids=lambda i: i.optim_cls.__name__)
def test_the_optimizer_steps_as_on_the_cpu(fresh_device, info):
    takes = info.optim_cls.__init__.__code__.co_varnames
    implementations = [{}] + [{key: True} for key in ("foreach", "fused") if key in takes]
    compared = 0
    for config in info.optim_inputs_func(device="cpu"):
        for implementation in implementations:
            kwargs = {**config.kwargs, **implementation}
            where = f"{info.optim_cls.__name__} {config.desc} {implementation}"
            on_cpu, on_device = stepped(info, kwargs, "cpu"), stepped(info, kwargs, "accalloc")
            if isinstance(on_cpu, str) or isinstance(on_device, str):
                assert isinstance(on_cpu, str) and isinstance(on_device, str), \
                    f"{where}: the CPU gave {on_cpu!r}, the device {on_device!r}"
                continue
            for c, d in zip(on_cpu, on_device):
                torch.testing.assert_close(d, c, rtol=1e-5, atol=1e-6, msg=lambda m: f"{where}: {m}")
            compared += 1
    assert compared > 0
