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


def _copy_documents(root: Path, config: RecipeExampleConfig) -> dict:
    counts = {}
    for split, names in (("train", config.train_documents), ("validation", config.validation_documents)):
        folder = root / "documents" / split
        folder.mkdir(parents=True, exist_ok=True)
        for name in names:
            source = Path(BUNDLED_CORPUS) / name
            if not source.is_file():
                raise RankgenError(f"{name}: not a document of the bundled corpus ({BUNDLED_CORPUS})")
            shutil.copyfile(source, folder / Path(name).name)
        counts[split] = len(names)
    return counts


def _paths(root: Path) -> list[str]:
    """The gin bindings that point the recipe's folder tasks at this run's files."""
    docs = root / "documents"
    return [f"rankgen_data_paths.folder = '{docs / 'train'}'",
            f"rankgen_data_paths.validation = {{'folder': '{docs / 'validation'}'}}",
            f"rankgen_data_paths.generative_jsonl = {{'folder': '{root / 'negatives.jsonl'}'}}",
            f"rankgen_data_paths.validation_generative_jsonl = {{'folder': '{root / 'negatives_validation.jsonl'}'}}"]


def _split(root: Path) -> dict:
    from rankgen_jax.data.seqio.split_data import split_task_data
    from rankgen_jax.experiments.gin_runs import gin_config

    with gin_config([RECIPE_GIN], _paths(root)):
        train = split_task_data("rankgen_folder_inbook", str(root / "split"))
        validation = split_task_data("rankgen_folder_inbook", str(root / "split_validation"), "validation",
                                     lm_half=False)
    return {"train": train, "validation": validation}


def _negatives(root: Path, config: RecipeExampleConfig) -> dict:
    from rankgen_jax.lm.generative_negatives import NegativeSampling, generate_negatives

    out = {}
    for split, folder, name in (("train", "split", "negatives.jsonl"),
                                ("validation", "split_validation", "negatives_validation.jsonl")):
        stats = generate_negatives(str(root / "lm"), str(root / folder / "prefixes.jsonl"), str(root / name),
                                   NegativeSampling(batch_size=config.negatives_batch_size,
                                                    max_new_tokens=config.max_new_tokens,
                                                    max_prompt_tokens=config.max_prompt_tokens, seed=config.seed),
                                   progress=False)
        records = [json.loads(line) for line in (root / name).read_text(encoding="utf-8").splitlines()]
        stats["gold_words"] = float(np.mean([len(r["continuation"].split()) for r in records]))
        stats["negative_words"] = float(np.mean([r["generative_negative_words"] for r in records]))
        out[split] = stats
    return out


def _train(root: Path, config: RecipeExampleConfig) -> dict:
    from rankgen_jax.experiments.gin_runs import train_from_gin

    workdir = root / "train"
    result = train_from_gin([RECIPE_GIN], _paths(root) + list(config.train_bindings), str(workdir))
    mark_done(workdir)
    return result


def _metrics(workdir: Path) -> dict:
    """First and last training loss and the last held-out loss and accuracy of a training workdir."""
    records = [json.loads(line) for line in RunFolder.at(workdir).metrics.read_text().splitlines()]
    train_losses = [(r["step"], r["train/loss"]) for r in records if "train/loss" in r]
    evals = [r for r in records if "eval/loss" in r]
    return {"steps": max(r["step"] for r in records), "first_train_loss": train_losses[0],
            "last_train_loss": train_losses[-1], "eval": {k: v for k, v in evals[-1].items()} if evals else {}}


def _suffix_identification(root: Path, config: RecipeExampleConfig) -> dict:
    from rankgen_jax.eval.hard_negatives import HardNegativeConfig, mine_hard_negatives
    from rankgen_jax.eval.ranking import score_file
    from rankgen_jax.inference.encoder import load_model
    from rankgen_jax.lm.scoring import load_causal_lm

    items = root / "suffix_items.jsonl"
    mined = mine_hard_negatives(str(root / "train"), str(root / "documents" / "validation"), str(items),
                                HardNegativeConfig(negatives=config.hard_negatives,
                                                   items_per_document=config.items_per_document, seed=config.seed),
                                progress=False)
    model, lm = load_model(str(root / "train")), load_causal_lm(str(root / "lm"))
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

    job = StageRun(workdir, "recipe-example")
    root, results = job.root, job.results
    if "documents" not in results:
        results["documents"] = job.stage("documents", _copy_documents, root, config)
    if "split" not in results:
        results["split"] = job.stage("split", _split, root)
    if not (root / "lm" / "config.json").is_file():
        job.stage("lm", build_tiny_gpt2, root / "lm", config.seed, 400, config.lm_positions)
    if "negatives" not in results:
        results["negatives"] = job.stage("negatives", _negatives, root, config)
    if not is_done(root / "train"):
        job.stage("train", _train, root, config)
    results["train"] = _metrics(root / "train")
    if "suffix" not in results:
        results["suffix"] = job.stage("suffix", _suffix_identification, root, config)
    (root / TABLE_FILE).write_text(table_markdown(results), encoding="utf-8")
    results = job.finish()
    print((root / TABLE_FILE).read_text(encoding="utf-8"))
    return results
