"""The RankGen recipe end to end at CPU size: documents -> split-data -> generative negatives -> training on
InBook and (p, c, g) examples -> hard-negative suffix identification on the held-out document.

Stages (each resumes from its output, experiments/stages.py):

1. documents: four of John Adams' addresses to Congress, copied into
   WORKDIR/documents/train, and Jefferson's first, held out, into
   WORKDIR/documents/validation;
2. split: `split-data` with gin_configs/rankgen_t5_tiny_recipe.gin (the
   paper's examples: every prefix position, 256-word prefixes, 10-128-word
   continuations), the training documents into the LM's half
   (WORKDIR/split/lm_train.txt) and the negatives' half
   (WORKDIR/split/prefixes.jsonl), the held-out one whole into
   WORKDIR/split_validation/prefixes.jsonl;
3. lm: a random-init tiny GPT-2 (rankgen_jax.testing.build_tiny_gpt2) stands
   for the fine-tuned generator: no LM is fine-tuned here (the paper
   fine-tunes T5-XXL on lm_train.txt; docs/rankgen_recipe.md says how);
4. negatives: `generate-negatives` (nucleus p = 0.9, 10-128 words, the
   prefix's last 256 tokens as the prompt) for both prefix files;
5. train: `rankgen-jax train --gin_file rankgen_t5_tiny_recipe.gin` on
   rankgen_folder_both (a random-init tiny T5, one document per batch of 8);
6. suffix identification on the held-out document: `suffix-negatives` with
   the trained model (its 10 best-scoring spans per item), then accuracy and
   the paper's pairwise accuracy of the model, the unigram-overlap baseline
   and the LM's average conditional and unconditional log-likelihoods.

WORKDIR/recipe_table.md holds the tables. What such a run shows is that the
pieces join up and what each costs here; its numbers say nothing about the
method (random-init models, a few hundred examples, a few steps).
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np

from rankgen_jax.checkpoints.run_folder import RunFolder
from rankgen_jax.errors import RankgenError
from rankgen_jax.experiments.job_folder import JobFolder
from rankgen_jax.experiments.stages import StageRun, is_done, mark_done
from rankgen_jax.resources import BUNDLED_CORPUS

RECIPE_GIN = "rankgen_t5_tiny_recipe.gin"
TABLE_FILE = "recipe_table.md"
SCORERS = ("model", "unigram", "lm_loglik", "avg_ull")


@dataclasses.dataclass(frozen=True)
class RecipeExampleConfig:
    """Which bundled documents, and the sizes of the LM, the negatives and the hard-negative items."""

    train_documents: tuple[str, ...] = ("speeches/1797_john_adams.txt", "speeches/1798_john_adams.txt",
                                        "speeches/1799_john_adams.txt", "speeches/1800_john_adams.txt")
    validation_documents: tuple[str, ...] = ("speeches/1801_thomas_jefferson.txt",)
    lm_positions: int = 1024
    negatives_batch_size: int = 16
    # The end of each prefix the LM reads (generate-negatives --max_prompt_tokens): a CPU-sized prompt.
    max_prompt_tokens: int = 256
    max_new_tokens: int = 192
    hard_negatives: int = 10
    items_per_document: int = 20
    seed: int = 0
    # Extra gin bindings of the training stage (e.g. "TrainerConfig.num_steps = 2" in a test).
    train_bindings: tuple[str, ...] = ()


# split-data's file of the negatives' half (data/seqio/split_data.py's PREFIX_FILE); not imported, as that module
# imports seqio, which the recipe loads only in the stage that splits.
SPLIT_PREFIX_FILE = "prefixes.jsonl"


class RecipeFolder(JobFolder):
    """Where the recipe keeps each of its outputs under `workdir`: the documents it copied, split-data's and
    generate-negatives' outputs per split, the tiny LM, the training run (train), the held-out items, the table."""

    def documents(self, split: str) -> Path:
        """The "train" or "validation" documents, one file each."""
        return self.root / "documents" / split

    def split_data(self, split: str) -> Path:
        """split-data's output folder for a split."""
        return self.root / ("split" if split == "train" else f"split_{split}")

    def prefixes(self, split: str) -> Path:
        """The prefixes split-data left for the negatives (the LM continues them)."""
        return self.split_data(split) / SPLIT_PREFIX_FILE

    def negatives(self, split: str) -> Path:
        """generate-negatives' output for a split's prefixes."""
        return self.root / ("negatives.jsonl" if split == "train" else f"negatives_{split}.jsonl")

    @property
    def lm(self) -> Path:
        """The tiny GPT-2 (an HF folder) that writes the negatives."""
        return self.root / "lm"

    def lm_built(self) -> bool:
        return (self.lm / "config.json").is_file()

    @property
    def suffix_items(self) -> Path:
        """The held-out suffix identification items with their mined hard negatives."""
        return self.root / "suffix_items.jsonl"

    @property
    def table(self) -> Path:
        return self.root / TABLE_FILE


