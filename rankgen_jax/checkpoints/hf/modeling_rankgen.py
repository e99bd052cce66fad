"""RankGen-style dual encoder for HuggingFace transformers: T5 encoder -> pooling -> projection.

This file is copied verbatim into folders exported by rankgen_jax, so that
`AutoModel.from_pretrained(folder, trust_remote_code=True)` builds the model.
It depends only on torch and transformers.

The state-dict layout matches the released RankGen checkpoints:
`t5_encoder.*` (a `T5EncoderModel`) and `projection.weight` ([P, d_model],
bias-free). With no extra config fields the model behaves as released: the
vector is the first position of the last hidden state, projected, not
normalised. Optional fields in `config.rankgen_jax` describe other dual
encoders (e.g. Sentence-T5):

    "rankgen_jax": {"pooling": "first" | "mean" | "first_last_avg" | "last2_avg",
                    "projection_dim": -1 (d_model -> d_model) | 0 (none) | P,
                    "l2_normalize": false | true}
"""

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedModel, T5Config, T5EncoderModel

try:
    # transformers >= 5: init helpers that respect the "already loaded" flags.
    from transformers import initialization as _init
except ImportError:  # transformers 4.x
    from torch.nn import init as _init

HEAD_CONFIG_KEY = "rankgen_jax"
POOLINGS = ("first", "mean", "first_last_avg", "last2_avg")
# Released RankGen behaviour; used for every field a config does not set.
DEFAULT_HEAD = {"pooling": "first", "projection_dim": -1, "l2_normalize": False}


def head_settings(config):
    """The head settings of `config`, with the released RankGen defaults filled in."""
    stored = getattr(config, HEAD_CONFIG_KEY, None) or {}
    head = {**DEFAULT_HEAD, **stored}
    if head["pooling"] not in POOLINGS:
        raise ValueError(f"{HEAD_CONFIG_KEY}.pooling={head['pooling']!r}: expected one of {POOLINGS}")
    if int(head["projection_dim"]) < -1:
        raise ValueError(f"{HEAD_CONFIG_KEY}.projection_dim must be -1, 0 or positive")
    return head


def masked_mean(hidden, attention_mask):
    """Mean over the positions where attention_mask is 1; [B, L, D] -> [B, D]."""
    mask = attention_mask.to(hidden.dtype).unsqueeze(-1)
    # clamp: an all-padding row gives zeros instead of NaN.
    return (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)


class T5EncoderWithProjection(PreTrainedModel):
    """T5 encoder + pooling + bias-free projection; forward returns one vector per input."""

    config_class = T5Config
    # `model.base_model` is the wrapped T5 encoder.
    base_model_prefix = "t5_encoder"
    supports_gradient_checkpointing = True
    _no_split_modules = ["T5Block"]
    # The wrapped T5 supports SDPA; without this the whole model falls back to eager attention.
    _supports_sdpa = True

    def __init__(self, config):
        super().__init__(config)
        head = head_settings(config)
        self.pooling = head["pooling"]
        self.l2_normalize = bool(head["l2_normalize"])
        self.t5_encoder = T5EncoderModel(config)
        projection_dim = int(head["projection_dim"])
        if projection_dim == 0:
            self.projection = None
        else:
            out_dim = config.d_model if projection_dim == -1 else projection_dim
            self.projection = nn.Linear(config.d_model, out_dim, bias=False)
        self.post_init()

    def _init_weights(self, module):
        """Initialise the projection like T5's own dense layers (the encoder initialises itself)."""
        if module is self.projection:
            std = self.config.initializer_factor * self.config.d_model**-0.5
            _init.normal_(module.weight, mean=0.0, std=std)

    def get_input_embeddings(self):
        return self.t5_encoder.get_input_embeddings()

    def set_input_embeddings(self, new_embeddings):
        self.t5_encoder.set_input_embeddings(new_embeddings)

    def pool(self, last_hidden, hidden_states, attention_mask):
        """One vector per sequence from the encoder outputs, following `self.pooling`."""
        if self.pooling == "first":
            return last_hidden[:, 0, :]
        if self.pooling == "mean":
            return masked_mean(last_hidden, attention_mask)
        # hidden_states[0] is the embedding output, hidden_states[-2] the output of
        # the second-to-last block; last_hidden is the final (layer-normed) output.
        other = hidden_states[0] if self.pooling == "first_last_avg" else hidden_states[-2]
        return masked_mean((other + last_hidden) / 2.0, attention_mask)

    def forward(self, input_ids=None, attention_mask=None, **kwargs):
        """Encode a batch -> float tensor [batch, output_dim] of vectors (score = dot product)."""
        if attention_mask is None:
            reference = input_ids if input_ids is not None else kwargs["inputs_embeds"][..., 0]
            attention_mask = torch.ones(reference.shape[:2], dtype=torch.long, device=reference.device)
        need_all = self.pooling in ("first_last_avg", "last2_avg")
        if need_all:
            kwargs["output_hidden_states"] = True
        kwargs["return_dict"] = True
        outputs = self.t5_encoder(input_ids=input_ids, attention_mask=attention_mask, **kwargs)
        hidden_states = outputs.hidden_states if need_all else None
        vectors = self.pool(outputs.last_hidden_state, hidden_states, attention_mask)
        if self.projection is not None:
            vectors = self.projection(vectors)
        if self.l2_normalize:
            vectors = F.normalize(vectors, p=2.0, dim=-1)
        return vectors
