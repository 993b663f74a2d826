"""module.to() after the host accelerator is registered: parameters keep their objects (an optimizer
made before the move trains the moved model), lazy modules work on the CPU and on the device, tied
weights stay tied across the device, and PyTorch's process-wide conversion switches stay
as PyTorch left them (registering a device changes nothing for code that does not use it).
"""
import gc

import pytest
import torch
from torch import nn

from conftest import DEVICE, run_python


def lazy_model():
    return nn.Sequential(nn.LazyConv2d(8, 3), nn.LazyBatchNorm2d(), nn.ReLU(), nn.Flatten(), nn.LazyLinear(10))


def test_registering_leaves_pytorchs_conversion_switches_alone():
    assert not torch.__future__.get_swap_module_params_on_conversion()
    assert not torch.__future__.get_overwrite_module_params_on_conversion()


def test_a_parameter_moved_on_the_cpu_keeps_its_object_as_without_accalloc():
    linear = nn.Linear(3, 4)
    weight = linear.weight
    assert linear.to(torch.float64).weight is weight


@pytest.mark.parametrize("target", ["cpu", DEVICE])
def test_lazy_modules_initialize_after_to(fresh_device, target):
    torch.manual_seed(0)
    model = lazy_model().to(target)
    out = model(torch.randn(2, 3, 32, 32, device=target))
    assert out.shape == (2, 10) and out.device.type == torch.device(target).type
    assert model[4].in_features == 8 * 30 * 30
    assert model[0].weight.shape == (8, 3, 3, 3) and model[0].weight.device.type == torch.device(target).type
    out.sum().backward()
    assert model[4].weight.grad is not None and model[4].weight.grad.device.type == torch.device(target).type
    del model, out
    gc.collect()


def test_a_lazy_model_on_the_device_computes_what_it_computes_on_the_cpu(fresh_device):
    torch.manual_seed(0)
    cpu_model = lazy_model()
    x = torch.randn(2, 3, 16, 16)
    expected = cpu_model(x)
    device_model = lazy_model().to(DEVICE)
    device_model(x.to(DEVICE))  # initializes the device model's parameters
    device_model.load_state_dict(cpu_model.state_dict())
    torch.testing.assert_close(device_model(x.to(DEVICE)).cpu(), cpu_model(x))
    assert expected.shape == (2, 10)
    del device_model
    gc.collect()


def test_tied_weights_stay_tied_onto_and_off_the_device(fresh_device):
    embedding = nn.Embedding(10, 4)
    head = nn.Linear(4, 10, bias=False)
    head.weight = embedding.weight
    model = nn.ModuleDict({"embedding": embedding, "head": head}).to(DEVICE)
    assert model["embedding"].weight is model["head"].weight
    assert model["embedding"].weight.device.type == DEVICE
    model["head"](model["embedding"](torch.tensor([1, 2], device=DEVICE))).sum().backward()
    back = model.to("cpu")
    assert back["embedding"].weight is back["head"].weight
    assert back["embedding"].weight.device.type == "cpu"
    assert back["embedding"].weight.grad is not None and back["embedding"].weight.grad.device.type == "cpu"
    del model, back, embedding, head
    gc.collect()


def test_an_optimizer_made_before_the_move_trains_the_moved_model(fresh_device):
    # As between the CPU and CUDA, the parameters stay the objects the optimizer holds (accelerate's
    # prepare(model, optimizer) relies on it): before, its steps changed nothing the model used.
    torch.manual_seed(0)
    cpu_model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    model.load_state_dict(cpu_model.state_dict())
    parameters = list(model.parameters())
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    cpu_optimizer = torch.optim.Adam(cpu_model.parameters(), lr=0.1)
    model[0].weight.note = "kept"  # an attribute a library set on a parameter stays on it
    model.to(DEVICE)
    assert all(moved is kept for moved, kept in zip(model.parameters(), parameters))
    assert {p.device.type for p in optimizer.param_groups[0]["params"]} == {DEVICE}
    assert model[0].weight.note == "kept" and isinstance(model[0].weight, nn.Parameter)
    x = torch.randn(5, 4)
    for _ in range(3):
        model(x.to(DEVICE)).pow(2).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
        cpu_model(x).pow(2).sum().backward()
        cpu_optimizer.step()
        cpu_optimizer.zero_grad()
    for p, cpu_p in zip(model.parameters(), cpu_model.parameters()):
        assert torch.equal(p.cpu(), cpu_p)
    # And back, with a gradient on it: the same objects again, the gradient moved with them.
    model(x.to(DEVICE)).sum().backward()
    model.to("cpu")
    assert all(moved is kept for moved, kept in zip(model.parameters(), parameters))
    assert model[0].weight.device.type == "cpu" and model[0].weight.grad.device.type == "cpu"
    del model, optimizer
    gc.collect()


