"""Model cards: front matter the hub's own parser reads, for each kind of model; the front-matter reader."""

import dataclasses
import pytest

from rankgen_jax.checkpoints.model_card import CardFacts, read_front_matter, render_card
from rankgen_jax.data.conventions import PAIR_DEFAULTS, RELEASED
from rankgen_jax.models.configs import BertConfig, ModelConfig

hub = pytest.importorskip("huggingface_hub")


def test_front_matter_reader(tmp_path):
    card = tmp_path / "README.md"
    card.write_text('---\nlicense: apache-2.0\nbase_model: "a/b"\ntags:\n- x\n- \'y z\'\n---\n# T\n')
    assert read_front_matter(card) == {"license": "apache-2.0", "base_model": "a/b", "tags": ["x", "y z"]}
    for text in ("# no front matter\n", "---\nlicense: [unclosed\n---\n"):
        card.write_text(text)
        assert read_front_matter(card) == {}
    card.write_bytes(b"---\nlicense: \xff\n---\n")
    assert read_front_matter(card) == {}


@pytest.mark.parametrize("kind, library, pipeline", [("cross_encoder", "transformers", "text-ranking"),
                                                     ("dual_encoder", "sentence-transformers", "sentence-similarity")])
def test_cards_parse_as_hub_metadata(tmp_path, kind, library, pipeline):
    config = ModelConfig(encoder=BertConfig(), kind=kind)
    facts = CardFacts(model_config=config, conventions=PAIR_DEFAULTS if kind == "cross_encoder" else RELEASED,
                      layout="test layout", library=library, st_limits=("a limit",), step=0,
                      provenance={"imported_from": "/x", "source_format": "hf", "license": "mit", "model_id": "o/m"})
    (tmp_path / "README.md").write_text(render_card(facts, "m"))
    meta = hub.ModelCard.load(tmp_path / "README.md").data.to_dict()
    assert meta["library_name"] == library and meta["pipeline_tag"] == pipeline
    assert meta["license"] == "mit" and meta["base_model"] == "o/m"
    assert "- a limit" in (tmp_path / "README.md").read_text()


@pytest.mark.parametrize("key", ["by_genre_table", "by_kind_table"])  # by_kind_table: results.json of earlier versions
def test_card_carries_the_jobs_per_genre_comparison(key):
    table = "| genre | n | negatives |\n|---|---|---|\n| plays | 6 | vs 1 |\n"
    facts = CardFacts(model_config=ModelConfig(encoder=BertConfig()), conventions=RELEASED, layout="l",
                      library="sentence-transformers", st_limits=(), step=3, provenance={}, operative_gin="a = 1",
                      results={"fine_tuned": {"n": 6, "accuracy_2way": 0.5}, key: table},
                      results_path="/r/results.json")
    card = render_card(facts, "m")
    assert "| fine_tuned | 6 | 0.5 |" in card
    assert "Per genre of held-out text, against the starting model read at each prefix length" in card
    assert card.index("| fine_tuned | 6 | 0.5 |") < card.index(table.rstrip())


def test_cards_show_the_settings_that_mattered_without_local_paths():
    """Whole multi-line bindings, the data source's settings, and no path of the machine that ran it; a run of an
    earlier version, whose one DataConfig held every source's fields, shows those of its source only."""
    from rankgen_jax.resources import BUNDLED_CORPUS, DEMO_VOCAB

    operative = "\n".join([
        "import rankgen_jax.data.sources", "",
        "# Parameters for DataConfig:", "# " + "=" * 40,
        "DataConfig.batch_size = 32",
        f"DataConfig.corpus = '{BUNDLED_CORPUS}'",
        "DataConfig.holdout_ids = \\", "    ['novels/moby_dick.txt',", "     'plays/coriolanus.txt']",
        "DataConfig.list_size = 0", "DataConfig.retrieval_corpus = ''", "DataConfig.source = 'examples'",
        f"DataConfig.vocab = '{DEMO_VOCAB}'", "DataConfig.task = ''",
        "TrainerConfig.init_checkpoint = '/home/someone/runs/demo/init'", "TrainerConfig.num_steps = 100",
    ])
    facts = CardFacts(model_config=ModelConfig(encoder=BertConfig()), conventions=RELEASED, layout="l",
                      library="sentence-transformers", st_limits=(), step=3, operative_gin=operative,
                      provenance={"trained_from": "/home/someone/runs/demo/init", "base_model": "o/m"},
                      results={"fine_tuned": {"n": 6, "accuracy_2way": 0.5}},
                      results_path="/home/someone/runs/demo/results.json")
    card = render_card(facts, "m")
    assert "/home/someone" not in card and str(BUNDLED_CORPUS) not in card and str(DEMO_VOCAB) not in card
    assert "DataConfig.corpus = 'data/corpus'" in card and "DataConfig.vocab = 'data/vocab/demo_spiece_8k.model'" in card
    assert "TrainerConfig.init_checkpoint = '<local>/demo/init'" in card and "Fine-tuned from `<local>/demo/init`" in card
    assert "DataConfig.holdout_ids = \\\n    ['novels/moby_dick.txt',\n     'plays/coriolanus.txt']" in card
    # Fields of other sources (lists, retrieval, seqio) are left out, here and in the operative config shown.
    for other in ("list_size", "retrieval_corpus", "DataConfig.task"):
        assert other not in card
    assert "`results.json`" in card and "Parameters for DataConfig" not in card
    # Now: the source's own class, named by DataConfig.source, holds its settings.
    operative = "\n".join([
        "import rankgen_jax.data.sources", "",
        "DataConfig.batch_size = 32", "DataConfig.source = @ExamplesData()",
        f"ExamplesData.corpus = '{BUNDLED_CORPUS}'", "ExamplesData.prefix_words = 128",
        "ListsData.list_size = 0", "TrainerConfig.num_steps = 100",
    ])
    card = render_card(dataclasses.replace(facts, operative_gin=operative), "m")
    data = card[card.index("Data (from the run's operative gin config)"):card.index("Loss and schedule")]
    assert "DataConfig.source = @ExamplesData()" in data and "ExamplesData.prefix_words = 128" in data
    assert "ExamplesData.corpus = 'data/corpus'" in data and "ListsData" not in data
    # A plain encode() reads documents: the card says so.
    assert "A plain `model.encode(texts)` reads the texts as documents" in card
