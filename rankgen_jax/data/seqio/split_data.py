"""The RankGen recipe's first step: a task's documents, cut as training cuts them, into the generator LM's half and
the generative negatives' half (RankGen §2.2, "Dataset construction").

The paper fine-tunes its generator LM for causal language modelling on 50%
of the (prefix, continuation) pairs and samples one generative negative per
prefix, with nucleus p = 0.9, for the other half. `split_task_data` reads the
documents of a RankGen seqio task's InBook stream for one split
(`tasks.document_examples`: the same documents, holdout and ExampleConfig as
training, so the same prefixes and continuations) and writes:

- `lm_train.txt`: the LM half, one example per line, prefix + " " +
  continuation (the text the LM is fine-tuned on; sentences hold no line
  breaks). Any causal-LM trainer reads it, e.g. transformers'
  run_clm.py --train_file lm_train.txt.
- `prefixes.jsonl`: the negatives half, {"id": "<doc_id>#<k>", "doc_id",
  "prefix", "continuation"} per example: the input of `rankgen-jax
  generate-negatives`, whose output the task's generative stream reads
  (rankgen_data_paths.generative_jsonl).
- `split.json`: the task, split, example settings and, per half, the
  documents and example counts.

Halves are whole documents, so the LM never sees text it later writes
negatives for: documents are taken in reading order and each goes to the half
that has fewer examples so far (the LM half on a tie), so each half holds
about 50% of the examples. With `lm_half=False` (a validation split, whose
text the LM must not learn) every document goes to the prefix file.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

from rankgen_jax.data.documents import ReadStats
from rankgen_jax.data.seqio.tasks import TRAIN, document_examples, task_spec
from rankgen_jax.errors import RankgenError

LM_FILE, PREFIX_FILE, SUMMARY_FILE = "lm_train.txt", "prefixes.jsonl", "split.json"


def split_task_data(task: str, out_dir: str, split: str = TRAIN, lm_half: bool = True) -> dict:
    """Write the LM half and the prefix file of a task's split into out_dir (see the module docstring)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    spec = task_spec(task)
    stats = ReadStats()
    halves = {"lm": {"documents": [], "examples": 0}, "negatives": {"documents": [], "examples": 0}}
    lm_path, prefix_path = out / LM_FILE, out / PREFIX_FILE
    with open(lm_path, "w", encoding="utf-8") as lm_file, open(prefix_path, "w", encoding="utf-8") as prefix_file:
        for doc, examples in document_examples(task, split, stats):
            lm_side = lm_half and halves["lm"]["examples"] <= halves["negatives"]["examples"]
            half = halves["lm" if lm_side else "negatives"]
            half["documents"].append(doc.id)
            half["examples"] += len(examples)
            if lm_side:
                lm_file.write("".join(f"{e.prefix} {e.continuation}\n" for e in examples))
            else:
                prefix_file.write("".join(
                    json.dumps({"id": f"{doc.id}#{k}", "doc_id": doc.id, "prefix": e.prefix,
                                "continuation": e.continuation}, ensure_ascii=False) + "\n"
                    for k, e in enumerate(examples)))
    if not halves["negatives"]["examples"]:
        raise RankgenError(f"task {task!r} ({split}): no document left for the generative negatives' half "
                           f"({stats.summary()}); it needs at least two usable documents")
    if not lm_half:
        lm_path.unlink()
    summary = {"task": task, "split": split, "example_config": dataclasses.asdict(spec.example_config),
               "read": stats.summary(), **{f"{name}_half": half for name, half in halves.items()}}
    (out / SUMMARY_FILE).write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    total = halves["lm"]["examples"] + halves["negatives"]["examples"]
    print(f"split-data {task} ({split}): {stats.summary()}; LM half {len(halves['lm']['documents'])} documents, "
          f"{halves['lm']['examples']} of {total} examples"
          + (f" -> {lm_path}" if lm_half else "")
          + f"; negatives' half {len(halves['negatives']['documents'])} documents, "
          f"{halves['negatives']['examples']} examples -> {prefix_path}", file=sys.stderr)
    return summary