def test_a_parameter_that_cannot_keep_its_object_still_moves_tied_and_says_so(fresh_device):
    # A weak reference to a parameter (torch.compile's guards hold some) stops the swap: PyTorch's new
    # object then, one for every slot that shared the old, and a warning naming it (an optimizer made
    # before the move would hold the old one).
    import weakref

    embedding = nn.Embedding(10, 4)
    head = nn.Linear(4, 10, bias=False)
    head.weight = embedding.weight
    old = embedding.weight
    watcher = weakref.ref(old)
    with pytest.warns(UserWarning, match="Embedding.weight could not keep its Parameter object"):
        model = nn.ModuleDict({"embedding": embedding, "head": head}).to(DEVICE)
    assert model["embedding"].weight is not old and watcher() is old
    assert model["embedding"].weight is model["head"].weight
    assert model["embedding"].weight.device.type == DEVICE and old.device.type == "cpu"
    del model, embedding, head, old


def test_a_recurrent_layer_inside_a_model_keeps_its_parameters_across_the_move(fresh_device):
    # An LSTM takes weak references to its parameters once converted (RNNBase._apply): each module's
    # parameters are kept before that, so its optimizer trains it too.
    torch.manual_seed(0)
    model = nn.Sequential(nn.LSTM(3, 4, batch_first=True))
    parameters = list(model.parameters())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    model.to(DEVICE)
    assert all(moved is kept for moved, kept in zip(model.parameters(), parameters))
    before = [p.detach().cpu().clone() for p in parameters]
    model(torch.randn(2, 5, 3, device=DEVICE))[0].sum().backward()
    optimizer.step()
    assert all(not torch.equal(p.detach().cpu(), b) for p, b in zip(model.parameters(), before))
    del model, optimizer, parameters


def test_each_modules_old_copy_goes_as_the_move_goes(fresh_device):
    # A model moved to the device is for a moment in host memory twice: each module's old parameters
    # are let go once it is converted, not when the whole model is.
    from torch.multiprocessing.reductions import StorageWeakRef

    seen = []

    class Second(nn.Linear):
        def _apply(self, fn, recurse=True):
            seen.append(first.expired())
            return super()._apply(fn, recurse)

    model = nn.Sequential(nn.Linear(64, 64), Second(64, 64))
    first = StorageWeakRef(model[0].weight.untyped_storage())
    model.to(DEVICE)
    assert seen == [True] and model[0].weight.device.type == DEVICE
    del model


def test_a_gradient_moves_with_its_parameter_onto_the_device(fresh_device):
    linear = nn.Linear(3, 2)
    linear(torch.randn(4, 3)).sum().backward()
    weight, grad = linear.weight, linear.weight.grad.clone()
    linear.to(DEVICE)
    assert linear.weight is weight and weight.grad.device.type == DEVICE
    assert torch.equal(weight.grad.cpu(), grad)
    del linear, weight


def test_conversions_without_the_device_untie_exactly_as_pytorch_does():
    # PyTorch makes new Parameters for a conversion to the meta device; accalloc leaves that alone.
    code, out = run_python("""
        import torch
        from torch import nn
        def tied_after_meta():
            embedding = nn.Embedding(10, 4)
            head = nn.Linear(4, 10, bias=False)
            head.weight = embedding.weight
            model = nn.ModuleDict({"embedding": embedding, "head": head}).to("meta")
            return model["embedding"].weight is model["head"].weight
        stock = tied_after_meta()
        import accalloc.torch
        accalloc.torch.register_host_device()
        print("same" if tied_after_meta() == stock else "differs")
    """)
    assert code == 0 and "same" in out, out
