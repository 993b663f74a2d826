"""Small real models for the host accelerator's tests, its step-time benchmark and the recorded traces:
GPT-2, BERT, T5 and Llama from `transformers`, built from a config with random weights (no download),
and a CNN with batch norm. Each fits a 2 GiB device with room to spare.

A model is built once on the CPU from a seed and copied, so that the CPU and the device start from the
same weights. Dropout is off by default: PyTorch takes another dropout algorithm on an accelerator than
on the CPU (the fused native_dropout, is_fused_kernel_acceptable), so with it on the random masks and
the losses differ by design, not by fault.
"""
import copy

import torch

VOCAB = 1000


def gpt2(dropout=0.0):
    from transformers import GPT2Config, GPT2LMHeadModel

    return GPT2LMHeadModel(GPT2Config(n_layer=4, n_embd=256, n_head=4, vocab_size=VOCAB, n_positions=256,
                                      resid_pdrop=dropout, embd_pdrop=dropout, attn_pdrop=dropout,
                                      bos_token_id=0, eos_token_id=0))


def bert(dropout=0.0):
    from transformers import BertConfig, BertForMaskedLM

    return BertForMaskedLM(BertConfig(num_hidden_layers=4, hidden_size=256, num_attention_heads=4,
                                      intermediate_size=1024, vocab_size=VOCAB, max_position_embeddings=256,
                                      hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout))


def t5(dropout=0.0):
    from transformers import T5Config, T5ForConditionalGeneration

    return T5ForConditionalGeneration(T5Config(num_layers=4, num_decoder_layers=4, d_model=256, d_ff=1024,
                                               num_heads=4, d_kv=64, vocab_size=VOCAB, dropout_rate=dropout,
                                               decoder_start_token_id=0, pad_token_id=0, eos_token_id=1))


def llama(dropout=0.0):
    from transformers import LlamaConfig, LlamaForCausalLM

    return LlamaForCausalLM(LlamaConfig(num_hidden_layers=4, hidden_size=256, num_attention_heads=4,
                                        num_key_value_heads=2, intermediate_size=512, vocab_size=VOCAB,
                                        max_position_embeddings=256, attention_dropout=dropout,
                                        bos_token_id=0, eos_token_id=1, pad_token_id=0))


class SmallCnn(torch.nn.Module):
    """Two convolution blocks with batch norm, pooling and a linear head, over 3 x 32 x 32 images."""

    def __init__(self, classes=10):
        super().__init__()
        self.features = torch.nn.Sequential(
            torch.nn.Conv2d(3, 32, 3, padding=1), torch.nn.BatchNorm2d(32), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
            torch.nn.Conv2d(32, 64, 3, padding=1), torch.nn.BatchNorm2d(64), torch.nn.ReLU(),
            torch.nn.AdaptiveAvgPool2d(1))
        self.head = torch.nn.Linear(64, classes)

    def forward(self, x):
        return self.head(self.features(x).flatten(1))


def cnn(dropout=0.0):
    del dropout
    return SmallCnn()


LANGUAGE_MODELS = {"gpt2": gpt2, "bert": bert, "t5": t5, "llama": llama}
MODELS = {**LANGUAGE_MODELS, "cnn": cnn}


def build(name, device, seed=0, dropout=0.0):
    """Model `name` with the weights of `seed`, on `device` (the same weights on every device)."""
    torch.manual_seed(seed)
    model = MODELS[name](dropout)
    return copy.deepcopy(model).to(device)


def batch(name, device, batch_size=8, sequence=64, seed=1):
    """The inputs of one training step: token ids (labels are the ids) or images and classes."""
    generator = torch.Generator().manual_seed(seed)
    if name == "cnn":
        images = torch.randn(batch_size, 3, 32, 32, generator=generator)
        classes = torch.randint(0, 10, (batch_size,), generator=generator)
        return images.to(device), classes.to(device)
    ids = torch.randint(2, VOCAB, (batch_size, sequence), generator=generator)
    return (ids.to(device),)


def loss_of(name, model, inputs):
    if name == "cnn":
        images, classes = inputs
        return torch.nn.functional.cross_entropy(model(images), classes)
    (ids,) = inputs
    return model(input_ids=ids, labels=ids).loss


def trainer(name, device, batch_size=8, sequence=64, dropout=0.0):
    """A function that runs one training step (forward, backward, AdamW) and returns the loss tensor;
    with the model, its optimizer and inputs held by the function's closure."""
    model = build(name, device, dropout=dropout)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    inputs = batch(name, device, batch_size, sequence)

    def step():
        loss = loss_of(name, model, inputs)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss.detach()

    step.model = model
    return step
