"""Generative negatives: sample one continuation per prefix from a causal LM (RankGen's hard negatives).

RankGen trains against continuations sampled with nucleus sampling (p=0.9)
from an LM, trimmed to 10-128 words (docs/design.md, 'RankGen training'). This module reads
a JSONL file of objects with a `"prefix"` string, samples a continuation for
each from any local HuggingFace causal LM folder, and writes the same objects
plus `"generative_negative"` and `"generative_negative_words"`.

Resuming: the output is appended one batch at a time and flushed, so a killed
run loses at most one batch; rerunning with the same arguments skips the
records already in the output (a truncated last line is dropped) and the
final file holds every input record once.

Identity of a record: its `"id"` when present, else its position among the
id-less records. The output keeps the objects exactly as given (no extra id
field), so id-less records are matched by position; that is sound because the
output is always written in input order. Every matched record's prefix is
checked against the input, so an output from a different input is refused.

Reproducibility: batches are aligned to a fixed grid over the good input
records (batch k = records [k*B, (k+1)*B)) and batch k samples under
`torch.manual_seed(seed + k)`. A run resumed after whole batches therefore
writes byte-identical text to an uninterrupted run. Caveat: if the output
holds part of a batch (a different --batch_size, or records done by another
run), the rest of that batch is sampled as a smaller batch and its text
differs from an uninterrupted run (still a valid sample); all later batches
are unaffected. Text also differs across devices and torch versions.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from tqdm import tqdm

from rankgen_jax.data.jsonl import iter_jsonl, open_binary
from rankgen_jax.errors import RankgenError
from rankgen_jax.lm.generation import check_prefix_record
from rankgen_jax.lm.scoring import lm_max_positions, load_lm_and_tokenizer

# A word that ends a sentence: terminal punctuation, optionally followed by
# closing quotes or brackets ("end." / "end!" / 'end?"' / "end.)").
_SENTENCE_END = re.compile(r"[.!?](?:[\"'\u201d\u2019)\]]*)$")
_WORD = re.compile(r"\S+")
# Samples below min_words get this many more tries before they are kept as they are.
RESAMPLE_TRIES = 2


def trim_continuation(text: str, min_words: int, max_words: int) -> str:
    """Cut a sample to at most `max_words` words, at the last sentence end at or after `min_words` words.

    With no sentence end in that range the text is cut at `max_words` words
    (or kept whole when shorter). Whitespace inside the kept text is kept as
    sampled; leading and trailing whitespace is stripped.
    """
    spans = [m.span() for m in _WORD.finditer(text)][:max_words]
    if not spans:
        return ""
    end = spans[-1][1]
    # Search the kept words backwards for a sentence end that leaves at least min_words words.
    # Word i (0-based) ends a continuation of i + 1 words, so stop at i = min_words - 1.
    for i in range(len(spans) - 1, min_words - 2, -1):
        start, stop = spans[i]
        if _SENTENCE_END.search(text[start:stop]):
            end = stop
            break
    return text[:end].strip()


def count_words(text: str) -> int:
    """Whitespace-separated words, the unit of RankGen's 10-128 word continuations."""
    return len(text.split())


@dataclass
class _Record:
    """One good input record waiting to be generated."""

    position: int  # ordinal among the good input records (drives batching and seeding)
    obj: dict


@dataclass
class _Done:
    """What the existing output already holds."""

    by_id: dict[str, str] = field(default_factory=dict)  # id key -> prefix digest
    positional: list[str] = field(default_factory=list)  # prefix digests of id-less records, in order
    count: int = 0


def _digest(prefix: str) -> str:
    return hashlib.sha1(prefix.encode("utf-8")).hexdigest()


def _id_key(obj: dict) -> str | None:
    """A hashable key for the record's id, or None when it has none (`"id": null` counts as none)."""
    if obj.get("id") is None:
        return None
    return json.dumps(obj["id"], sort_keys=True)


def _parse_output_line(raw: bytes):
    """A generated output record, None for a blank line; raises ValueError for anything else."""
    if not raw.strip():
        return None
    obj = json.loads(raw.decode("utf-8"))  # JSONDecodeError and UnicodeDecodeError are ValueErrors
    if not (isinstance(obj, dict) and isinstance(obj.get("prefix"), str)
            and isinstance(obj.get("generative_negative"), str)):
        raise ValueError("not a generated record")
    return obj