def _copy_documents(folder: RecipeFolder, config: RecipeExampleConfig) -> dict:
    counts = {}
    for split, names in (("train", config.train_documents), ("validation", config.validation_documents)):
        documents = folder.documents(split)
        documents.mkdir(parents=True, exist_ok=True)
        for name in names:
            source = Path(BUNDLED_CORPUS) / name
            if not source.is_file():
                raise RankgenError(f"{name}: not a document of the bundled corpus ({BUNDLED_CORPUS})")
            shutil.copyfile(source, documents / Path(name).name)
        counts[split] = len(names)
    return counts


def _paths(folder: RecipeFolder) -> list[str]:
    """The gin bindings that point the recipe's folder tasks at this run's files."""
    return [f"rankgen_data_paths.folder = '{folder.documents('train')}'",
            f"rankgen_data_paths.validation = {{'folder': '{folder.documents('validation')}'}}",
            f"rankgen_data_paths.generative_jsonl = {{'folder': '{folder.negatives('train')}'}}",
            f"rankgen_data_paths.validation_generative_jsonl = {{'folder': '{folder.negatives('validation')}'}}"]


def _split(folder: RecipeFolder) -> dict:
    from rankgen_jax.data.seqio.split_data import split_task_data
    from rankgen_jax.experiments.gin_runs import gin_config

    with gin_config([RECIPE_GIN], _paths(folder)):
        train = split_task_data("rankgen_folder_inbook", str(folder.split_data("train")))
        validation = split_task_data("rankgen_folder_inbook", str(folder.split_data("validation")), "validation",
                                     lm_half=False)
    return {"train": train, "validation": validation}


def _negatives(folder: RecipeFolder, config: RecipeExampleConfig) -> dict:
    from rankgen_jax.lm.generative_negatives import NegativeSampling, generate_negatives

    out = {}
    for split in ("train", "validation"):
        stats = generate_negatives(str(folder.lm), str(folder.prefixes(split)), str(folder.negatives(split)),
                                   NegativeSampling(batch_size=config.negatives_batch_size,
                                                    max_new_tokens=config.max_new_tokens,
                                                    max_prompt_tokens=config.max_prompt_tokens, seed=config.seed),
                                   progress=False)
        records = [json.loads(line) for line in folder.negatives(split).read_text(encoding="utf-8").splitlines()]
        stats["gold_words"] = float(np.mean([len(r["continuation"].split()) for r in records]))
        stats["negative_words"] = float(np.mean([r["generative_negative_words"] for r in records]))
        out[split] = stats
    return out


def _train(folder: RecipeFolder, config: RecipeExampleConfig) -> dict:
    from rankgen_jax.experiments.gin_runs import train_from_gin

    workdir = folder.model("train")
    result = train_from_gin([RECIPE_GIN], _paths(folder) + list(config.train_bindings), str(workdir))
    mark_done(workdir)
    return result


def _metrics(workdir: RunFolder) -> dict:
    """First and last training loss and the last held-out loss and accuracy of a training workdir."""
    records = [json.loads(line) for line in workdir.metrics.read_text().splitlines()]
    train_losses = [(r["step"], r["train/loss"]) for r in records if "train/loss" in r]
    evals = [r for r in records if "eval/loss" in r]
    return {"steps": max(r["step"] for r in records), "first_train_loss": train_losses[0],
            "last_train_loss": train_losses[-1], "eval": {k: v for k, v in evals[-1].items()} if evals else {}}


