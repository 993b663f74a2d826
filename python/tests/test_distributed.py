"""torch.distributed on the accalloc device: the "accalloc" process group backend (gloo's collectives
over the device's memory). Two processes, started as torchrun would (spawn): every collective's
results worked out by hand, and DistributedDataParallel training to the weights one process reaches on
the CPU with the whole batch, its time statistics kept; FSDP2 (fully_shard) to those weights too."""
import subprocess
import sys
import textwrap

# What both programs start with: the reference (one process, the whole batch, on the CPU) and two
# workers started as torchrun would (spawn), each given the reference's starting weights and the
# batches, each putting (rank, its result) on the queue.
LAUNCHER = '''
    import copy, socket
    import torch, torch.multiprocessing as mp

    def train_both(worker, steps):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
        start = copy.deepcopy(model.state_dict())
        batches = [(torch.randn(8, 4), torch.randn(8, 1)) for _ in range(steps)]
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        for x, y in batches:
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        context = mp.get_context("spawn")
        results = context.Queue()
        workers = [context.Process(target=worker, args=(r, 2, port, start, batches, results)) for r in range(2)]
        for w in workers:
            w.start()
        by_rank = dict(results.get(timeout=240) for _ in workers)
        for w in workers:
            w.join(60)
        assert [w.exitcode for w in workers] == [0, 0]
        return model, by_rank

    def same_weights(weights, model):
        for key, value in model.state_dict().items():
            torch.testing.assert_close(torch.tensor(weights[key]), value, rtol=1e-5, atol=1e-6)
'''

PROGRAM = textwrap.dedent(LAUNCHER + '''
    import copy, os, socket, sys
    import torch, torch.distributed as dist, torch.multiprocessing as mp

    def worker(rank, world, port, start, batches, results):
        import accalloc.torch
        accalloc.torch.register_host_device()
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("accalloc", rank=rank, world_size=world)
        assert dist.get_backend() == "accalloc"
        dev = "accalloc"
        mine = torch.full((2,), float(rank + 1), device=dev)
        summed = mine.clone()
        dist.all_reduce(summed)
        gathered = torch.empty(4, device=dev)
        dist.all_gather_into_tensor(gathered, mine)
        listed = [torch.empty(2, device=dev) for _ in range(world)]
        dist.all_gather(listed, mine)
        scattered = torch.empty(1, device=dev)
        dist.reduce_scatter_tensor(scattered, torch.tensor([1.0, 10.0], device=dev) * (rank + 1))
        told = mine.clone()
        dist.broadcast(told, src=1)
        on_cpu = torch.ones(3)
        dist.all_reduce(on_cpu)
        if rank == 0:
            dist.send(torch.tensor([7.0], device=dev), dst=1)
            got = torch.zeros(1, device=dev)
        else:
            got = torch.zeros(1, device=dev)
            dist.recv(got, src=0)
        dist.barrier()
        collectives = [t.cpu().tolist() for t in (summed, gathered, *listed, scattered, told, on_cpu, got)]
        model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
        model.load_state_dict(start)
        ddp = torch.nn.parallel.DistributedDataParallel(model.to(dev))
        optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
        for x, y in batches:
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(ddp(x.chunk(world)[rank].to(dev)), y.chunk(world)[rank].to(dev))
            loss.backward()
            optimizer.step()
        # DDP's time statistics, from the device's timer (host_ddp_timer.cpp).
        logged = ddp._get_ddp_logging_data()
        assert logged["avg_forward_compute_time"] > 0 and logged["avg_backward_compute_time"] > 0, logged
        weights = {k: v.cpu().tolist() for k, v in model.state_dict().items()}
        results.put((rank, (collectives, weights)))
        dist.destroy_process_group()

    if __name__ == "__main__":
        model, by_rank = train_both(worker, steps=4)
        # Worked out by hand: ranks hold [1, 1] and [2, 2].
        assert by_rank[0][0] == [[3, 3], [1, 1, 2, 2], [1, 1], [2, 2], [3], [2, 2], [2, 2, 2], [0]]
        assert by_rank[1][0] == [[3, 3], [1, 1, 2, 2], [1, 1], [2, 2], [30], [2, 2], [2, 2, 2], [7]]
        for rank in (0, 1):
            same_weights(by_rank[rank][1], model)
        print("agreed")
''')


def test_collectives_and_ddp_on_the_device(tmp_path):
    program = tmp_path / "ddp_on_accalloc.py"
    program.write_text(PROGRAM)
    done = subprocess.run([sys.executable, str(program)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and "agreed" in done.stdout.splitlines(), done.stdout + done.stderr[-4000:]
    # Without a timer for the device, DDP warns that it times only the CPU and CUDA.
    assert "Time stats are currently only collected" not in done.stderr


FSDP_PROGRAM = textwrap.dedent(LAUNCHER + '''
    import copy, os, socket
    import torch, torch.distributed as dist, torch.multiprocessing as mp

    def worker(rank, world, port, start, batches, results):
        import accalloc.torch
        accalloc.torch.register_host_device()
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("accalloc", rank=rank, world_size=world)
        from torch.distributed.fsdp import fully_shard
        # The group's name, which every DeviceMesh looks its groups up by.
        assert dist.group.WORLD.group_name, "no name"
        model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
        model.load_state_dict(start)
        model.to("accalloc")
        for layer in (model[0], model[2]):
            fully_shard(layer)
        fully_shard(model)
        weight = model[0].weight
        # Each rank holds half of each parameter, on its device, as a DTensor of the device's mesh.
        assert weight.device_mesh.device_type == "accalloc", weight.device_mesh
        shard = weight.to_local()
        assert shard.device.type == "accalloc" and tuple(shard.shape) == (4, 4), shard.shape
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        for x, y in batches:
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x.chunk(world)[rank].to("accalloc")),
                                                y.chunk(world)[rank].to("accalloc"))
            loss.backward()
            optimizer.step()
        weights = {k: v.full_tensor().cpu().tolist() for k, v in model.state_dict().items()}
        results.put((rank, weights))
        dist.destroy_process_group()

    if __name__ == "__main__":
        model, by_rank = train_both(worker, steps=3)
        for rank in (0, 1):
            same_weights(by_rank[rank], model)
        print("agreed")
''')


def test_fsdp2_fully_shard_trains_on_the_device(tmp_path):
    """FSDP2 (fully_shard, over a DeviceMesh of the device): two processes, each holding half of every
    parameter, reach the weights one process reaches on the CPU with the whole batch. It failed to
    start ("ProcessGroup name not set": a group made in Python had nowhere to keep its name)."""
    program = tmp_path / "fsdp_on_accalloc.py"
    program.write_text(FSDP_PROGRAM)
    done = subprocess.run([sys.executable, str(program)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and "agreed" in done.stdout.splitlines(), done.stdout + done.stderr[-4000:]