def _read_done(output: Path) -> _Done:
    """Read the records already in `output`, truncating a partial last line so appends stay valid JSONL."""
    done = _Done()
    if not output.exists():
        return done
    if not output.is_file():
        raise RankgenError(f"output {output} exists and is not a file")
    good_end = 0
    broken = None  # line number of an unreadable line; fine only if it is the last one
    with open(output, "rb") as f:
        for n, raw in enumerate(f, start=1):
            if broken is not None:
                raise RankgenError(f"output {output} line {broken} is not a generated record; use a new --out")
            try:
                obj = _parse_output_line(raw)
            except ValueError:
                broken = n
                continue
            if not raw.endswith(b"\n"):
                break  # the last line, complete JSON but cut before its newline: regenerate it
            good_end += len(raw)
            if obj is None:
                continue
            key = _id_key(obj)
            if key is None:
                done.positional.append(_digest(obj["prefix"]))
            else:
                done.by_id[key] = _digest(obj["prefix"])
            done.count += 1
    # Drop a line cut off by a killed run, so the next append starts on a fresh line.
    if good_end != output.stat().st_size:
        os.truncate(output, good_end)
    return done


@dataclass
class _InputStats:
    bad_lines: int = 0
    duplicate_ids: int = 0
    skipped_existing: int = 0


def _iter_pending(input_path: Path, done: _Done, stats: _InputStats, on_bad):
    """Yield the good input records not yet in the output; count bad lines and already-done records.

    `on_bad()` is called for every bad line, so the progress bar (whose total
    leaves out only the records already done) still reaches its end.
    """
    seen_ids: set[str] = set()
    idless = 0
    position = 0

    def skip(reason: str, number: int) -> None:
        stats.bad_lines += 1
        on_bad()

    for n, obj in iter_jsonl(input_path, check_prefix_record, skip):
        key = _id_key(obj)
        if key is not None:
            if key in seen_ids:
                # A repeated id would make resuming ambiguous; keep the first one only.
                stats.bad_lines += 1
                stats.duplicate_ids += 1
                on_bad()
                continue
            seen_ids.add(key)
            existing = done.by_id.get(key)
        else:
            existing = done.positional[idless] if idless < len(done.positional) else None
            idless += 1
        if existing is not None:
            if existing != _digest(obj["prefix"]):
                raise RankgenError(
                    f"output record for input line {n} has a different prefix: the output was made "
                    "from another input; use a new --out"
                )
            stats.skipped_existing += 1
        else:
            yield _Record(position, obj)
        position += 1


def _grid_batches(records, batch_size: int):
    """Group pending records by their fixed batch index (position // batch_size), in order."""
    current, index = [], None
    for rec in records:
        k = rec.position // batch_size
        if current and k != index:
            yield index, current
            current = []
        current.append(rec)
        index = k
    if current:
        yield index, current


def _count_lines(path: Path) -> int:
    """Non-blank lines, for the progress bar total (cheap: no JSON parsing)."""
    with open_binary(path) as f:
        return sum(1 for line in f if line.strip())


def _sample(model, tokenizer, prompts: list[str], *, max_prompt_tokens: int, top_p: float,
            max_new_tokens: int, device: str) -> tuple[list[str], int]:
    """One nucleus sample per prompt; returns the decoded continuations and the number of tokens generated."""
    import torch  # heavy and optional (the torch extra): only where an LM runs

    enc = tokenizer(prompts, return_tensors="pt", padding=True, truncation=True, max_length=max_prompt_tokens)
    enc = {k: v.to(device) for k, v in enc.items() if k in ("input_ids", "attention_mask")}
    eos_id = tokenizer.eos_token_id
    with torch.no_grad():
        out = model.generate(
            **enc, do_sample=True, top_p=top_p, top_k=0, max_new_tokens=max_new_tokens,
            pad_token_id=tokenizer.pad_token_id, eos_token_id=eos_id,
        )
    new = out[:, enc["input_ids"].shape[1]:].cpu()
    # Tokens actually generated: up to and including the first eos (after it generate only pads).
    tokens = 0
    for row in new.tolist():
        tokens += row.index(eos_id) + 1 if eos_id is not None and eos_id in row else len(row)
    return tokenizer.batch_decode(new, skip_special_tokens=True), tokens