def _suffix_identification(folder: RecipeFolder, config: RecipeExampleConfig) -> dict:
    from rankgen_jax.eval.hard_negatives import HardNegativeConfig, mine_hard_negatives
    from rankgen_jax.eval.ranking import score_file
    from rankgen_jax.inference.encoder import load_model
    from rankgen_jax.lm.scoring import load_causal_lm

    items = folder.suffix_items
    mined = mine_hard_negatives(str(folder.model("train")), str(folder.documents("validation")), str(items),
                                HardNegativeConfig(negatives=config.hard_negatives,
                                                   items_per_document=config.items_per_document, seed=config.seed),
                                progress=False)
    model, lm = load_model(str(folder.model("train"))), load_causal_lm(str(folder.lm))
    scores = {name: score_file(model, str(items), method=name, lm=lm) for name in SCORERS}
    return {"mined": mined, "scores": {k: {m: v[m] for m in ("n", "accuracy", "pairwise_accuracy")}
                                       for k, v in scores.items()}}


def table_markdown(results: dict) -> str:
    """The run's tables: data and negatives, training, and hard-negative suffix identification."""
    split, negatives = results["split"], results["negatives"]
    train, val = split["train"], split["validation"]
    lines = ["| stage | what | count | seconds |", "|---|---|---:|---:|"]
    seconds = results["seconds"]
    lines += [
        f"| split-data (train) | LM half: documents / examples (lm_train.txt lines) | "
        f"{len(train['lm_half']['documents'])} / {train['lm_half']['examples']} | {seconds.get('split', 0):.1f} |",
        f"| | negatives' half: documents / examples (prefixes.jsonl) | {len(train['negatives_half']['documents'])} / "
        f"{train['negatives_half']['examples']} | |",
        f"| split-data (validation) | held-out documents / examples | {len(val['negatives_half']['documents'])} / "
        f"{val['negatives_half']['examples']} | |",
    ]
    for name, stats in negatives.items():
        lines.append(f"| generate-negatives ({name}) | negatives (short of 10 words) ; gold / negative words | "
                     f"{stats['done']} ({stats['short']}) ; {stats['gold_words']:.1f} / {stats['negative_words']:.1f}"
                     f" | {stats['seconds']:.1f} |")
    metrics = results["train"]
    (first_step, first), (last_step, last) = metrics["first_train_loss"], metrics["last_train_loss"]
    evaluation = metrics["eval"]
    lines.append(f"| train ({RECIPE_GIN}) | steps; loss at step {first_step} -> {last_step}; held-out loss, "
                 f"accuracy | {metrics['steps']}; {first:.3f} -> {last:.3f}; {evaluation.get('eval/loss', float('nan')):.3f}"
                 f", {evaluation.get('eval/accuracy', float('nan')):.3f} | {seconds.get('train', 0):.1f} |")
    mined = results["suffix"]["mined"]
    lines.append(f"| suffix-negatives (held-out) | items (with all negatives) | {mined['items']} "
                 f"({mined['items_with_all_negatives']}) | {seconds.get('suffix', 0):.1f} |")
    lines += ["", "| scorer | items | accuracy (gold first of 1 + negatives) | pairwise accuracy |", "|---|---:|---:|---:|"]
    for name, row in results["suffix"]["scores"].items():
        lines.append(f"| {name} | {row['n']} | {row['accuracy']:.3f} | {row['pairwise_accuracy']:.3f} |")
    return "\n".join(lines) + "\n"


def run_recipe_example(workdir: str, config: RecipeExampleConfig = RecipeExampleConfig()) -> dict:
    """Run (or resume) the CPU-sized recipe in workdir; returns results.json's contents."""
    from rankgen_jax.testing import build_tiny_gpt2

    folder = RecipeFolder(workdir)
    job = StageRun(folder, "recipe-example")
    results = job.results
    if "documents" not in results:
        results["documents"] = job.stage("documents", _copy_documents, folder, config)
    if "split" not in results:
        results["split"] = job.stage("split", _split, folder)
    if not folder.lm_built():
        job.stage("lm", build_tiny_gpt2, folder.lm, config.seed, 400, config.lm_positions)
    if "negatives" not in results:
        results["negatives"] = job.stage("negatives", _negatives, folder, config)
    if not is_done(folder.model("train")):
        job.stage("train", _train, folder, config)
    results["train"] = _metrics(folder.model("train"))
    if "suffix" not in results:
        results["suffix"] = job.stage("suffix", _suffix_identification, folder, config)
    folder.table.write_text(table_markdown(results), encoding="utf-8")
    results = job.finish()
    print(folder.table.read_text(encoding="utf-8"))
    return results
