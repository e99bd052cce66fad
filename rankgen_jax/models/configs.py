"""Model configurations: T5 encoder sizes, dual-encoder heads, and their JSON form.

A checkpoint folder stores its `ModelConfig` as JSON, so every tool that reads
a checkpoint builds exactly the model that wrote it.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import gin

from rankgen_jax.errors import RankgenError, check_field_types
from rankgen_jax.models.precision import check_activation_dtype

MLP_ACTIVATIONS = ("gated-gelu", "relu")
# Poolings over the encoder's hidden states (any encoder, any model kind).
POOLINGS = ("first", "mean", "first_last_avg", "last2_avg")
# BERT / RoBERTa's pooler output, tanh(dense(first token)): the first layer of HF's
# *ForSequenceClassification heads; cross encoders whose encoder has a pooler only.
POOLER_POOLING = "pooler"
HEAD_POOLINGS = (*POOLINGS, POOLER_POOLING)
BERT_VARIANTS = ("bert", "distilbert", "roberta")
BERT_ACTIVATIONS = ("gelu", "gelu_new", "relu")
MODEL_KINDS = ("encoder", "dual_encoder", "cross_encoder")


@gin.configurable
@dataclasses.dataclass(frozen=True)
class T5Config:
    """Hyper-parameters of a T5 encoder (T5 1.0 with `relu`, T5 1.1 with `gated-gelu`)."""

    vocab_size: int = 32128
    d_model: int = 512
    d_ff: int = 1024
    num_layers: int = 8
    num_heads: int = 6
    d_kv: int = 64
    mlp_activation: str = "gated-gelu"
    relpos_buckets: int = 32
    relpos_max_distance: int = 128
    dropout_rate: float = 0.0
    layer_norm_eps: float = 1e-6
    pad_id: int = 0
    eos_id: int = 1
    # Activation dtype (models.precision): `auto` is bfloat16 on GPU / TPU and float32 on CPU;
    # parameters and optimizer state stay float32.
    dtype: str = "auto"
    remat: bool = False
    scan_layers: bool = False

    def __post_init__(self):
        check_field_types(self)
        check_activation_dtype(self.dtype, "T5Config.dtype")
        if self.mlp_activation not in MLP_ACTIVATIONS:
            raise RankgenError(
                f"T5Config.mlp_activation={self.mlp_activation!r}: expected one of {MLP_ACTIVATIONS}")
        for name in ("vocab_size", "d_model", "d_ff", "num_layers", "num_heads", "d_kv",
                     "relpos_buckets", "relpos_max_distance"):
            if getattr(self, name) <= 0:
                raise RankgenError(f"T5Config.{name} must be positive, got {getattr(self, name)}")


# T5 1.1 sizes (docs/design/models.md, 'T5 encoder'). `tiny` is for tests only.
T5_1_1_SIZES: dict[str, dict[str, int]] = {
    "tiny": dict(d_model=128, d_ff=512, num_layers=2, num_heads=4, d_kv=32),
    "small": dict(d_model=512, d_ff=1024, num_layers=8, num_heads=6, d_kv=64),
    "base": dict(d_model=768, d_ff=2048, num_layers=12, num_heads=12, d_kv=64),
    "large": dict(d_model=1024, d_ff=2816, num_layers=24, num_heads=16, d_kv=64),
    "xl": dict(d_model=2048, d_ff=5120, num_layers=24, num_heads=32, d_kv=64),
    "xxl": dict(d_model=4096, d_ff=10240, num_layers=24, num_heads=64, d_kv=64),
}

# T5 1.0 sizes (ReLU MLP).
T5_1_0_SIZES: dict[str, dict[str, int]] = {
    "tiny": dict(d_model=128, d_ff=512, num_layers=2, num_heads=4, d_kv=32),
    "small": dict(d_model=512, d_ff=2048, num_layers=6, num_heads=8, d_kv=64),
    "base": dict(d_model=768, d_ff=3072, num_layers=12, num_heads=12, d_kv=64),
    "large": dict(d_model=1024, d_ff=4096, num_layers=24, num_heads=16, d_kv=64),
    "3b": dict(d_model=1024, d_ff=16384, num_layers=24, num_heads=32, d_kv=128),
    "11b": dict(d_model=1024, d_ff=65536, num_layers=24, num_heads=128, d_kv=128),
}


@gin.configurable
def t5_config(size: str = "small", version: str = "1.1", **overrides: Any) -> T5Config:
    """Named T5 encoder size (`tiny` ... `xxl`), with field overrides."""
    table = {"1.1": T5_1_1_SIZES, "1.0": T5_1_0_SIZES}.get(version)
    if table is None:
        raise RankgenError(f"unknown T5 version {version!r}: expected '1.0' or '1.1'")
    if size not in table:
        raise RankgenError(f"unknown T5 {version} size {size!r}: expected one of {sorted(table)}")
    activation = "gated-gelu" if version == "1.1" else "relu"
    return T5Config(**{"mlp_activation": activation, **table[size], **overrides})


@gin.configurable
@dataclasses.dataclass(frozen=True)
class BertConfig:
    """Hyper-parameters of a BERT-family encoder (post-LN, absolute positions).

    variant: `bert` (also MiniLM), `distilbert` (no token types, no pooler),
      `roberta` (positions offset past the padding index: position_offset =
      pad_id + 1, and padding positions get pad_id).
    Field names shared with T5Config (d_model, num_layers, num_heads,
    dropout_rate, dtype, remat) mean the same thing.
    """

    variant: str = "bert"
    vocab_size: int = 30522
    d_model: int = 384
    d_ff: int = 1536
    num_layers: int = 6
    num_heads: int = 12
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    hidden_act: str = "gelu"
    pad_id: int = 0
    position_offset: int = 0
    has_pooler: bool = True
    dropout_rate: float = 0.0
    dtype: str = "auto"
    remat: bool = False
    scan_layers: bool = False

    def __post_init__(self):
        check_field_types(self)
        check_activation_dtype(self.dtype, "BertConfig.dtype")
        if self.variant not in BERT_VARIANTS:
            raise RankgenError(f"BertConfig.variant={self.variant!r}: expected one of {BERT_VARIANTS}")
        if self.hidden_act not in BERT_ACTIVATIONS:
            raise RankgenError(f"BertConfig.hidden_act={self.hidden_act!r}: expected one of {BERT_ACTIVATIONS}")
        if self.d_model % self.num_heads:
            raise RankgenError(f"BertConfig.d_model={self.d_model} is not divisible by num_heads={self.num_heads}")
        if self.scan_layers:
            raise RankgenError("BertConfig.scan_layers is not supported (BERT-family encoders are unrolled)")

    @property
    def d_kv(self) -> int:
        return self.d_model // self.num_heads


# all-MiniLM-L6-v2 (the pretrained encoder the demo starts from).
MINILM_L6 = BertConfig()


@gin.configurable
@dataclasses.dataclass(frozen=True)
class HeadConfig:
    """Turns encoder hidden states into one vector per input.

    pooling: one of POOLINGS, or `pooler` (cross encoders on a BERT / RoBERTa
      encoder with has_pooler: the encoder's pooler output, as HF's
      Bert/RobertaForSequenceClassification read the first token).
    projection_dim: -1 projects d -> d_model, 0 means no projection,
      any other value projects d -> projection_dim (bias-free).
    """

    pooling: str = "first"
    projection_dim: int = -1
    l2_normalize: bool = False

    def __post_init__(self):
        check_field_types(self)
        if self.pooling not in HEAD_POOLINGS:
            raise RankgenError(f"HeadConfig.pooling={self.pooling!r}: expected one of {HEAD_POOLINGS}")
        if self.projection_dim < -1:
            raise RankgenError(f"HeadConfig.projection_dim must be -1, 0 or positive, got {self.projection_dim}")

    def output_dim(self, d_model: int) -> int:
        return d_model if self.projection_dim in (-1, 0) else self.projection_dim


# RankGen: first token -> projection d -> d, no normalisation (docs/design/checkpoints.md, 'RankGen format').
RANKGEN_HEAD = HeadConfig(pooling="first", projection_dim=-1, l2_normalize=False)
# Sentence-T5 / t5x_retrieval: mean over non-pad -> projection -> L2.
ST5_HEAD = HeadConfig(pooling="mean", projection_dim=-1, l2_normalize=True)


EncoderConfig = T5Config | BertConfig
_ENCODER_TYPES = {"t5": T5Config, "bert": BertConfig}


@gin.configurable
@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """What a checkpoint holds: an encoder, plus a head for dual or cross encoders.

    kind: `encoder` (bare, head None), `dual_encoder` (vector head; score = dot
      product) or `cross_encoder` (query and candidate read together; the head
      pools and a linear layer gives `num_scores` scores). Defaults from head.
    shared_towers: dual encoders only; False gives queries and documents
      separate encoders (DKMR^2, CL-DRD), each with its own head.
    num_scores: cross encoders: outputs per pair (N > 1: one per perspective,
      MPTS); dual encoders: N > 1 gives N perspective projections, [..., N, D].
    """

    encoder: EncoderConfig = dataclasses.field(default_factory=T5Config)
    head: HeadConfig | None = RANKGEN_HEAD
    kind: str = ""
    shared_towers: bool = True
    num_scores: int = 1

    def __post_init__(self):
        check_field_types(self)
        if not self.kind:
            object.__setattr__(self, "kind", "encoder" if self.head is None else "dual_encoder")
        if self.kind not in MODEL_KINDS:
            raise RankgenError(f"ModelConfig.kind={self.kind!r}: expected one of {MODEL_KINDS}")
        if (self.kind == "encoder") != (self.head is None):
            raise RankgenError(f"ModelConfig.kind={self.kind!r} {'takes no' if self.kind == 'encoder' else 'needs a'} head")
        if self.num_scores < 1:
            raise RankgenError(f"ModelConfig.num_scores must be >= 1, got {self.num_scores}")
        if self.head is not None and self.head.pooling == POOLER_POOLING and self.kind != "cross_encoder":
            _refuse_pooler(self)
        # Whether the encoder has a pooler is checked when a model is built (check_head_fits_encoder): a run from
        # a checkpoint takes its encoder from there, whatever encoder the gin config would build.

    def check_head_fits_encoder(self) -> None:
        """The head can read this encoder: a `pooler` head needs a BERT / RoBERTa encoder that has one."""
        encoder = self.encoder
        if self.head is not None and self.head.pooling == POOLER_POOLING and not (
                self.kind == "cross_encoder" and isinstance(encoder, BertConfig) and encoder.has_pooler):
            _refuse_pooler(self)

    @property
    def encoder_type(self) -> str:
        return "bert" if isinstance(self.encoder, BertConfig) else "t5"

    def to_json_dict(self) -> dict[str, Any]:
        return {
            "encoder_type": self.encoder_type,
            "encoder": dataclasses.asdict(self.encoder),
            "head": None if self.head is None else dataclasses.asdict(self.head),
            "kind": self.kind,
            "shared_towers": self.shared_towers,
            "num_scores": self.num_scores,
        }

    @classmethod
    def from_json_dict(cls, data: dict[str, Any], where: str = "model config") -> "ModelConfig":
        encoder_type = data.get("encoder_type", "t5")
        if encoder_type not in _ENCODER_TYPES:
            raise RankgenError(f"{where}: unsupported encoder_type {encoder_type!r}")
        try:
            encoder = _ENCODER_TYPES[encoder_type](**data["encoder"])
            head = None if data.get("head") is None else HeadConfig(**data["head"])
            extra = {k: data[k] for k in ("kind", "shared_towers", "num_scores") if k in data}
        except (KeyError, TypeError) as e:
            raise RankgenError(f"{where}: malformed model config ({e})") from None
        config = cls(encoder=encoder, head=head, **extra)
        config.check_head_fits_encoder()
        return config

    def to_json(self) -> str:
        return json.dumps(self.to_json_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str, where: str = "model config") -> "ModelConfig":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise RankgenError(f"{where}: not valid JSON ({e})") from None
        return cls.from_json_dict(data, where)


def _refuse_pooler(config: "ModelConfig"):
    encoder = config.encoder
    got = (f"{encoder.variant} encoder with has_pooler={encoder.has_pooler}"
           if isinstance(encoder, BertConfig) else "T5 encoder")
    raise RankgenError(f"HeadConfig.pooling={POOLER_POOLING!r} reads the BERT / RoBERTa pooler: it needs"
                       f" a cross encoder whose encoder has one (got kind={config.kind!r}, a {got})")
