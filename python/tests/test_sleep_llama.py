"""The real proof of sleep and wake (issue 30): a Llama from transformers (random weights, from a
config) on the accalloc device, its weights in a tag with a backup and its KV cache in one without,
as an RL or serving job keeps them. Generate; pause both: the device's free memory rises by the paused
bytes and the process's resident memory drops by at least 90% of the KV cache's; resume; generate
again: the same tokens."""
import os

import pytest
import torch

import accalloc.torch

transformers = pytest.importorskip("transformers")


def resident_bytes():
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.fixture
def tags(fresh_device):
    yield
    accalloc.torch.forget()
    torch.accelerator.empty_cache()


def test_a_llama_sleeps_and_wakes_with_the_same_tokens(tags):
    config = transformers.LlamaConfig(vocab_size=1000, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=8192)
    torch.manual_seed(0)
    with accalloc.torch.region("weights", enable_cpu_backup=True):
        model = transformers.LlamaForCausalLM(config).to("accalloc").eval()
    cache = transformers.StaticCache(config=config, max_cache_len=8192)
    prompt = torch.tensor([[1, 5, 9, 42, 7]], device="accalloc")

    def generate():
        cache.reset()
        with torch.no_grad(), accalloc.torch.region("kv_cache"):
            return model.generate(prompt, max_new_tokens=12, do_sample=False, cache=cache).cpu()

    first = generate()
    kv_bytes = sum(t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values))
    assert kv_bytes == 2 * 2 * 4 * 8192 * 64 * 4  # layers, keys and values, heads, positions, head dim, float
    addresses = [p.data_ptr() for p in model.parameters()]
    free_before, rss_before = torch.accelerator.get_memory_info(0)[0], resident_bytes()

    accalloc.torch.pause()
    paused = accalloc.torch.paused_bytes()
    assert paused >= kv_bytes
    assert torch.accelerator.get_memory_info(0)[0] - free_before == paused
    dropped = rss_before - resident_bytes()
    assert dropped >= 0.9 * kv_bytes, f"resident memory dropped by {dropped} bytes, the KV cache holds {kv_bytes}"

    accalloc.torch.resume()
    assert torch.accelerator.get_memory_info(0)[0] == free_before
    assert [p.data_ptr() for p in model.parameters()] == addresses
    assert torch.equal(generate(), first), "the weights came back: the same tokens"
