"""Cross-encoder ranker for HuggingFace transformers: encoder -> pooling -> projection -> linear scores.

This file is copied verbatim into ranker folders exported by rankgen_jax, so
that `AutoModel.from_pretrained(folder, trust_remote_code=True)` builds the
model. It depends only on torch and transformers.

config.json (model_type "rankgen_ranker"):

    "backbone": the encoder's own HF config (model_type "t5" wraps a
        T5EncoderModel; "bert", "roberta", "distilbert" the matching base model),
    "backbone_pooler": whether a BERT / RoBERTa backbone has its pooler (kept
        so the weights round-trip; only pooling "pooler" scores with it),
    "pooling": "first" | "mean" | "first_last_avg" | "last2_avg" | "pooler"
        (the backbone's pooler_output, tanh(dense(first token))),
    "projection_dim": -1 (d_model -> d_model) | 0 (none) | P,
    "num_scores": N

State dict: `backbone.*` (the wrapped encoder's own names), `projection.weight`
[P, d_model] (bias-free; absent when projection_dim is 0), `score.weight`
[N, P] and `score.bias` [N].

forward(input_ids, attention_mask, token_type_ids=None) returns raw scores
(logits), [batch] when num_scores is 1 and [batch, N] otherwise: the query and
the candidate are read together as one input. No sigmoid or softmax is applied;
take torch.sigmoid of the scores for a model trained with a sigmoid loss (e.g.
one probability per perspective), or a softmax over one query's candidates for
a listwise-trained model.
"""

import torch
from torch import nn
from transformers import AutoConfig, AutoModel, PretrainedConfig, PreTrainedModel, T5EncoderModel

try:
    # transformers >= 5: init helpers that respect the "already loaded" flags.
    from transformers import initialization as _init
except ImportError:  # transformers 4.x
    from torch.nn import init as _init

MODEL_TYPE = "rankgen_ranker"
POOLINGS = ("first", "mean", "first_last_avg", "last2_avg", "pooler")
# Backbones with a pooler that the base model builds unless told otherwise.
POOLER_MODEL_TYPES = ("bert", "roberta")


class RankerConfig(PretrainedConfig):
    """Backbone config (a dict, the encoder's own config.json fields) plus the head settings."""

    model_type = MODEL_TYPE

    def __init__(self, backbone=None, backbone_pooler=True, pooling="first", projection_dim=-1, num_scores=1,
                 **kwargs):
        self.backbone = dict(backbone or {"model_type": "t5"})
        self.backbone_pooler = bool(backbone_pooler)
        self.pooling = pooling
        self.projection_dim = int(projection_dim)
        self.num_scores = int(num_scores)
        if pooling not in POOLINGS:
            raise ValueError(f"pooling={pooling!r}: expected one of {POOLINGS}")
        if self.projection_dim < -1:
            raise ValueError(f"projection_dim must be -1, 0 or positive, got {self.projection_dim}")
        if self.num_scores < 1:
            raise ValueError(f"num_scores must be >= 1, got {self.num_scores}")
        if pooling == "pooler" and not self.backbone_pooler:
            raise ValueError("pooling='pooler' needs a backbone with its pooler (backbone_pooler=true)")
        super().__init__(**kwargs)


def backbone_config(config):
    """The backbone's own transformers config, built from config.backbone."""
    settings = dict(config.backbone)
    model_type = settings.pop("model_type", None)
    if model_type is None:
        raise ValueError("backbone has no model_type")
    return AutoConfig.for_model(model_type, **settings)


def masked_mean(hidden, attention_mask):
    """Mean over the positions where attention_mask is 1; [B, L, D] -> [B, D]."""
    mask = attention_mask.to(hidden.dtype).unsqueeze(-1)
    # clamp: an all-padding row gives zeros instead of NaN.
    return (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)


class RankerModel(PreTrainedModel):
    """Encoder over query + candidate, pooled, optionally projected, then a linear layer to num_scores."""

    config_class = RankerConfig
    base_model_prefix = "backbone"
    supports_gradient_checkpointing = True
    # The wrapped encoders support SDPA; without this the whole model falls back to eager attention.
    _supports_sdpa = True

    def __init__(self, config):
        super().__init__(config)
        encoder_config = backbone_config(config)
        self.backbone_type = encoder_config.model_type
        if self.backbone_type == "t5":
            # AutoModel would build the encoder-decoder T5Model; a ranker reads with the encoder only.
            self.backbone = T5EncoderModel(encoder_config)
            d_model = encoder_config.d_model
        else:
            extra = {"add_pooling_layer": config.backbone_pooler} if self.backbone_type in POOLER_MODEL_TYPES else {}
            self.backbone = AutoModel.from_config(encoder_config, **extra)
            d_model = encoder_config.dim if self.backbone_type == "distilbert" else encoder_config.hidden_size
        self.pooling = config.pooling
        if config.projection_dim == 0:
            self.projection = None
            width = d_model
        else:
            width = d_model if config.projection_dim == -1 else config.projection_dim
            self.projection = nn.Linear(d_model, width, bias=False)
        self.score = nn.Linear(width, config.num_scores)
        self.post_init()

    def _init_weights(self, module):
        """Initialise the head like a dense layer of width d (the backbone initialises itself)."""
        if module is self.projection or module is self.score:
            _init.normal_(module.weight, mean=0.0, std=module.in_features**-0.5)
            if module.bias is not None:
                _init.zeros_(module.bias)

    def get_input_embeddings(self):
        return self.backbone.get_input_embeddings()

    def set_input_embeddings(self, new_embeddings):
        self.backbone.set_input_embeddings(new_embeddings)

    def pool(self, outputs, attention_mask):
        """One vector per input from the encoder outputs, following `self.pooling`."""
        last_hidden, hidden_states = outputs.last_hidden_state, outputs.hidden_states
        if self.pooling == "pooler":
            return outputs.pooler_output
        if self.pooling == "first":
            return last_hidden[:, 0, :]
        if self.pooling == "mean":
            return masked_mean(last_hidden, attention_mask)
        # hidden_states[0] is the embedding output, hidden_states[-2] the output of
        # the second-to-last layer; last_hidden is the final output.
        other = hidden_states[0] if self.pooling == "first_last_avg" else hidden_states[-2]
        return masked_mean((other + last_hidden) / 2.0, attention_mask)

    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, **kwargs):
        """Score (query, candidate) inputs -> raw scores (logits, no sigmoid), [batch] or [batch, num_scores]."""
        if attention_mask is None:
            reference = input_ids if input_ids is not None else kwargs["inputs_embeds"][..., 0]
            attention_mask = torch.ones(reference.shape[:2], dtype=torch.long, device=reference.device)
        if token_type_ids is not None and self.backbone_type in ("bert", "roberta"):
            # T5 and DistilBERT have no token types.
            kwargs["token_type_ids"] = token_type_ids
        need_all = self.pooling in ("first_last_avg", "last2_avg")
        if need_all:
            kwargs["output_hidden_states"] = True
        kwargs["return_dict"] = True
        outputs = self.backbone(input_ids=input_ids, attention_mask=attention_mask, **kwargs)
        vectors = self.pool(outputs, attention_mask)
        if self.projection is not None:
            vectors = self.projection(vectors)
        scores = self.score(vectors)
        return scores[:, 0] if scores.shape[-1] == 1 else scores
