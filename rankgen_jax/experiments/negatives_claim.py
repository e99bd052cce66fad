"""RankGen's claim about negatives, measured at CPU scale with a real LM: rankers trained on InBook negatives,
on generative negatives, and on both, each scored on held-out books against InBook negatives and against the
LM's own continuations of the held-out prefixes (the paper's "human vs machine" setting, Sec. 2.1, Tables 1-2).

The stages, each resumed when its output is there:

1. **prefixes**: `train_groups` groups of `DataConfig.batch_size` training examples, each group from one
   training document (documents taken in turn, so the groups spread over the corpus), and `eval_items`
   held-out items (gold + `eval_negatives` InBook negatives), drawn from the held-out documents as the
   demo draws them;
2. **negatives**: the LM continues every training and held-out prefix (`generate-negatives`, nucleus
   p = 0.9, each sample cut to its gold's length; the prompt is the prefix's last `lm_prompt_tokens` tokens);
3. **rankers**: the same starting model trained the same `steps` three ways: "inbook" (the demo's data:
   examples cut from every training document, same-document batches), "generative" (the (p, c, g) triples
   in batches mixed across documents: no InBook negative) and "both" (the triples in same-document
   batches: the generated negative and the batch's InBook golds);
4. **scores**: every ranker, the starting model (zero-shot), unigram overlap and a length-only scorer on
   gold vs its InBook negatives and gold vs the LM's continuation, with paired differences.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import gin
import numpy as np

from rankgen_jax.checkpoints.run_folder import RunFolder
from rankgen_jax.data.jsonl import read_jsonl, write_jsonl
from rankgen_jax.data.source_configs import DataConfig
from rankgen_jax.data.sources import corpus_split, example_config_of, training_conventions
from rankgen_jax.data.example_source import build_examples
from rankgen_jax.data.sentences import word_count
from rankgen_jax.errors import RankgenError
from rankgen_jax.eval.suffix_comparison import accuracy_and_se, paired_gain, top1_wins
from rankgen_jax.experiments.demo import held_out_suffix_sets, score_at_prefix_lengths
from rankgen_jax.experiments.job_folder import JobFolder
from rankgen_jax.experiments.stages import is_done, log, mark_done, starting_checkpoint
from rankgen_jax.lm.generative_negatives import NegativeSampling, generate_negatives
from rankgen_jax.pretrained import GEMMA
from rankgen_jax.retrieval.sparse import unigram_overlap_scores
from rankgen_jax.train.config import TrainerConfig
from rankgen_jax.train.loop import train

RANKERS = ("inbook", "generative", "both")
# The two evaluations: gold against its InBook negatives, and gold against the LM's continuation.
KINDS = ("inbook", "machine")
TABLE_FILE = "negatives_table.md"


class ClaimFolder(JobFolder):
    """Where negatives-claim keeps each of its outputs under `workdir` (generation-claim reads two of them)."""

    def prefixes(self, split: str) -> Path:
        """The prefixes the LM continues: "train" (whole document groups) or "eval" (the held-out items')."""
        return self.root / f"{split}_prefixes.jsonl"

    @property
    def eval_items(self) -> Path:
        """The held-out items, gold first, then InBook negatives."""
        return self.root / "eval_items.jsonl"

    @property
    def eval_generated(self) -> Path:
        """The held-out prefixes with the LM's continuation (generate-negatives' output)."""
        return self.root / "eval_generated.jsonl"

    @property
    def train_triples(self) -> Path:
        """The training prefixes with gold and generated continuations: the (p, c, g) triples."""
        return self.root / "train_triples.jsonl"

    def ranker(self, name: str) -> RunFolder:
        """The training run of the ranker trained on `name` negatives (one of RANKERS)."""
        return self.model(f"ranker_{name}")

    @property
    def table(self) -> Path:
        return self.root / TABLE_FILE


@gin.configurable
@dataclasses.dataclass(frozen=True)
class NegativesClaimConfig:
    """The claim's sizes (see the module docstring); the data and training settings are the demo's
    DataConfig / TrainerConfig / OptimizerConfig, with `steps` for every ranker."""

    lm: str = GEMMA
    init_from_hf: str = "minilm"
    init_checkpoint: str = ""
    train_groups: int = 10
    eval_items: int = 120
    eval_negatives: int = 10
    steps: int = 80
    lm_prompt_tokens: int = 128
    lm_max_new_tokens: int = 192
    lm_batch_size: int = 16
    lm_device: str = "cpu"
    seed: int = 0

    def __post_init__(self):
        for name in ("train_groups", "eval_items", "eval_negatives", "steps", "lm_prompt_tokens",
                     "lm_max_new_tokens", "lm_batch_size"):
            if getattr(self, name) < 1:
                raise RankgenError(f"NegativesClaimConfig.{name} must be at least 1, got {getattr(self, name)}")


def training_prefixes(data: DataConfig, groups: int, seed: int) -> list[dict]:
    """`groups` groups of `data.batch_size` examples of the training documents, one document each, taken from
    the documents in turn (a seeded order); records {id, doc_id, prefix, continuation} in group order."""
    (train_docs, _), _ = corpus_split(data.source)
    examples, _ = build_examples(train_docs, example_config_of(data))
    by_document: dict[str, list] = {}
    for example in examples:
        by_document.setdefault(example.doc_id, []).append(example)
    rng = np.random.default_rng(seed)
    cuts = {}
    for doc_id in sorted(by_document):
        rows = by_document[doc_id]
        order = rng.permutation(len(rows))
        cuts[doc_id] = [[rows[i] for i in order[k: k + data.batch_size]]
                        for k in range(0, len(rows) - data.batch_size + 1, data.batch_size)]
    documents = [d for d in sorted(cuts) if cuts[d]]
    if not documents:
        raise RankgenError(f"no training document has {data.batch_size} examples for a group")
    documents = [documents[i] for i in rng.permutation(len(documents))]
    chosen = []
    for round_ in range(max(len(c) for c in cuts.values())):
        for doc_id in documents:
            if round_ < len(cuts[doc_id]) and len(chosen) < groups:
                chosen.append(cuts[doc_id][round_])
    if len(chosen) < groups:
        raise RankgenError(f"the training documents hold {len(chosen)} groups of {data.batch_size}, not {groups}")
    return [{"id": f"{group[0].doc_id}#g{g}#{k}", "doc_id": e.doc_id, "prefix": e.prefix,
             "continuation": e.continuation} for g, group in enumerate(chosen) for k, e in enumerate(group)]


def held_out_items(data: DataConfig, count: int, negatives: int, seed: int) -> list[dict]:
    """`count` held-out items (the demo's: gold first, then InBook negatives), drawn at random over genres."""
    items = held_out_suffix_sets(data, count, negatives)
    rng = np.random.default_rng(seed)
    chosen = sorted(rng.choice(len(items), size=min(count, len(items)), replace=False))
    return [{"id": f"{items[i]['doc_id']}#{i}", **items[i]} for i in chosen]


def length_only_scores(candidates: list[str]) -> np.ndarray:
    """A scorer that knows only length: longer scores higher (ties: the first candidate, the gold, loses)."""
    return np.array([word_count(c) - (1e-9 if k == 0 else 0.0) for k, c in enumerate(candidates)])


def _items_by_kind(folder: ClaimFolder) -> dict[str, list[dict]]:
    items = read_jsonl(folder.eval_items)
    generated = {r["id"]: r["generative_negative"] for r in read_jsonl(folder.eval_generated)}
    machine = [{"prefix": it["prefix"], "candidates": [it["candidates"][0], generated[it["id"]]]}
               for it in items if it["id"] in generated]
    return {"inbook": items, "machine": machine}


def _wins(score_lists: list[np.ndarray], num_candidates: int | None = None) -> list[float]:
    """Each item's win of the gold (candidate 0) among its first num_candidates, as JSON numbers."""
    return [float(w) for w in top1_wins(score_lists, num_candidates)]


def run_negatives_claim(workdir: str) -> dict:
    """The four stages of the module docstring; returns results.json's content."""
    cfg, data, trainer = NegativesClaimConfig(), DataConfig(), TrainerConfig()
    if data.source.kind != "examples":
        raise RankgenError("the claim trains on RankGen examples (DataConfig.source = @ExamplesData()), not "
                           f"@{type(data.source).__name__}()")
    folder = ClaimFolder(workdir)
    root = folder.root
    root.mkdir(parents=True, exist_ok=True)
    results = folder.read_results()
    started = time.time()

    if not folder.prefixes("train").is_file():
        write_jsonl(folder.prefixes("train"), training_prefixes(data, cfg.train_groups, cfg.seed))
    if not folder.eval_items.is_file():
        items = held_out_items(data, cfg.eval_items, cfg.eval_negatives, cfg.seed)
        write_jsonl(folder.eval_items, items)
        write_jsonl(folder.prefixes("eval"), ({"id": it["id"], "doc_id": it["doc_id"], "prefix": it["prefix"],
                                              "continuation": it["candidates"][0]} for it in items))
    sampling = NegativeSampling(batch_size=cfg.lm_batch_size, max_new_tokens=cfg.lm_max_new_tokens,
                                max_prompt_tokens=cfg.lm_prompt_tokens, seed=cfg.seed, length_match="gold")
    for split, out, path in (("train", "train_triples", folder.train_triples),
                             ("eval", "eval_generated", folder.eval_generated)):
        if f"negatives_{out}" not in results:
            log("negatives-claim", f"sampling {out} with {cfg.lm}")
            results[f"negatives_{out}"] = generate_negatives(cfg.lm, str(folder.prefixes(split)), str(path), sampling,
                                                             device=cfg.lm_device)
            folder.write_results(results)

    init = starting_checkpoint(cfg.init_checkpoint, cfg.init_from_hf, folder)
    trainer = dataclasses.replace(trainer, init_checkpoint=str(init), num_steps=cfg.steps, max_minutes=0.0)
    triples = str(folder.train_triples)
    datas = {"inbook": data,
             "generative": data.with_source(train_file=triples, same_document=False, with_negative=True),
             "both": data.with_source(train_file=triples, same_document=True, with_negative=True)}
    for name in RANKERS:
        run = folder.ranker(name)
        if not is_done(run):
            log("negatives-claim", f"training the {name} ranker, {cfg.steps} steps")
            results[f"train_{name}"] = train(run, trainer=trainer, data=datas[name])
            mark_done(run)
            folder.write_results(results)

    by_kind = _items_by_kind(folder)
    scores = results.setdefault("wins", {})
    conventions = training_conventions(data)
    for name in ("unigram", "length", "zero_shot", *RANKERS):
        if name in scores:
            continue
        # Both kinds' items in one pass, so a model is loaded and its encoder compiled once.
        items = [it for kind in KINDS for it in by_kind[kind]]
        if name == "unigram":
            lists = [unigram_overlap_scores(it["prefix"], it["candidates"]) for it in items]
        elif name == "length":
            lists = [length_only_scores(it["candidates"]) for it in items]
        else:
            path = str(init) if name == "zero_shot" else str(folder.ranker(name))
            lists = score_at_prefix_lengths(path, items, conventions if name == "zero_shot" else None, [None])[None]
        scores[name], start = {}, 0
        for kind in KINDS:
            part = lists[start: start + len(by_kind[kind])]
            start += len(by_kind[kind])
            scores[name][kind] = {"all": _wins(part), "vs1": _wins(part, 2)}
        folder.write_results(results)
    triples_read = read_jsonl(folder.train_triples)
    results["lengths"] = {"train_gold_words": float(np.mean([word_count(r["continuation"]) for r in triples_read])),
                          "train_generated_words": float(np.mean([word_count(r["generative_negative"])
                                                                  for r in triples_read]))}
    results["table"] = table_markdown(results)
    folder.table.write_text(results["table"], encoding="utf-8")
    results["seconds"] = results.get("seconds", 0.0) + time.time() - started
    folder.write_results(results)
    print(results["table"], flush=True)
    return results


def table_markdown(results: dict) -> str:
    """One row per scorer: accuracy ± SE against 10 and 1 InBook negatives and against the LM's continuation,
    and each ranker's paired difference from the InBook ranker (the paper's baseline)."""
    wins = results["wins"]
    head = ("| scorer | vs 10 InBook | vs 1 InBook | vs the LM's continuation | vs LM: - inbook ranker | "
            "vs 10 InBook: - inbook ranker |\n|---|---:|---:|---:|---:|---:|")
    lines = [head]
    names = {"unigram": "unigram overlap", "length": "length only (longer wins)", "zero_shot": "zero-shot MiniLM",
             "inbook": "ranker: InBook", "generative": "ranker: generative", "both": "ranker: both"}
    base = wins.get("inbook")
    for name, label in names.items():
        if name not in wins:
            continue
        row = wins[name]

        def cell(kind, which):
            mean, se = accuracy_and_se(np.asarray(row[kind][which]))
            return f"{mean:.3f} ± {se:.3f}"

        def gain(kind, which):
            if base is None or name == "inbook":
                return "-"
            diff, se = paired_gain(np.asarray(row[kind][which]), np.asarray(base[kind][which]))
            return f"{diff:+.3f} ± {se:.3f}"

        lines.append(f"| {label} | {cell('inbook', 'all')} | {cell('inbook', 'vs1')} | {cell('machine', 'vs1')} | "
                     f"{gain('machine', 'vs1')} | {gain('inbook', 'all')} |")
    return "\n".join(lines) + "\n"
