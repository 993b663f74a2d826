"""Hugging Face's training stack on the host accelerator, as a user of transformers starts: the Trainer
(with ACCELERATE_TORCH_DEVICE naming the device, as transformers asks for a device it does not know by
name) gives the CPU's losses, compiled too; and accelerate's prepare(model, optimizer), which makes the
optimizer before it moves the model, trains the moved model in every mixed precision."""
import pytest

from conftest import DEVICE, run_python

TRAINER = """
    import torch
    import accalloc.torch
    accalloc.torch.register_host_device()
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments, logging
    logging.set_verbosity_error()

    class Tokens(torch.utils.data.Dataset):
        def __len__(self):
            return 8

        def __getitem__(self, i):
            ids = torch.randint(0, 100, (16,), generator=torch.Generator().manual_seed(i))
            return {"input_ids": ids, "labels": ids}

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=100))
    args = TrainingArguments(output_dir=OUTPUT, report_to=[], max_steps=4, per_device_train_batch_size=2,
                             save_strategy="no", disable_tqdm=True, logging_steps=1, use_cpu=USE_CPU,
                             torch_compile=COMPILE)
    trainer = Trainer(model=model, args=args, train_dataset=Tokens())
    trainer.train()
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    print("losses", next(model.parameters()).device.type, args.device.type, losses)
"""


@pytest.mark.parametrize("compile", [False, True])
def test_the_trainer_gives_the_cpus_losses_on_the_device(tmp_path, compile):
    pytest.importorskip("accelerate")
    runs = {}
    for where, env in (("device", {"ACCELERATE_TORCH_DEVICE": DEVICE}), ("cpu", {})):
        program = (TRAINER.replace("COMPILE", str(compile)).replace("USE_CPU", str(where == "cpu"))
                   .replace("OUTPUT", repr(str(tmp_path / where))))
        code, out = run_python(program, **env)
        assert code == 0, out
        [line] = [line for line in out.splitlines() if line.startswith("losses ")]
        _, model_device, batch_device, losses = line.split(" ", 3)
        runs[where] = (model_device, batch_device, eval(losses))
    assert runs["device"][:2] == (DEVICE, DEVICE) and runs["cpu"][:2] == ("cpu", "cpu")
    assert len(runs["device"][2]) == 4
    if compile:
        # Inductor picks a few algorithms for the CPU by the device's name (var_mean's, which layer
        # norm uses): compiled, the losses agree to float32 rounding (test_first_hour.py).
        assert runs["device"][2] == pytest.approx(runs["cpu"][2], rel=1e-6)
    else:
        assert runs["device"][2] == runs["cpu"][2]


ACCELERATE = """
    import torch
    import accalloc.torch
    accalloc.torch.register_host_device()
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState

    for precision in ("no", "bf16", "fp16"):
        accelerator = Accelerator(mixed_precision=precision)
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
        optimizer = torch.optim.AdamW(model.parameters(), lr=0.05)
        start = [p.detach().clone() for p in model.parameters()]
        data = torch.utils.data.TensorDataset(torch.randn(32, 8), torch.randn(32, 1))
        model, optimizer, loader = accelerator.prepare(model, optimizer, torch.utils.data.DataLoader(data, 8))
        losses = []
        for _ in range(5):
            for x, y in loader:
                loss = torch.nn.functional.mse_loss(model(x), y)
                accelerator.backward(loss)
                optimizer.step()
                optimizer.zero_grad()
            losses.append(loss.item())
        held = {p.device.type for group in optimizer.param_groups for p in group["params"]}
        moved = all(not torch.equal(p.cpu(), s) for p, s in zip(model.parameters(), start))
        print(precision, x.device.type, sorted(held), moved, losses[-1] < losses[0])
        AcceleratorState._reset_state(True)
"""


def test_accelerate_trains_a_model_it_moved_after_its_optimizer_was_made(tmp_path):
    pytest.importorskip("accelerate")
    code, out = run_python(ACCELERATE)
    assert code == 0, out
    lines = [line for line in out.splitlines() if line.startswith(("no ", "bf16 ", "fp16 "))]
    assert lines == [f"{precision} {DEVICE} ['{DEVICE}'] True True" for precision in ("no", "bf16", "fp16")], out
