"""RankGen's seqio tasks: the bundled demo, PG19, Wikipedia and any folder of documents.

Importing this module registers (again, replacing, on every `register_all()`):

- `rankgen_demo`: InBook negatives over the bundled `data/corpus/` with the
  demo vocabulary `data/vocab/demo_spiece_8k.model`.
- `rankgen_{domain}_{inbook,generative,both,both_alternating}`: the negative
  kinds of `rankgen_jax.data.seqio.tasks` over each domain: the paper's four,
  pg19, wiki, c4_newslike and c4_webtextlike, and `folder` (any documents).
- `rankgen_all` (the paper's "all" model: its four domains, (p, c, g) triples
  with InBook negatives) and `rankgen_all_inbook`, mixtures over the domains;
  `folder` joins them only with a positive `rankgen_mixture_rates.folder`.

Documents shorter than a batch (most Wikipedia and C4 documents against the
paper's 1536) are pooled with the other leftovers of their domain into mixed
batches (`rankgen_task_options.pool_leftovers`, on by default): those batches'
negatives come from other documents of the domain, not from the same one;
each pass logs how many examples were pooled and how many were left out.

Nothing is read at import: data paths, the vocabulary and the example
settings are looked up with gin each time a task is read, so registration never
fails and gin files may bind them after `import tasks`. A task whose path is
unset fails when read, with a RankgenError naming the binding to set:

    rankgen_data_paths.pg19 = "/data/pg19/train"
    rankgen_data_paths.validation = {"pg19": "/data/pg19/validation"}
    rankgen_data_paths.generative_jsonl = {"pg19": "/data/pg19_train_negatives.jsonl"}
    rankgen_task_options.vocab = "/models/t5-v1_1-xl/spiece.model"   # or a tokenizer.json (MiniLM, BERT)
    rankgen_task_options.group_size = 32                             # = the trainer's batch size
    rankgen_mixture_rates.wiki = 0.0                                 # leave a domain out of rankgen_all

Without gin (e.g. in seqio's Beam caching script) the same paths come from the
environment: RANKGEN_PG19, RANKGEN_WIKI, RANKGEN_C4_NEWSLIKE, RANKGEN_C4_WEBTEXTLIKE,
RANKGEN_FOLDER (documents), RANKGEN_{...}_GENERATIVE (JSONL), RANKGEN_{...}_VALIDATION
and RANKGEN_VOCAB.
"""

from __future__ import annotations

import os

import gin

from rankgen_jax.data.examples import ExampleConfig
from rankgen_jax.data.seqio.tasks import (NEGATIVE_CHOICES, TaskGrouping, TaskValidation, reads_documents,
                                          reads_generative, register_mixture, register_rankgen_task)
from rankgen_jax.errors import RankgenError
from rankgen_jax.resources import BUNDLED_CORPUS, DEMO_VOCAB

# The paper's four domains (RankGen Sec. 3.1, "all"), then any folder of documents.
PAPER_DOMAINS = ("pg19", "wiki", "c4_newslike", "c4_webtextlike")
DOMAINS = (*PAPER_DOMAINS, "folder")
_DOMAIN_NAMES = {"pg19": "PG19", "wiki": "Wikipedia", "c4_newslike": "C4-NewsLike", "c4_webtextlike": "C4-WebTextLike",
                 "folder": "folder"}


@gin.configurable
def rankgen_data_paths(
    demo: str = str(BUNDLED_CORPUS),
    pg19: str | list[str] | None = None,
    wiki: str | list[str] | None = None,
    c4_newslike: str | list[str] | None = None,
    c4_webtextlike: str | list[str] | None = None,
    folder: str | list[str] | None = None,
    generative_jsonl: dict[str, str] | None = None,
    validation: dict[str, str | list[str]] | None = None,
    validation_generative_jsonl: dict[str, str] | None = None,
) -> dict:
    """Where each domain's data lives; unset values fall back to RANKGEN_* environment variables.

    pg19 / wiki / c4_newslike / c4_webtextlike / folder: documents (folders, files or lists; see
      documents.read_documents).
    generative_jsonl: {domain: JSONL from `rankgen-jax generate-negatives`}.
    validation / validation_generative_jsonl: {domain: path} read as the validation split; a domain
      without one holds out its last `rankgen_task_options.holdout_documents` documents instead.
    """
    env = os.environ.get
    generative_jsonl, validation = dict(generative_jsonl or {}), dict(validation or {})
    validation_generative_jsonl = dict(validation_generative_jsonl or {})
    documents = {"demo": demo, "pg19": pg19, "wiki": wiki, "c4_newslike": c4_newslike,
                 "c4_webtextlike": c4_webtextlike, "folder": folder}
    for domain in DOMAINS:
        key = f"RANKGEN_{domain.upper()}"
        documents[domain] = documents[domain] or env(key)
        generative_jsonl.setdefault(domain, env(f"{key}_GENERATIVE"))
        validation.setdefault(domain, env(f"{key}_VALIDATION"))
        validation_generative_jsonl.setdefault(domain, env(f"{key}_GENERATIVE_VALIDATION"))
    return {"documents": documents, "generative_jsonl": generative_jsonl, "validation": validation,
            "validation_generative_jsonl": validation_generative_jsonl}


