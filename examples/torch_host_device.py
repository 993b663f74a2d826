"""A PyTorch user's view of accalloc: register the host accelerator, train a small model on it, and read
every memory figure through torch.accelerator, where accalloc answers.

    python3 -m pip install --no-build-isolation ./python     # into an environment with torch 2.15
    ACCALLOC_HOST_DEVICES=2 python3 examples/torch_host_device.py
"""
import torch

import accalloc
import accalloc.torch

device = accalloc.torch.register_host_device()  # "accalloc": PrivateUse1, renamed; explicit, once
print("accelerator:", torch.accelerator.current_accelerator(), "devices:", torch.accelerator.device_count())

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10)).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(20):
    x, y = torch.randn(128, 64, device=device), torch.randint(0, 10, (128,), device=device)
    loss = torch.nn.functional.cross_entropy(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print(f"loss after 20 steps: {loss.item():.4f}")

stats = torch.accelerator.memory_stats()
assert stats == accalloc.memory_stats(f"{device}:0"), "torch.accelerator reads accalloc's books"
print(f"allocated {torch.accelerator.memory_allocated()} B, peak {torch.accelerator.max_memory_allocated()} B, "
      f"reserved {torch.accelerator.memory_reserved()} B, device mallocs {stats['num_device_alloc']}")
free, total = torch.accelerator.get_memory_info()
print(f"device 0: {free} of {total} bytes free")
print(accalloc.memory_summary(f"{device}:0", abbreviated=True))

del model, optimizer, x, y, loss
torch.accelerator.empty_cache()
assert torch.accelerator.memory_allocated() == 0 and torch.accelerator.memory_reserved() == 0
print("everything returned to the device")
