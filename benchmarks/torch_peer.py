"""The PyTorch / HuggingFace peer of our RankGen train step, for `make bench` and `make bench-gpu`.

The same model (HF `T5EncoderModel` built from our T5Config, first-token pooling,
bias-free d->d projection; for the demo's step, HF `BertModel` from MiniLM-L6's
config, mean pooling, L2 and logit scale 20), the same loss (in-batch softmax of
each prefix over every continuation and negative of the batch), the same optimizer (AdamW with our
defaults), the same shapes and random ids, the same model calls (prefixes, then
positives and negatives together). Written the way a careful PyTorch user would
on each device:

- CPU (`make bench`): eager attention, fp32, `zero_grad(set_to_none=True)`, the
  same thread count as XLA.
- GPU (`make bench-gpu`, `benchmarks.gpu`): bf16 autocast with fp32 master
  weights and fp32 logits / loss, HF's SDPA attention (T5's relative bias goes in
  as the attention mask), `torch.compile` of the encoder, fused AdamW, TF32 matmuls.
"""

from __future__ import annotations

import contextlib

from benchmarks.step_timing import MINILM_LOGIT_SCALE, BenchCase, encoder_config, time_steps
from rankgen_jax.checkpoints.hf.bert import bert_config_to_hf
from rankgen_jax.checkpoints.hf.t5 import t5_config_to_hf
from rankgen_jax.models.precision import resolve_activation_dtype


def torch_bf16(case: BenchCase) -> bool:
    """Whether the peer runs under bf16 autocast: where our encoder's dtype resolves to bfloat16."""
    platform = "gpu" if case.device.startswith("cuda") else "cpu"
    return resolve_activation_dtype(case.precision, platform).name == "bfloat16"


def build_peer(case: BenchCase):
    """(encoder, projection, embed function, autocast context factory) on case.device, as the module doc says."""
    # Imported here: torch and transformers are optional, and a JAX case's process must not load them.
    import torch
    from transformers import T5Config as HFT5Config
    from transformers import T5EncoderModel

    torch.manual_seed(0)
    device = torch.device(case.device)
    cfg = encoder_config(case)
    minilm = case.encoder == "minilm"
    # Our exporter's config mapping, so both sides build the same architecture (dropout off in both).
    if minilm:
        from transformers import BertConfig as HFBertConfig
        from transformers import BertModel

        hf_config = HFBertConfig(**bert_config_to_hf(cfg))
        hf_config.hidden_dropout_prob = hf_config.attention_probs_dropout_prob = 0.0
        model_class = BertModel
    else:
        hf_config = HFT5Config(**t5_config_to_hf(cfg))
        model_class = T5EncoderModel
    hf_config._attn_implementation = "sdpa" if case.sdpa else "eager"
    encoder = (model_class(hf_config, add_pooling_layer=False) if minilm else model_class(hf_config)).to(device).train()
    projection = torch.nn.Identity() if minilm else torch.nn.Linear(cfg.d_model, cfg.d_model, bias=False).to(device)
    run_encoder = torch.compile(encoder) if case.torch_compile else encoder
    bf16 = torch_bf16(case)

    def autocast():
        if not bf16:
            return contextlib.nullcontext()
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)

    def embed(input_ids):
        hidden = run_encoder(input_ids=input_ids, attention_mask=torch.ones_like(input_ids)).last_hidden_state
        # The head in fp32, as ours: the vectors and the logits made from them stay fp32.
        with torch.autocast(device_type=device.type, enabled=False):
            if minilm:  # no padding in the random ids: the mean over every position
                return torch.nn.functional.normalize(hidden.float().mean(dim=1), dim=-1)
            return projection(hidden[:, 0].float())

    return encoder, projection, embed, autocast


def run_torch_case(case: BenchCase, threads: int, learning_rate: float, weight_decay: float, peak_fn=None) -> dict:
    """Seconds per step of the PyTorch RankGen step for one BenchCase (call in a fresh process)."""
    import torch

    torch.set_num_threads(threads)
    # XLA:CPU flushes denormals to zero; without this, torch slows ~10x once gradients get tiny.
    torch.set_flush_denormal(True)
    cuda = case.device.startswith("cuda")
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    encoder, projection, embed, autocast = build_peer(case)
    cfg = encoder_config(case)
    params = list(encoder.parameters()) + list(projection.parameters())
    optimizer = torch.optim.AdamW(params, lr=learning_rate, weight_decay=weight_decay, **({"fused": True} if cuda else {}))
    generator = torch.Generator().manual_seed(0)

    def ids(length: int) -> torch.Tensor:
        # Ids >= 2 so no position is padding (the JAX random source has no padding either).
        return torch.randint(2, cfg.vocab_size, (case.batch, length), generator=generator).to(case.device)

    batches = [
        (ids(case.prefix_length), ids(case.continuation_length), ids(case.continuation_length))
        for _ in range(case.steps + 1)
    ]
    labels = torch.arange(case.batch, device=case.device)
    logit_scale = MINILM_LOGIT_SCALE if case.encoder == "minilm" else 1.0

    def step(i: int) -> float:
        prefix, positive, negative = batches[i]
        with autocast():
            query_BxD = embed(prefix)
            # Positives and negatives have one length: one encoder call for both, as our step makes.
            documents = torch.cat([positive, negative]) if case.with_negative else positive
            documents_CxD = embed(documents)
        logits_BxC = logit_scale * (query_BxD @ documents_CxD.T)
        loss = torch.nn.functional.cross_entropy(logits_BxC, labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        return loss.item()

    if cuda:
        torch.cuda.reset_peak_memory_stats()
    timing = time_steps(step, case.steps, peak_fn)
    if cuda:
        timing["peak_device_memory_gib"] = torch.cuda.max_memory_allocated() / 2**30
    return timing
