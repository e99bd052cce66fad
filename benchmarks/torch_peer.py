"""The PyTorch / HuggingFace peer of our RankGen train step, for `make bench` to compare against.

The same model (HF `T5EncoderModel` built from our T5Config, first-token pooling,
bias-free d->d projection), the same loss (in-batch softmax of each prefix over
every continuation and negative of the batch), the same optimizer (AdamW with our
defaults), the same shapes and random ids, the same thread count, the same
model calls (prefixes, then positives and negatives together). Written the way
a careful PyTorch user would: eager attention (T5's relative bias has no fused
kernel), `zero_grad(set_to_none=True)`, no autocast (fp32 on CPU).
"""

from __future__ import annotations

from benchmarks.step_timing import BenchCase, time_steps
from rankgen_jax.checkpoints.hf.t5 import t5_config_to_hf
from rankgen_jax.models.configs import t5_config


def run_torch_case(case: BenchCase, threads: int, learning_rate: float, weight_decay: float) -> dict:
    """Seconds per step of the PyTorch RankGen step for one BenchCase (call in a fresh process)."""
    # Imported here: torch and transformers are optional, and a JAX case's process must not load them.
    import torch
    from transformers import T5Config as HFT5Config
    from transformers import T5EncoderModel

    torch.set_num_threads(threads)
    # XLA:CPU flushes denormals to zero; without this, torch slows ~10x once gradients get tiny.
    torch.set_flush_denormal(True)
    torch.manual_seed(0)
    cfg = t5_config(case.size)
    # Our exporter's config mapping, so both sides build the same architecture (dropout off in both).
    encoder = T5EncoderModel(HFT5Config(**t5_config_to_hf(cfg))).train()
    projection = torch.nn.Linear(cfg.d_model, cfg.d_model, bias=False)
    params = list(encoder.parameters()) + list(projection.parameters())
    optimizer = torch.optim.AdamW(params, lr=learning_rate, weight_decay=weight_decay)
    generator = torch.Generator().manual_seed(0)

    def ids(length: int) -> torch.Tensor:
        # Ids >= 2 so no position is padding (the JAX random source has no padding either).
        return torch.randint(2, cfg.vocab_size, (case.batch, length), generator=generator)

    batches = [
        (ids(case.prefix_length), ids(case.continuation_length), ids(case.continuation_length))
        for _ in range(case.steps + 1)
    ]

    def embed(input_ids: torch.Tensor) -> torch.Tensor:
        hidden = encoder(input_ids=input_ids, attention_mask=torch.ones_like(input_ids)).last_hidden_state
        return projection(hidden[:, 0])

    def step(i: int) -> float:
        prefix, positive, negative = batches[i]
        query_BxD = embed(prefix)
        # Positives and negatives have one length: one encoder call for both, as our step makes.
        documents = torch.cat([positive, negative]) if case.with_negative else positive
        logits_BxC = query_BxD @ embed(documents).T
        loss = torch.nn.functional.cross_entropy(logits_BxC, torch.arange(case.batch))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        return loss.item()

    return time_steps(step, case.steps)
