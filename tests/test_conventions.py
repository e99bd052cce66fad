"""Input conventions: what training records, what folders without a record are read with, bad records."""

import json
from pathlib import Path

import pytest

from rankgen_jax.checkpoints import native
from rankgen_jax.checkpoints.convert import folder_conventions, import_checkpoint
from rankgen_jax.data.conventions import PAIR_DEFAULTS, RELEASED, InputConventions
from rankgen_jax.data.source_configs import DataConfig, ExamplesData, ListsData, PairsData
from rankgen_jax.data.sources import training_conventions
from rankgen_jax.errors import RankgenError
from rankgen_jax.pretrained import resolve_model
from rankgen_jax.models.batch_layout import CANDIDATE_LISTS, TRIPLES, BatchLayout


def test_released_conventions_are_the_released_code():
    assert RELEASED.side("prefix") == ("pre ", 512, "start") and RELEASED.side("suffix") == ("suffi ", 128, "start")
    assert RELEASED.truncation == "released"
    assert InputConventions.from_json(RELEASED.to_json(), "x") == RELEASED
    assert RELEASED.replace(prefix_length=None, truncation="clean").truncation == "clean"


def test_bad_conventions_are_named():
    with pytest.raises(RankgenError, match="prefix_keep='end' needs truncation='clean'"):
        InputConventions(prefix_keep="end")
    with pytest.raises(RankgenError, match="suffix_length must be an integer >= 2"):
        InputConventions(suffix_length=0)
    with pytest.raises(RankgenError, match=r"card\.json: unknown input convention\(s\) \['title'\]"):
        InputConventions.from_dict({"title": " | "}, "card.json")
    with pytest.raises(RankgenError, match="format_version 7 is not supported"):
        InputConventions.from_dict({"format_version": 7}, "x")
    with pytest.raises(RankgenError, match="unknown input convention"):
        RELEASED.replace(keep="end")


def test_training_records_how_each_source_reads_text():
    data = DataConfig(ExamplesData(continuation_length=64, prefix_keep="end"), prefix_length=96)
    assert training_conventions(data) == InputConventions(prefix_length=96, suffix_length=64, prefix_keep="end",
                                                          truncation="clean")
    ranker = BatchLayout("cross_encoder", CANDIDATE_LISTS)
    got = training_conventions(DataConfig(ListsData(continuation_length=96), prefix_length=64), ranker)
    assert got.side("prefix") == ("", 64, "end") and got.side("suffix") == ("", 96, "start")
    pairs = training_conventions(DataConfig(PairsData(), prefix_length=100), BatchLayout("dual_encoder", TRIPLES))
    assert pairs.side("prefix") == ("", 100, "start") == pairs.side("suffix")
    joint = training_conventions(DataConfig(PairsData(), prefix_length=101), ranker)
    assert (joint.prefix_length, joint.suffix_length) == (50, 51)


def test_markers_and_kept_end_are_the_data_configs_choice():
    """RankGen's markers unless the data config chooses others; recorded with the model, and what the batches hold."""
    from rankgen_jax.data.lists import ListBatches
    from rankgen_jax.data.text import TokenWindows
    from rankgen_jax.data.sources import make_sources
    from rankgen_jax.data.text import encode_truncated, load_text_encoder
    from rankgen_jax.resources import DEMO_VOCAB

    dual = BatchLayout("dual_encoder", CANDIDATE_LISTS)
    plain = DataConfig(ListsData(prefix_marker="", suffix_marker="", prefix_keep="start"))
    assert training_conventions(plain, dual).side("prefix") == ("", 256, "start")
    assert training_conventions(DataConfig(ListsData()), dual).side("prefix") == ("pre ", 256, "end")
    assert training_conventions(DataConfig(ExamplesData(suffix_marker="passage: "))).side("suffix")[0] == \
        "passage: "
    text = load_text_encoder(DEMO_VOCAB)
    records = [{"query": f"query {i}", "candidates": [f"first {i}", f"second {i}"]} for i in range(4)]
    batch = ListBatches(records, TokenWindows(text, 16, 8, markers=("query: ", "")), 4, dual).batch(0)
    rows = lambda ids: {tuple(int(t) for t in r if t != text.pad_id) for r in ids.reshape(-1, ids.shape[-1])}  # noqa
    assert rows(batch["query_ids"]) <= {tuple(encode_truncated(text, "query: ", r["query"], 16)) for r in records}
    assert rows(batch["candidate_ids"]) <= {tuple(encode_truncated(text, "", c, 8)) for r in records
                                            for c in r["candidates"]}
    # A cross encoder reads the pair together: markers are refused there.
    with pytest.raises(RankgenError, match="reads query and candidate together, without markers"):
        make_sources(DataConfig(ListsData(prefix_marker="q: ")), BatchLayout("cross_encoder", CANDIDATE_LISTS))


def test_sentence_transformers_folders_say_how_they_read(tmp_path):
    """all-MiniLM-L6-v2 states no prompts and max_seq_length 256: that is how it is read, and what import records."""
    minilm = resolve_model("minilm")
    import_checkpoint("hf", minilm, str(tmp_path / "minilm"), model_id="sentence-transformers/all-MiniLM-L6-v2")
    want = InputConventions(prefix_marker="", suffix_marker="", prefix_length=256, suffix_length=256,
                            truncation="clean")
    assert native.load_input_conventions(tmp_path / "minilm") == want
    provenance = native.load_provenance(tmp_path / "minilm")
    assert provenance["license"] == "apache-2.0" and provenance["model_id"] == "sentence-transformers/all-MiniLM-L6-v2"
    config = native.load_model_config(tmp_path / "minilm")
    conventions, origin = folder_conventions(minilm, config)
    assert conventions == want and "sentence-transformers files" in origin
    # Prompts and a left truncation side are read too.
    folder = tmp_path / "st"
    folder.mkdir()
    for name in ("modules.json", "sentence_bert_config.json", "tokenizer_config.json"):
        (folder / name).write_text((Path(minilm) / name).read_text())
    (folder / "config_sentence_transformers.json").write_text(json.dumps(
        {"prompts": {"query": "query: ", "passage": "passage: "}, "default_prompt_name": None}))
    tokenizer = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**tokenizer, "truncation_side": "left"}))
    conventions, _ = folder_conventions(str(folder), config)
    assert conventions.side("prefix") == ("query: ", 256, "end")
    assert conventions.side("suffix") == ("passage: ", 256, "end")


def test_folders_without_a_record_are_read_the_released_way(tmp_path):
    from rankgen_jax.models.configs import ModelConfig

    cross = ModelConfig(kind="cross_encoder")
    assert folder_conventions(str(tmp_path), ModelConfig()) == (RELEASED, "no record: the released RankGen conventions")
    assert folder_conventions(str(tmp_path), cross)[0] == PAIR_DEFAULTS
    (tmp_path / "input_conventions.json").write_text('{"prefix_length": "long"}')
    with pytest.raises(RankgenError, match="input_conventions.json: bad input conventions: prefix_length"):
        folder_conventions(str(tmp_path), ModelConfig())
