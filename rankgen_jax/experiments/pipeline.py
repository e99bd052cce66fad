"""The metric -> ranker -> retriever pipeline (DKMR^2, CL-DRD), end to end on one set of books.

Stages (each writes its own folder under the workdir and is skipped when its
output exists, so a rerun resumes where the last one stopped):

1. data: RankGen examples of the training and held-out books; query = a
   prefix, reference = its gold continuation, corpus = every continuation and
   InBook negative span of all the books;
2. retriever0: DKMR^2's retriever, two independent encoders started from the
   pretrained one, each reading the [CLS] (first) token (Sec. 3.1;
   retriever_towers "shared_start" keeps the starting checkpoint's own towers
   and head, MiniLM's shared mean pooling), warmed up with the in-batch softmax
   and one hard negative per query and step drawn at random from the top
   hard_negative_pool_size of a sparse pool: TF-IDF or concept matching
   (hard_negative_pool "tfidf", "concepts"; "tfidf_top1", the top TF-IDF hit
   every time, is the former behaviour);
3. pools: Retriever0 retrieves a candidate pool per training query (FAISS),
   the gold continuation is put in if missing, and the metric (BLEU / ROUGE)
   scores every candidate against the reference;
4. rankers: cross encoders trained on those lists (`rankers`): "listmle",
   ListMLE over the metric's order (metric distillation of the order only);
   "kl", KL to the softmax of the metric's full scores (divided by
   full_score_scale), the other side of DKMR^2's Table 5; "bce", BCE on the gold
   label (no distillation);
5. retriever1: Retriever0 distilled from the first ranker of `rankers` with
   KL, or with a curriculum over the same fixed pool (stages K = 5, 10, 30 cut
   from Retriever0's 30 candidates: not CL-DRD's Algorithm 1, which retrieves
   afresh every iteration: `rankgen-jax cl-drd`), or trained directly on the
   metric's order (the weaker path of the papers);
6. evaluation: every retriever searches the whole corpus for the held-out
   queries, every ranker re-ranks Retriever0's top candidates; MRR@10,
   recall@k of the gold and BLEU of the top-1 against the gold.

Every training stage runs through the one trainer and train_step; only the
model kind, the batch layout (rankgen_jax.data.lists) and the loss differ.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from pathlib import Path

import gin
import numpy as np
from tqdm import tqdm

from rankgen_jax.checkpoints import native
from rankgen_jax.checkpoints.run_folder import RunFolder
from rankgen_jax.data.documents import require_documents
from rankgen_jax.data.example_source import build_examples
from rankgen_jax.data.examples import ExampleConfig
from rankgen_jax.data.jsonl import read_jsonl, write_jsonl
from rankgen_jax.data.source_configs import DataConfig, ListsData, RetrievalData
from rankgen_jax.data.vocab import BUNDLED_CORPUS
from rankgen_jax.errors import RankgenError
from rankgen_jax.eval.retrieval_metrics import evaluate_run, metric_scores
from rankgen_jax.checkpoints.native import require_vocab_path
from rankgen_jax.experiments.job_folder import JobFolder
from rankgen_jax.experiments.stages import (StageRun, aligned_table, is_done, log, mark_done,
                                            starting_checkpoint)
from rankgen_jax.inference.encoder import load_model
from rankgen_jax.data.curriculum import CurriculumStage, curriculum_groups
from rankgen_jax.models.configs import HeadConfig, ModelConfig
from rankgen_jax.data.retrieval_files import Passage
from rankgen_jax.retrieval.dense_index import TextEncoding, index_corpus, index_written, search_queries
from rankgen_jax.retrieval.teacher import load_teacher
from rankgen_jax.retrieval.sparse import TfidfIndex, keyword_overlap_search
from rankgen_jax.train.config import LossConfig, TrainerConfig
from rankgen_jax.train.loop import train
from rankgen_jax.train.optimizers import OptimizerConfig

# How a ranker learns from the metric (DKMR^2 Sec. 3.2, Table 5): its loss and whether it reads the gold label only.
RANKER_LOSSES = {"listmle": ("listmle", False), "kl": ("kl_distillation", False), "bce": ("sigmoid_bce", True)}
RETRIEVER_TOWERS = ("two_towers_cls", "shared_start")
HARD_NEGATIVE_POOLS = ("tfidf", "concepts", "tfidf_top1")
RETRIEVERS1 = ("retriever1_kl", "retriever1_cldrd", "retriever1_metric")
DKMR2_RETRIEVER1 = "retriever1_kl"  # the paper's Retriever1: Retriever0 distilled from Ranker0 by KL
TABLE_COLUMNS = ("mrr@10", "recall@1", "recall@10", "bleu_top1", "n")


@gin.configurable
@dataclasses.dataclass(frozen=True)
class PipelineConfig:
    """Data sizes, list sizes and the training budget of each stage.

    init_from_hf: the pretrained encoder every model starts from ("minilm" or an
      HF folder), imported once; or init_checkpoint, a rankgen_jax dual-encoder
      checkpoint to start from instead.
    retriever_towers: "two_towers_cls" (DKMR^2: two independent encoders, the
      [CLS] vector, no projection) or "shared_start" (the starting checkpoint's
      towers and head as they are).
    hard_negative_pool / hard_negative_pool_size: Retriever0's hard negative is
      drawn at random per step from the top K of this sparse pool (the gold
      left out); concept matching by default, the pool DKMR^2 found better
      (Sec. 3.1, App. C); DKMR^2 does not give its K.
    logit_scale: multiplies Retriever0's scores in the in-batch softmax; 0
      picks it by the towers: 1 for "two_towers_cls" (DPR's softmax over raw
      [CLS] dot products, which DKMR^2 follows: MiniLM's [CLS] dot
      products spread by about 1.4 over a query's passages, what 20 gives
      its cosines; 20 on them would spread logits by about 27), 20 for
      "shared_start" (MiniLM's unit vectors: cosine scores in [-1, 1] need
      sentence-transformers' scale of 20).
    retriever_epochs / ranker_epochs / distill_epochs: each stage trains this
      many passes over its training queries (the paper trains epochs; its
      counts are not in the text this project has, so these are ours);
      max_steps caps a stage (the learning rate is constant after warmup, so a
      cap ends no schedule early).
    rankers: which rankers to train, of RANKER_LOSSES; the first is the
      teacher of Retriever1. ("listmle", "kl", "bce") is Table 5's comparison
      (gin_configs/pipelines/dkmr2_table5.gin).
    full_score_scale: the "kl" ranker's teacher is softmax(metric / scale)
      (BLEU is 0-100; our choice, the paper gives none).
    retrievers1: which Retriever1 variants of RETRIEVERS1 to train:
      "retriever1_kl" (DKMR^2's), "retriever1_cldrd" (a curriculum over the
      fixed pool), "retriever1_metric" (from the metric directly).
    teacher: Retriever1's teacher instead of the first ranker: any teacher
      retrieval/teacher.py's load_teacher reads (a cross encoder, a
      bi-encoder, "mpnet", an ensemble, a file of scores); "" is the ranker.
    curriculum: the fixed-pool curriculum's stages as (K, (top group, next
      ranks, drawn from the rest)); the group sizes sum to pool_size.
    """

    corpus: str = str(BUNDLED_CORPUS)
    holdout_documents: int = 2
    prefix_words: int = 256
    num_train_queries: int = 384
    num_eval_queries: int = 200
    init_from_hf: str = "minilm"
    init_checkpoint: str = ""
    retriever_towers: str = "two_towers_cls"
    hard_negative_pool: str = "concepts"
    hard_negative_pool_size: int = 30
    rankers: tuple[str, ...] = ("listmle", "bce")
    retrievers1: tuple[str, ...] = RETRIEVERS1
    full_score_scale: float = 10.0
    metric: str = "bleu"
    query_length: int = 128
    candidate_length: int = 128
    pool_size: int = 30
    ranker_list_size: int = 8
    rerank_depth: int = 20
    curriculum: tuple = ((5, (5, 12, 13)), (10, (10, 10, 10)), (30, (30, 0, 0)))
    retriever_batch_size: int = 32
    ranker_batch_size: int = 4
    distill_batch_size: int = 4
    retriever_epochs: int = 2
    ranker_epochs: int = 2
    distill_epochs: int = 2
    max_steps: int = 100_000
    retriever_learning_rate: float = 5e-5
    ranker_learning_rate: float = 5e-5
    logit_scale: float = 0.0
    teacher: str = ""
    kl_temperature: float = 1.0
    teacher_batch_size: int = 64
    seed: int = 0

    def __post_init__(self):
        if self.retriever_towers not in RETRIEVER_TOWERS:
            raise RankgenError(f"PipelineConfig.retriever_towers must be one of {RETRIEVER_TOWERS}, got "
                               f"{self.retriever_towers!r}")
        if self.hard_negative_pool not in HARD_NEGATIVE_POOLS:
            raise RankgenError(f"PipelineConfig.hard_negative_pool must be one of {HARD_NEGATIVE_POOLS}, got "
                               f"{self.hard_negative_pool!r}")
        unknown = [r for r in self.rankers if r not in RANKER_LOSSES]
        if not self.rankers or unknown or len(set(self.rankers)) != len(self.rankers):
            raise RankgenError(f"PipelineConfig.rankers must name distinct rankers of {sorted(RANKER_LOSSES)}, got "
                               f"{self.rankers!r}")
        if self.hard_negative_pool_size < 1 or not self.full_score_scale > 0:
            raise RankgenError("PipelineConfig.hard_negative_pool_size must be >= 1 and full_score_scale > 0")
        for name in ("retriever_epochs", "ranker_epochs", "distill_epochs", "max_steps"):
            if getattr(self, name) < 1:
                raise RankgenError(f"PipelineConfig.{name} must be >= 1, got {getattr(self, name)}")
        unknown = [r for r in self.retrievers1 if r not in RETRIEVERS1]
        if not self.retrievers1 or unknown:
            raise RankgenError(f"PipelineConfig.retrievers1 must name some of {RETRIEVERS1}, got {self.retrievers1!r}")
        if self.logit_scale < 0:
            raise RankgenError(f"PipelineConfig.logit_scale must be >= 0 (0: by the towers), got {self.logit_scale}")

    @property
    def retriever0_logit_scale(self) -> float:
        """Retriever0's score scale: logit_scale, or by the towers (1 for raw [CLS] dot products, 20 for unit
        vectors)."""
        if self.logit_scale:
            return self.logit_scale
        return 1.0 if self.retriever_towers == "two_towers_cls" else 20.0

    @property
    def ranker_names(self) -> tuple[str, ...]:
        return tuple(f"ranker0_{r}" for r in self.rankers)


_log = functools.partial(log, "pipeline")


class PipelineFolder(JobFolder):
    """Where the pipeline keeps each of its outputs under `workdir`: data/ (the corpus, the queries, the pools,
    each model's training lists), a training run per model (retriever0, ranker0_*, retriever1_*), and
    indexes/<model>/ for each retriever evaluated."""

    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def corpus(self) -> Path:
        return self.data / "corpus.jsonl"

    def queries(self, split: str) -> Path:
        """The "train" or "eval" queries, each with its gold passage id and reference text."""
        return self.data / f"{split}_queries.jsonl"

    def query_texts(self, split: str) -> Path:
        """The queries as search_queries reads them (id, text)."""
        return self.data / f"{split}_query_texts.jsonl"

    def pools(self, split: str) -> Path:
        """Retriever0's candidates per query, scored by the metric."""
        return self.data / f"pools_{split}.jsonl"

    @property
    def teacher_pools(self) -> Path:
        """The training pools with the teacher's scores."""
        return self.data / "pools_train_teacher.jsonl"

    def training_file(self, model: str, split: str) -> Path:
        """A model's "train" or "eval" records, as its training run reads them."""
        return self.data / f"{model}_{split}.jsonl"

    def index(self, model: str) -> Path:
        """The index of the corpus that `model` encoded."""
        return self.root / "indexes" / model

    def link_model(self, name: str, model: str) -> None:
        """`name` as another name of the trained `model` (a relative link, so the folder can move)."""
        link = self.root / name
        if not link.exists():
            link.symlink_to(model)


# --- 1. data ------------------------------------------------------------------------------


def build_data(cfg: PipelineConfig, folder: PipelineFolder) -> dict:
    """Queries (train / eval) with their gold passage ids, and the passage corpus; written under the folder's data/."""
    docs, stats = require_documents(cfg.corpus)
    docs = sorted(docs, key=lambda d: d.id)
    if not 0 < cfg.holdout_documents < len(docs):
        raise RankgenError(f"{cfg.corpus}: holdout_documents={cfg.holdout_documents} must leave documents "
                           f"on both sides of {len(docs)}")
    example_config = ExampleConfig(prefix_words=cfg.prefix_words, seed=cfg.seed)
    rng = np.random.default_rng(cfg.seed)
    passages: dict[str, str] = {}  # text -> id; identical spans are one passage

    def passage_id(text: str) -> str:
        return passages.setdefault(text, f"p{len(passages)}")

    splits = {}
    for split, part, count in (("train", docs[: -cfg.holdout_documents], cfg.num_train_queries),
                               ("eval", docs[-cfg.holdout_documents :], cfg.num_eval_queries)):
        examples, _ = build_examples(part, example_config)
        for e in examples:  # every span of every book is in the corpus, chosen as a query or not
            passage_id(e.continuation)
            for negative in e.negatives:
                passage_id(negative)
        chosen = sorted(rng.choice(len(examples), size=min(count, len(examples)), replace=False))
        splits[split] = [{"qid": f"{split}{i}", "query": examples[i].prefix, "reference": examples[i].continuation,
                          "gold": passage_id(examples[i].continuation), "doc_id": examples[i].doc_id}
                         for i in chosen]
    corpus = [{"id": pid, "text": text} for text, pid in passages.items()]
    write_jsonl(folder.corpus, corpus)
    for split, queries in splits.items():
        write_jsonl(folder.queries(split), queries)
    _log(f"{stats.summary()}; {len(splits['train'])} training and {len(splits['eval'])} held-out queries; "
         f"corpus of {len(corpus)} passages")
    return {"corpus": len(corpus), "train_queries": len(splits["train"]), "eval_queries": len(splits["eval"])}


# --- training stages ----------------------------------------------------------------------


def stage_steps(cfg: PipelineConfig, records: int, batch_size: int, epochs: int) -> int:
    """A stage's steps: `epochs` passes over its `records` training queries in batches (at least one step),
    capped by max_steps."""
    return max(1, min(cfg.max_steps, epochs * (records // batch_size)))


def _train_stage(cfg: PipelineConfig, workdir: RunFolder, init: str, model_config: ModelConfig, data: DataConfig,
                 loss: LossConfig, learning_rate: float, steps: int, encoder_only: bool = False) -> dict:
    """One training run through the shared trainer (resumes if the workdir has a checkpoint)."""
    trainer = TrainerConfig(num_steps=steps, log_every=5, eval_every=min(25, steps), eval_batches=2,
                            checkpoint_every=min(50, steps), init_checkpoint=init, seed=cfg.seed,
                            encoder_overrides={"dropout_rate": 0.0}, init_encoder_only=encoder_only)
    optimizer = OptimizerConfig(name="adamw", learning_rate=learning_rate, warmup_steps=min(10, steps - 1),
                                weight_decay=0.01)
    _log(f"{workdir.root.name}: {steps} steps of {data.batch_size}")
    return train(workdir, trainer=trainer, model_config=model_config, data=data, loss=loss, optimizer=optimizer)


def _list_data(cfg: PipelineConfig, vocab: str, train_file: Path, eval_file: Path, batch_size: int,
               list_size: int = 0) -> DataConfig:
    return DataConfig(
        ListsData(
            vocab=vocab,
            train_file=str(train_file),
            eval_file=str(eval_file),
            continuation_length=cfg.candidate_length,
            list_size=list_size,
            prefix_keep="end",
        ),
        batch_size=batch_size,
        prefix_length=cfg.query_length,
        seed=cfg.seed,
    )


def _texts(corpus: list[dict]) -> dict[str, str]:
    return {p["id"]: p["text"] for p in corpus}


# DKMR^2's retriever: two independent encoders, each reading the first token ([CLS]) with no projection.
TWO_TOWERS_CLS = ModelConfig(head=HeadConfig(pooling="first", projection_dim=0), shared_towers=False)


def hard_negative_pools(cfg: PipelineConfig, queries: list[dict], corpus: list[dict]) -> list[list[str]]:
    """Each query's sparse pool of hard negatives (passage ids, best first, the gold left out)."""
    ids = [p["id"] for p in corpus]
    row_of = {pid: row for row, pid in enumerate(ids)}
    size = 1 if cfg.hard_negative_pool == "tfidf_top1" else cfg.hard_negative_pool_size
    exclude = [[row_of[q["gold"]]] for q in queries]
    texts = [q["query"] for q in queries]
    if cfg.hard_negative_pool == "concepts":
        _, top_QxK = keyword_overlap_search(texts, [p["text"] for p in corpus], size, exclude=exclude)
    else:
        _, top_QxK = TfidfIndex([p["text"] for p in corpus]).search(texts, size, exclude=exclude)
    return [[ids[j] for j in row if j >= 0] for row in top_QxK]


def train_retriever0(cfg: PipelineConfig, folder: PipelineFolder, init: Path) -> None:
    """Warm-up (DKMR^2 Sec. 3.1): in-batch softmax with one hard negative per query and step, drawn at random from
    its sparse pool (the retrieval source's sampling: Tevatron files whose negatives are the pool)."""
    corpus = read_jsonl(folder.corpus)
    texts = _texts(corpus)
    files, counts = {}, {}
    for split in ("train", "eval"):
        queries = read_jsonl(folder.queries(split))
        records = [{"query_id": q["qid"], "query": q["query"],
                    "positive_passages": [{"docid": q["gold"], "title": "", "text": q["reference"]}],
                    "negative_passages": [{"docid": d, "title": "", "text": texts[d]} for d in pool]}
                   for q, pool in zip(queries, hard_negative_pools(cfg, queries, corpus))]
        files[split] = write_jsonl(folder.training_file("retriever0", split), records)
        counts[split] = len(records)
    data = DataConfig(
        RetrievalData(
            vocab=require_vocab_path(init),
            train_file=str(files["train"]),
            eval_file=str(files["eval"]),
            continuation_length=cfg.candidate_length,
            hard_negatives=1,
            positive_choice="first",
            prefix_keep="end",
        ),
        batch_size=cfg.retriever_batch_size,
        prefix_length=cfg.query_length,
        seed=cfg.seed,
    )
    loss = LossConfig(name="in_batch_softmax", logit_scale=cfg.retriever0_logit_scale)
    two_towers = cfg.retriever_towers == "two_towers_cls"
    steps = stage_steps(cfg, counts["train"], cfg.retriever_batch_size, cfg.retriever_epochs)
    model_config = TWO_TOWERS_CLS if two_towers else ModelConfig()
    _train_stage(cfg, folder.model("retriever0"), str(init), model_config, data, loss, cfg.retriever_learning_rate,
                 steps, encoder_only=two_towers)


def build_pools(cfg: PipelineConfig, folder: PipelineFolder) -> None:
    """Retriever0's top pool per training (and eval) query, the gold put in, each scored by the metric."""
    corpus = read_jsonl(folder.corpus)
    texts = _texts(corpus)
    index_dir = folder.index("retriever0")
    if not index_written(index_dir):
        index_corpus(
            str(folder.model("retriever0")),
            str(folder.corpus),
            str(index_dir),
            encoding=TextEncoding("suffix", max_length=cfg.candidate_length),
            overwrite=True,
        )
    for split in ("train", "eval"):
        queries = read_jsonl(folder.queries(split))
        query_file = write_jsonl(folder.query_texts(split),
                                  [{"id": q["qid"], "text": q["query"]} for q in queries])
        depth = cfg.pool_size if split == "train" else max(cfg.rerank_depth, 10)
        results = search_queries(
            str(folder.model("retriever0")),
            str(index_dir),
            str(query_file),
            depth,
            encoding=TextEncoding("prefix", max_length=cfg.query_length),
        )
        pools = []
        for q, result in tqdm(list(zip(queries, results)), desc=f"{cfg.metric} of {split} pools", mininterval=5):
            ids = list(result["ids"])
            if split == "train" and q["gold"] not in ids:
                ids[-1] = q["gold"]  # the list must hold the reference for metric distillation to teach it
            candidates = [texts[i] for i in ids]
            labels = metric_scores(cfg.metric, candidates, [q["reference"]] * len(candidates))
            pools.append({"qid": q["qid"], "query": q["query"], "ids": ids, "candidates": candidates,
                          "labels": [float(x) for x in labels], "gold": q["gold"],
                          "retriever_scores": [float(s) for s in result["scores"]]})
        write_jsonl(folder.pools(split), pools)


def _ranker_lists(pools: list[dict], size: int, binary: bool) -> list[dict]:
    """The ranker's training lists: the gold first, then the highest-retrieved other candidates."""
    records = []
    for p in pools:
        order = [p["ids"].index(p["gold"])] + [i for i, cid in enumerate(p["ids"]) if cid != p["gold"]]
        chosen = order[:size]
        labels = [float(p["ids"][i] == p["gold"]) if binary else p["labels"][i] for i in chosen]
        records.append({"query": p["query"], "candidates": [p["candidates"][i] for i in chosen], "labels": labels})
    return records


def train_rankers(cfg: PipelineConfig, folder: PipelineFolder, init: Path) -> None:
    """Ranker0: cross encoders on the metric's lists: its order (ListMLE), its full scores (KL) or the gold (BCE)."""
    pools = read_jsonl(folder.pools("train"))
    ranker_config = ModelConfig(head=HeadConfig(pooling="first", projection_dim=0), kind="cross_encoder")
    for ranker, name in zip(cfg.rankers, cfg.ranker_names):
        loss_name, binary = RANKER_LOSSES[ranker]
        if native.is_checkpoint_dir(folder.model(name)) and is_done(folder.model(name)):
            continue
        lists = _ranker_lists(pools, cfg.ranker_list_size, binary)
        if ranker == "kl":
            lists = [{**r, "teacher_scores": [x / cfg.full_score_scale for x in r["labels"]]} for r in lists]
        train_part, eval_part = _split_lists(lists, cfg.ranker_batch_size)
        train_file = write_jsonl(folder.training_file(name, "train"), train_part)
        eval_file = write_jsonl(folder.training_file(name, "eval"), eval_part)
        data = _list_data(
            cfg, require_vocab_path(init), train_file, eval_file, cfg.ranker_batch_size, cfg.ranker_list_size
        )
        # BLEU is 0..100: ListMLE only uses its order, so no rescaling is needed.
        _train_stage(cfg, folder.model(name), str(init), ranker_config, data, LossConfig(name=loss_name),
                     cfg.ranker_learning_rate, stage_steps(cfg, len(train_part), cfg.ranker_batch_size,
                                                           cfg.ranker_epochs))
        mark_done(folder.model(name))


def teacher_scores(cfg: PipelineConfig, folder: PipelineFolder) -> Path:
    """The teacher's scores of every training pool (the teacher of KL and the curriculum): the first ranker's, or
    PipelineConfig.teacher's."""
    out = folder.teacher_pools
    if out.is_file():
        return out
    pools = read_jsonl(folder.pools("train"))
    started = time.time()
    if cfg.teacher:
        teacher = load_teacher(cfg.teacher, cfg.query_length, cfg.candidate_length, cfg.teacher_batch_size,
                               corpus=str(folder.corpus))
        scores = teacher.score([p["qid"] for p in pools], [p["query"] for p in pools],
                               [[Passage(i, c) for i, c in zip(p["ids"], p["candidates"])] for p in pools])
    else:
        ranker = load_model(str(folder.model(cfg.ranker_names[0])), kind="cross_encoder")
        scores = ranker.score_pairs([p["query"] for p in pools], [p["candidates"] for p in pools],
                                    cfg.query_length, cfg.candidate_length, cfg.teacher_batch_size)
    _log(f"teacher scored {sum(len(p['candidates']) for p in pools)} pairs in {time.time() - started:.0f} s")
    return write_jsonl(out, [{**p, "teacher_scores": [float(s) for s in row]} for p, row in zip(pools, scores)])


def _split_lists(records: list[dict], batch_size: int) -> tuple[list[dict], list[dict]]:
    """(train, eval): the last tenth (at least one batch) watches for overfitting during training."""
    held = max(batch_size, len(records) // 10)
    if len(records) < held + batch_size:
        raise RankgenError(f"{len(records)} training queries are too few for a training and an eval batch of "
                           f"{batch_size}: raise PipelineConfig.num_train_queries")
    return records[:-held], records[-held:]


def train_retrievers1(cfg: PipelineConfig, folder: PipelineFolder) -> None:
    """Retriever1 from Retriever0: KL from the ranker, CL-DRD curriculum, and directly from the metric."""
    pools = read_jsonl(teacher_scores(cfg, folder))
    vocab = require_vocab_path(folder.model("retriever0"))
    start = str(folder.model("retriever0"))

    def run(name: str, records: list[dict], loss: LossConfig, init: str, epochs: int) -> None:
        if is_done(folder.model(name)):
            return
        train_part, eval_part = _split_lists(records, cfg.distill_batch_size)
        data = _list_data(cfg, vocab, write_jsonl(folder.training_file(name, "train"), train_part),
                          write_jsonl(folder.training_file(name, "eval"), eval_part), cfg.distill_batch_size,
                          cfg.pool_size)
        _train_stage(cfg, folder.model(name), init, ModelConfig(), data, loss, cfg.retriever_learning_rate,
                     stage_steps(cfg, len(train_part), cfg.distill_batch_size, epochs))
        mark_done(folder.model(name))

    if "retriever1_kl" in cfg.retrievers1:
        kl_lists = [{"query": p["query"], "candidates": p["candidates"], "teacher_scores": p["teacher_scores"]}
                    for p in pools]
        run("retriever1_kl", kl_lists, LossConfig(name="kl_distillation", temperature=cfg.kl_temperature), start,
            cfg.distill_epochs)
    if "retriever1_metric" in cfg.retrievers1:
        metric_lists = [{"query": p["query"], "candidates": p["candidates"], "labels": p["labels"]} for p in pools]
        run("retriever1_metric", metric_lists, LossConfig(name="listmle"), start, cfg.distill_epochs)
    if "retriever1_cldrd" not in cfg.retrievers1:
        return

    # The fixed-pool curriculum: each stage continues from the previous one, distill_epochs each (its three
    # stages together train three times as long as the KL and metric retrievers).
    rng = np.random.default_rng(cfg.seed)
    previous, last = start, ""
    for number, (k, groups) in enumerate(cfg.curriculum, start=1):
        # The fixed pool's next ranks are group 2 whole (K' = N_h): see PipelineConfig.curriculum.
        stage = CurriculumStage(k=k, k_prime=groups[1], n_hard=groups[1], n_rest=groups[2])
        lists = []
        for p in pools:
            indices, labels = curriculum_groups(np.asarray(p["teacher_scores"]), stage, rng)
            lists.append({"query": p["query"], "candidates": [p["candidates"][i] for i in indices],
                          "labels": [float(x) for x in labels]})
        name = f"retriever1_cldrd_stage{number}"
        run(name, lists, LossConfig(name="lambdarank_mrr"), previous, cfg.distill_epochs)
        previous, last = str(folder.model(name)), name
    folder.link_model("retriever1_cldrd", last)


# --- evaluation ---------------------------------------------------------------------------


def _ranking_metrics(queries: list[dict], ranked: list[list[str]], texts: dict[str, str]) -> dict:
    """The table's columns (means), their standard errors over queries ("<column>_se") and every query's values
    ("per_query": qid -> {column: value}, for paired differences)."""
    bleu = [float(metric_scores("bleu", [texts[r[0]]], [q["reference"]])[0]) if r else 0.0
            for q, r in zip(queries, ranked)]
    # One gold passage per query; the rankings are lists (ranked as listed), every query counts.
    run = {q["qid"]: r for q, r in zip(queries, ranked)}
    measures = evaluate_run(run, {q["qid"]: {q["gold"]: 1} for q in queries}, ["RR@10", "R@1", "R@10"],
                            per_query=True)
    per_query = {q["qid"]: {"mrr@10": measures["per_query"][q["qid"]]["RR@10"],
                            "recall@1": measures["per_query"][q["qid"]]["R@1"],
                            "recall@10": measures["per_query"][q["qid"]]["R@10"], "bleu_top1": b}
                 for q, b in zip(queries, bleu)}
    out = {"n": len(queries), "per_query": per_query}
    for column in ("mrr@10", "recall@1", "recall@10", "bleu_top1"):
        values = np.array([v[column] for v in per_query.values()], np.float64)
        out[column] = float(values.mean())
        out[f"{column}_se"] = float(values.std(ddof=1) / np.sqrt(len(values))) if len(values) > 1 else float("nan")
    return out


def evaluate_retriever(cfg: PipelineConfig, folder: PipelineFolder, model: str, name: str) -> dict:
    """Search the whole corpus with the held-out queries."""
    index_dir = folder.index(name)
    if not index_written(index_dir):
        index_corpus(
            model,
            str(folder.corpus),
            str(index_dir),
            encoding=TextEncoding("suffix", max_length=cfg.candidate_length),
            overwrite=True,
        )
    queries = read_jsonl(folder.queries("eval"))
    results = search_queries(
        model,
        str(index_dir),
        str(folder.query_texts("eval")),
        10,
        encoding=TextEncoding("prefix", max_length=cfg.query_length),
    )
    texts = _texts(read_jsonl(folder.corpus))
    return _ranking_metrics(queries, [list(r["ids"]) for r in results], texts)


def evaluate_tfidf(folder: PipelineFolder) -> dict:
    corpus = read_jsonl(folder.corpus)
    ids = [p["id"] for p in corpus]
    queries = read_jsonl(folder.queries("eval"))
    _, top_QxK = TfidfIndex([p["text"] for p in corpus]).search([q["query"] for q in queries], 10)
    return _ranking_metrics(queries, [[ids[j] for j in row] for row in top_QxK], _texts(corpus))


def evaluate_ranker(cfg: PipelineConfig, folder: PipelineFolder, name: str) -> dict:
    """Re-rank Retriever0's top rerank_depth candidates of each held-out query."""
    pools = read_jsonl(folder.pools("eval"))
    queries = {q["qid"]: q for q in read_jsonl(folder.queries("eval"))}
    depth = cfg.rerank_depth
    ranker = load_model(str(folder.model(name)), kind="cross_encoder")
    scores = ranker.score_pairs([p["query"] for p in pools], [p["candidates"][:depth] for p in pools],
                                cfg.query_length, cfg.candidate_length, cfg.teacher_batch_size)
    ranked = [[p["ids"][i] for i in np.argsort(-s, kind="stable")] for p, s in zip(pools, scores)]
    texts = _texts(read_jsonl(folder.corpus))
    return _ranking_metrics([queries[p["qid"]] for p in pools], ranked, texts)


# --- driver -------------------------------------------------------------------------------


def run_pipeline(workdir: str, cfg: PipelineConfig | None = None) -> dict:
    """Run (or resume) every stage and evaluate; returns the results table, also in workdir/results.json."""
    cfg = cfg or PipelineConfig()
    folder = PipelineFolder(workdir)
    run = StageRun(folder, "pipeline")
    results = run.results
    if not folder.corpus.is_file():
        run.stage("data", lambda: results.update(data=build_data(cfg, folder)))
    init = starting_checkpoint(cfg.init_checkpoint, cfg.init_from_hf, folder, "PipelineConfig.init_checkpoint")
    if not is_done(folder.model("retriever0")):
        run.stage("retriever0", train_retriever0, cfg, folder, init)
        mark_done(folder.model("retriever0"))
    if not folder.pools("eval").is_file():
        run.stage("pools", build_pools, cfg, folder)
    run.stage("rankers", train_rankers, cfg, folder, init)
    run.stage("retrievers1", train_retrievers1, cfg, folder)

    table = results.setdefault("table", {})

    def shown(row: dict) -> str:
        return ", ".join(f"{c} {row[c]:.3f}" for c in TABLE_COLUMNS if c != "n")

    run.evaluate(table, "tfidf", evaluate_tfidf, folder, describe=shown)
    run.evaluate(table, "zero_shot", evaluate_retriever, cfg, folder, str(init), "zero_shot", describe=shown)
    run.evaluate(table, "retriever0", evaluate_retriever, cfg, folder, str(folder.model("retriever0")), "retriever0",
                 describe=shown)
    for name in cfg.ranker_names:
        run.evaluate(table, name, evaluate_ranker, cfg, folder, name, describe=shown)
    for name in cfg.retrievers1:
        run.evaluate(table, name, evaluate_retriever, cfg, folder, str(RunFolder.resolved(folder.model(name))), name,
                     describe=shown)
    run.finish()
    print(format_table(table))
    return results


def format_table(table: dict) -> str:
    """The results as an aligned text table (one row per model)."""
    return aligned_table({name: [row[c] for c in TABLE_COLUMNS] for name, row in table.items()}, TABLE_COLUMNS)