def generate_negatives(lm_dir: str, input_path: str, output_path: str, *, batch_size: int = 8, top_p: float = 0.9,
                       min_words: int = 10, max_words: int = 128, max_new_tokens: int = 192, seed: int = 0,
                       device: str = "cpu", max_prompt_tokens: int | None = None, progress: bool = True) -> dict:
    """Add a sampled `"generative_negative"` to every record of a prefix JSONL file (resumable).

    Returns stats: `done` (records generated by this run), `skipped_existing`
    (already in the output), `bad_lines` (malformed JSON, missing or empty
    prefix, repeated id), `short` (still under `min_words` after the retries;
    kept), `seconds`, `tokens_per_second` (generated tokens, retries included).
    """
    import torch  # heavy and optional (the torch extra): only where an LM runs

    if batch_size < 1:
        raise RankgenError(f"--batch_size must be at least 1, got {batch_size}")
    if not 0.0 < top_p <= 1.0:
        raise RankgenError(f"--top_p must be in (0, 1], got {top_p}")
    if not 1 <= min_words <= max_words:
        raise RankgenError(f"need 1 <= --min_words <= --max_words, got {min_words} and {max_words}")
    if max_new_tokens < 1:
        raise RankgenError(f"--max_new_tokens must be at least 1, got {max_new_tokens}")
    source, output = Path(input_path), Path(output_path)
    if not source.is_file():
        raise RankgenError(f"input {input_path} does not exist or is not a file")
    if not output.parent.is_dir():
        raise RankgenError(f"output folder {output.parent} does not exist")
    if output.exists() and output.resolve() == source.resolve():
        raise RankgenError("--out must differ from --input")
    # Check (and repair) the output before loading the model, so a bad --out fails fast.
    done = _read_done(output)

    config, model, tokenizer = load_lm_and_tokenizer(lm_dir, device)
    if max_prompt_tokens is None:
        limit = lm_max_positions(config)
        # Unknown context size (e.g. rotary models without the attribute): do not truncate.
        max_prompt_tokens = limit - max_new_tokens if limit is not None else None
    if max_prompt_tokens is not None and max_prompt_tokens < 1:
        raise RankgenError(
            f"no room for a prompt: max_new_tokens {max_new_tokens} fills the model's context; "
            "lower --max_new_tokens or set --max_prompt_tokens"
        )

    stats = _InputStats()
    total = max(_count_lines(source) - done.count, 0)
    bar = tqdm(total=total, unit="line", desc="generate-negatives", dynamic_ncols=True, disable=not progress,
               file=sys.stderr)
    generated = short = tokens = 0
    start = time.perf_counter()
    sample = dict(max_prompt_tokens=max_prompt_tokens, top_p=top_p, max_new_tokens=max_new_tokens, device=device)
    try:
        with open(output, "a", encoding="utf-8") as out:
            pending = _iter_pending(source, done, stats, on_bad=lambda: bar.update(1))
            for index, batch in _grid_batches(pending, batch_size):
                torch.manual_seed(seed + index)
                prompts = [rec.obj["prefix"] for rec in batch]
                texts, n = _sample(model, tokenizer, prompts, **sample)
                tokens += n
                results = [trim_continuation(t, min_words, max_words) for t in texts]
                for _ in range(RESAMPLE_TRIES):
                    retry = [i for i, r in enumerate(results) if count_words(r) < min_words]
                    if not retry:
                        break
                    texts, n = _sample(model, tokenizer, [prompts[i] for i in retry], **sample)
                    tokens += n
                    for i, t in zip(retry, texts):
                        again = trim_continuation(t, min_words, max_words)
                        # Keep the longer of the two, so a retry never makes a short sample worse.
                        if count_words(again) > count_words(results[i]):
                            results[i] = again
                lines = []
                for rec, text in zip(batch, results):
                    words = count_words(text)
                    short += words < min_words
                    lines.append(json.dumps({**rec.obj, "generative_negative": text,
                                             "generative_negative_words": words}, ensure_ascii=False) + "\n")
                # One write + flush per batch: a killed run loses at most this batch.
                out.write("".join(lines))
                out.flush()
                generated += len(batch)
                bar.update(len(batch))
                elapsed = time.perf_counter() - start
                bar.set_postfix(tok_s=f"{tokens / elapsed:.0f}" if elapsed > 0 else "-", refresh=False)
    finally:
        bar.close()
    seconds = time.perf_counter() - start
    result = {
        "done": generated,
        "skipped_existing": stats.skipped_existing,
        "bad_lines": stats.bad_lines,
        "duplicate_ids": stats.duplicate_ids,
        "short": short,
        "seconds": seconds,
        "tokens_per_second": tokens / seconds if seconds > 0 else 0.0,
    }
    print(
        f"generate-negatives: {generated} generated, {stats.skipped_existing} already done, "
        f"{stats.bad_lines} bad lines skipped, {short} short (< {min_words} words) in {seconds:.1f}s "
        f"({result['tokens_per_second']:.0f} tokens/s) -> {output}"
    )
    return result
