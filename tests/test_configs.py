"""Named model sizes, gin files and the JSON form of model configs."""

import gin
import pytest

from rankgen_jax.models.configs import T5_1_1_SIZES, HeadConfig, ModelConfig, T5Config, t5_config
from rankgen_jax.errors import RankgenError
from rankgen_jax.data.vocab import REPO_ROOT


@pytest.mark.parametrize("size", sorted(T5_1_1_SIZES))
def test_gin_model_files(size):
    gin.clear_config()
    try:
        gin.parse_config_file(str(REPO_ROOT / "gin_configs" / "models" / f"t5_1_1_{size}.gin"))
        config = ModelConfig()
    finally:
        gin.clear_config()
    assert config.encoder == t5_config(size)
    assert config.encoder.mlp_activation == "gated-gelu"
    assert config.head == HeadConfig("first", -1, False)


def test_xl_matches_design_numbers():
    xl = t5_config("xl")
    assert (xl.d_model, xl.d_ff, xl.num_layers, xl.num_heads, xl.d_kv, xl.vocab_size) == (2048, 5120, 24, 32, 64, 32128)
    assert t5_config("base", version="1.0").mlp_activation == "relu"


def test_json_round_trip_and_errors():
    config = ModelConfig(encoder=t5_config("tiny", dtype="bfloat16"), head=HeadConfig("mean", 16, True))
    assert ModelConfig.from_json(config.to_json()) == config
    assert ModelConfig.from_json(ModelConfig(head=None).to_json()).head is None
    with pytest.raises(RankgenError, match="not valid JSON"):
        ModelConfig.from_json("{", where="x.json")
    with pytest.raises(RankgenError, match="malformed"):
        ModelConfig.from_json('{"encoder": {"d_model": 4, "bogus": 1}}', where="x.json")
    with pytest.raises(RankgenError, match="size"):
        t5_config("huge")
    with pytest.raises(RankgenError, match="mlp_activation"):
        T5Config(mlp_activation="swish")
    with pytest.raises(RankgenError, match="pooling"):
        HeadConfig(pooling="max")


@pytest.mark.parametrize("name", ["demo_minilm.gin", "demo_t5_scratch.gin", "rankgen_t5_tiny_books.gin", "rankgen_t5_xl_paper.gin",
                                  "retrieval_t5_tiny_tevatron.gin", "retrieval_minilm.gin", "ranker_minilm.gin"])
def test_shipped_gin_configs_parse(name):
    from rankgen_jax.data.source_configs import DataConfig
    from rankgen_jax.experiments.gin_runs import experiment_configurables
    from rankgen_jax.train.gin_parsing import parse_gin
    from rankgen_jax.train.config import TrainerConfig

    parse_gin([name], [], experiment_configurables)
    assert TrainerConfig().num_steps > 0 and DataConfig().batch_size > 0


def test_each_source_has_its_own_config_class():
    """DataConfig holds the source's config object and the fields every source reads; each source's class is a
    gin configurable of its own, and the table of where an earlier version's flat fields went is built from them."""
    import dataclasses

    import gin

    from rankgen_jax.data.source_configs import MOVED_DATA_FIELDS, SOURCES, SOURCE_CONFIGS, DataConfig, source_fields
    from rankgen_jax.errors import RankgenError

    assert [f.name for f in dataclasses.fields(DataConfig)] == ["source", "batch_size", "prefix_length", "seed"]
    assert SOURCES == ("examples", "seqio", "books", "random", "lists", "pairs", "retrieval")
    for kind, cls in SOURCE_CONFIGS.items():
        assert cls.kind == kind and cls.__dataclass_params__.frozen
        assert gin.config._REGISTRY.get_match(cls.__name__) is not None  # noqa: SLF001 - bindable by name
        for field in source_fields(cls):
            assert kind in MOVED_DATA_FIELDS[field]
    assert not set(MOVED_DATA_FIELDS) & {"source", "batch_size", "prefix_length", "seed"}
    with pytest.raises(RankgenError, match=r"DataConfig.source='retrieval': a source is now its config object, "
                                           r"DataConfig.source = @RetrievalData\(\)"):
        DataConfig(source="retrieval")
    with pytest.raises(RankgenError, match=r"one of @ExamplesData\(\), @SeqioData\(\)"):
        DataConfig(source="bm25")
    with pytest.raises(RankgenError, match=r"RetrievalData.hard_negatives = 'many': expected int, got str"):
        SOURCE_CONFIGS["retrieval"](hard_negatives="many")
    # A list stands for the tuple gin writes it as.
    assert DataConfig(SOURCE_CONFIGS["examples"](holdout_ids=["a"])).source.holdout_ids == ["a"]