@gin.configurable
def rankgen_task_options(
    vocab: str | None = None,
    prefix_words: int = 256,
    min_continuation_words: int = 10,
    max_continuation_words: int = 128,
    prefix_stride_sentences: int = 0,
    example_seed: int = 0,
    group_size: int = 32,
    holdout_documents: int = 1,
    mix_documents: bool = False,
    shuffle_block_documents: int = 256,
    pool_leftovers: bool = True,
) -> dict:
    """Settings shared by every RankGen task (the paper's: 256-word prefixes, 10-128-word continuations).

    vocab: the model's spiece.model / tokenizer.json / folder (default: RANKGEN_VOCAB, else the demo vocabulary).
    prefix_stride_sentences: 1 starts a prefix at every sentence, the paper's "all possible 256-word prefixes"
      (the recipe gins set it); 0, the default here, cuts non-overlapping prefixes, about 15 times fewer
      examples per document and as much less reading.
    group_size: consecutive same-document examples; set it to the trainer's batch size for in-book batches.
    pool_leftovers: documents shorter than a group (and every document's last partial group) train in mixed
      groups of their domain instead of being dropped; False drops them, as a batch of one document only.
    """
    return {
        "vocab": vocab or os.environ.get("RANKGEN_VOCAB") or str(DEMO_VOCAB),
        "example_config": ExampleConfig(
            prefix_words=prefix_words, min_continuation_words=min_continuation_words,
            max_continuation_words=max_continuation_words, prefix_stride_sentences=prefix_stride_sentences,
            seed=example_seed,
        ),
        "group_size": group_size,
        "holdout_documents": holdout_documents,
        "mix_documents": mix_documents,
        "shuffle_block_documents": shuffle_block_documents,
        "pool_leftovers": pool_leftovers,
    }


@gin.configurable
def rankgen_mixture_rates(pg19: float = 1.0, wiki: float = 1.0, c4_newslike: float = 1.0, c4_webtextlike: float = 1.0,
                          folder: float = 0.0) -> dict[str, float]:
    """Relative rates of the domains in rankgen_all / rankgen_all_inbook (0 leaves a domain out unread).

    The paper's four domains at equal rates (it gives none); `folder` is not one of them and is off.
    """
    return {"pg19": pg19, "wiki": wiki, "c4_newslike": c4_newslike, "c4_webtextlike": c4_webtextlike,
            "folder": folder}


def _option(key: str):
    return lambda: rankgen_task_options()[key]


def _required(task: str, domain: str, what: str):
    """A deferred path that must be set when the task is read."""

    def resolve():
        paths = rankgen_data_paths()
        value = paths["documents"][domain] if what == "documents" else paths[what][domain]
        if not value:
            binding = {
                "documents": f"rankgen_data_paths.{domain} = '/path/to/{domain}'",
                "generative_jsonl": f"rankgen_data_paths.generative_jsonl = {{'{domain}': '/path/negatives.jsonl'}}",
            }[what]
            env = f"RANKGEN_{domain.upper()}" + ("_GENERATIVE" if what == "generative_jsonl" else "")
            noun = "documents" if what == "documents" else "generative-negatives JSONL"
            raise RankgenError(
                f"task {task!r}: no {_DOMAIN_NAMES.get(domain, domain)} {noun} set; bind {binding} in gin "
                f"(or set {env})"
            )
        return value

    return resolve


def _optional(domain: str, what: str):
    return lambda: rankgen_data_paths()[what][domain] or None


def register_all() -> list[str]:
    """Register every RankGen task and mixture (replacing earlier registrations); returns their names."""
    names = []
    vocab = _option("vocab")  # one deferred vocabulary object shared by all tasks, so mixtures see one vocabulary
    grouping = TaskGrouping(_option("group_size"), _option("mix_documents"), _option("shuffle_block_documents"),
                            _option("pool_leftovers"))
    register_rankgen_task(
        "rankgen_demo", lambda: rankgen_data_paths()["documents"]["demo"], vocab, negatives="inbook",
        example_config=_option("example_config"), grouping=grouping,
        validation=TaskValidation(_option("holdout_documents")),
    )
    names.append("rankgen_demo")
    for domain in DOMAINS:
        for negatives in NEGATIVE_CHOICES:
            name = f"rankgen_{domain}_{negatives}"
            register_rankgen_task(
                name,
                _required(name, domain, "documents") if reads_documents(negatives) else None,
                vocab,
                negatives=negatives,
                example_config=_option("example_config"),
                generative_negatives_jsonl=(
                    _required(name, domain, "generative_jsonl") if reads_generative(negatives) else None
                ),
                grouping=grouping,
                validation=TaskValidation(
                    _option("holdout_documents"),
                    _optional(domain, "validation") if reads_documents(negatives) else None,
                    _optional(domain, "validation_generative_jsonl") if reads_generative(negatives) else None,
                ),
            )
            names.append(name)
    for mixture, negatives in (("rankgen_all", "both"), ("rankgen_all_inbook", "inbook")):
        register_mixture(
            mixture,
            [f"rankgen_{domain}_{negatives}" for domain in DOMAINS],
            [lambda task, domain=domain: rankgen_mixture_rates()[domain] for domain in DOMAINS],
        )
        names.append(mixture)
    return names


TASK_NAMES = register_all()
