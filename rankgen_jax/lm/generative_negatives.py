"""Generative negatives: sample one continuation per prefix from a causal LM (RankGen's hard negatives).

RankGen trains against continuations sampled with nucleus sampling (p=0.9)
from an LM, trimmed to 10-128 words (docs/design/rankgen.md, 'RankGen training'). This module reads
a JSONL file of objects with a `"prefix"` string, samples a continuation for
each from any local HuggingFace causal LM folder (or a GGUF file), and writes the same objects
plus `"generative_negative"` and `"generative_negative_words"`.

Length (`length_match`): a sample cut at its last sentence end within 128
words is about 128 words long, while the golds are drawn from 10-128 words, so
a ranker could learn "the shorter one is human". With `length_match="gold"`
(the default) each sample is cut at the sentence end nearest its record's gold
`"continuation"` word count (`cut_to_length`), so negatives and golds share one
length distribution; `"range"` keeps the plain 10-128-word trim
(`trim_continuation`) for input without golds.

Resuming: the output is appended one batch at a time and flushed, so a killed
run loses at most one batch; rerunning with the same arguments skips the
records already in the output (a truncated last line is dropped) and the
final file holds every input record once.

Identity of a record: its `"id"` when present, else its position among the
id-less records (of its shard, when sharded). The output keeps the objects
exactly as given (no extra id field), so id-less records are matched by
position; that is sound because the output is always written in input order.
Every matched record's prefix is checked against the input, so an output from
a different input is refused.

Reproducibility: the good input records (those with a non-empty string prefix,
a repeated id's later records left out) are numbered by their position in the
input, and batch k is records [k*B, (k+1)*B) of that numbering, whatever has
been done already. Sampling is `lm.generation`'s (nucleus, one seeded stream of
uniforms per row): the record at position i draws attempt a (0, then the
resamples of a short one) from `row_seed(seed, i, a, 0, 0)`, so its text
depends on its own prefix, position and the settings, not on the rows sampled
beside it. A batch is always sampled whole (the same rows, so the same
padding); on a resume the rows already in the output are sampled again and not
written. A resumed run, or shards that together cover the input, therefore
write byte-identical records to one uninterrupted run (on the same device type
and torch / transformers versions; text differs across those).

Sharding (`num_shards` N > 1, `shard_index` I): shard I takes batch k when
k % N == I, so shards need nothing from each other and every shard is
resumable like a plain run. A shard's output starts with one header line,
`{"generate_negatives_shard": {"shard_index", "num_shards", "settings",
"made_with"}}`: `settings` (the sha256 of the LM folder's files and of the
input file, batch size, top_p, seed, word limits, token limits, retries)
must match to resume a shard or to merge shards; `made_with` (paths, device,
torch and transformers versions) is informational. `merge_negatives` reads the
input and the N shard files and writes the records in input order, the same
bytes one unsharded run writes, after checking that every good input record is
in its shard exactly once.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from tqdm import tqdm

from rankgen_jax.data.jsonl import iter_jsonl, open_binary
from rankgen_jax.errors import RankgenError
from rankgen_jax.lm.generation import Decoding, SampleRow, check_prefix_record, prompt_ids, row_seed, sample_rows
from rankgen_jax.lm.scoring import CausalLM, load_causal_lm
from rankgen_jax.pretrained import resolve_model

# A word that ends a sentence: terminal punctuation, optionally followed by
# closing quotes or brackets ("end." / "end!" / 'end?"' / "end.)").
_SENTENCE_END = re.compile(r"[.!?](?:[\"'\u201d\u2019)\]]*)$")
_WORD = re.compile(r"\S+")
# Samples below min_words get this many more tries before they are kept as they are.
RESAMPLE_TRIES = 2
# The key of a shard file's first line (see the module docstring).
SHARD_HEADER = "generate_negatives_shard"
# How a sample's length is set: to its record's gold continuation, or anywhere in min..max words.
LENGTH_MATCHES = ("gold", "range")
# How far (a fraction of the gold's words) the nearest sentence end may lie before the cut falls mid-sentence:
# the InBook negatives' own tolerance (ExampleConfig.length_tolerance).
LENGTH_TOLERANCE = 0.5
# A record length matching reads its gold from, and the skip reason of one without it.
GOLD_FIELD = "continuation"
NO_GOLD = "no non-empty string \"continuation\" to match the length of"


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


def cut_to_length(text: str, target_words: int, tolerance: float = LENGTH_TOLERANCE) -> str:
    """Cut a sample at the sentence end whose word count is nearest `target_words` (the gold's length).

    Sentence ends on both sides of the target count, so the cut lengths scatter around the target
    rather than below it. With no sentence end within `tolerance * target_words` words of it, the
    text is cut at exactly `target_words` words, mid-sentence; a shorter sample is kept whole. The caller
    resamples both (`RESAMPLE_TRIES`): a gold always ends at a sentence end, so a cut that does not is a cue.
    """
    spans = [m.span() for m in _WORD.finditer(text)]
    if len(spans) <= target_words:
        return text.strip()
    ends = [i + 1 for i, (start, stop) in enumerate(spans) if _SENTENCE_END.search(text[start:stop])]
    keep = target_words
    if ends:
        nearest = min(ends, key=lambda n: (abs(n - target_words), n))
        if abs(nearest - target_words) <= tolerance * target_words:
            keep = nearest
    return text[:spans[keep - 1][1]].strip()


def ends_sentence(text: str) -> bool:
    """Whether the text's last word ends a sentence (as a gold continuation's always does)."""
    words = text.split()
    return bool(words) and bool(_SENTENCE_END.search(words[-1]))


def count_words(text: str) -> int:
    """Whitespace-separated words, the unit of RankGen's 10-128 word continuations."""
    return len(text.split())


def shard_of_position(position: int, batch_size: int, num_shards: int) -> int:
    """The shard that samples the good input record at `position`: its batch index modulo the shard count."""
    return (position // batch_size) % num_shards


@dataclass
class _Record:
    """One good input record of this run's shard."""

    position: int  # ordinal among the good input records (drives batching, seeding and sharding)
    obj: dict
    done: bool  # already in the output: sampled with its batch again, not written again


@dataclass
class _Done:
    """What the existing output already holds."""

    by_id: dict[str, str] = field(default_factory=dict)  # id key -> prefix digest
    positional: list[str] = field(default_factory=list)  # prefix digests of id-less records, in order
    count: int = 0
    header: dict | None = None  # a shard file's first line (the value under SHARD_HEADER)


def _digest(prefix: str) -> str:
    return hashlib.sha1(prefix.encode("utf-8")).hexdigest()


def _id_key(obj: dict) -> str | None:
    """A hashable key for the record's id, or None when it has none (`"id": null` counts as none)."""
    if obj.get("id") is None:
        return None
    return json.dumps(obj["id"], sort_keys=True)


def _identity(obj: dict) -> tuple:
    """What makes two records the same record: id and prefix."""
    return _id_key(obj), _digest(obj["prefix"])


def _describe(obj: dict) -> str:
    """A record as an error message names it: its id, else the start of its prefix."""
    if obj.get("id") is not None:
        return f"id {json.dumps(obj['id'])}"
    prefix = obj["prefix"]
    return f"prefix {json.dumps(prefix[:40] + ('...' if len(prefix) > 40 else ''))}"


def _parse_output_line(raw: bytes):
    """A generated output record, None for a blank line; raises ValueError for anything else."""
    if not raw.strip():
        return None
    obj = json.loads(raw.decode("utf-8"))  # JSONDecodeError and UnicodeDecodeError are ValueErrors
    if not (isinstance(obj, dict) and isinstance(obj.get("prefix"), str)
            and isinstance(obj.get("generative_negative"), str)):
        raise ValueError("not a generated record")
    return obj


def _parse_header(raw: bytes) -> dict | None:
    """The shard header of a first line, or None when the line is no header."""
    try:
        obj = json.loads(raw.decode("utf-8"))
    except ValueError:
        return None
    if isinstance(obj, dict) and set(obj) == {SHARD_HEADER} and isinstance(obj[SHARD_HEADER], dict):
        return obj[SHARD_HEADER]
    return None


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
                raise RankgenError(
                    f"output {output} line {broken} is not a generated record; write to a new output file"
                )
            if n == 1 and (header := _parse_header(raw)) is not None:
                if not raw.endswith(b"\n"):
                    break  # a header cut before its newline: written again
                done.header = header
                good_end += len(raw)
                continue
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
    no_gold: int = 0
    skipped_existing: int = 0


def _record_check(length_match: str):
    """The check a good input record passes: a prefix, and with `length_match="gold"` a gold continuation."""
    if length_match == "range":
        return check_prefix_record

    def check(record: dict) -> str | None:
        gold = record.get(GOLD_FIELD)
        return check_prefix_record(record) or (None if isinstance(gold, str) and gold.strip() else NO_GOLD)

    return check


def _iter_good_records(input_path: Path, stats: _InputStats, on_bad, length_match: str):
    """(line number, position, object) of the good input records, positions counted from 0.

    Bad lines (malformed JSON, no non-empty string prefix, no gold continuation when the length matches
    it) and records whose id was seen before (a repeated id would make resuming ambiguous; the first one
    is kept) are counted in `stats` and reported through `on_bad()`.
    """
    seen_ids: set[str] = set()
    position = 0

    def skip(reason: str, number: int) -> None:
        stats.bad_lines += 1
        stats.no_gold += reason == NO_GOLD
        on_bad()

    for n, obj in iter_jsonl(input_path, _record_check(length_match), skip):
        key = _id_key(obj)
        if key is not None:
            if key in seen_ids:
                stats.bad_lines += 1
                stats.duplicate_ids += 1
                on_bad()
                continue
            seen_ids.add(key)
        yield n, position, obj
        position += 1


def _iter_shard_records(input_path: Path, done: _Done, stats: _InputStats, *, batch_size: int, num_shards: int,
                        shard_index: int, on_skip, length_match: str):
    """This shard's good input records, each marked done when the output holds it already.

    `on_skip()` is called for every input line this run does not generate
    (bad lines, other shards' records, records already done), so the progress
    bar, whose total is the input's lines, still reaches its end.
    """
    idless = 0  # id-less records of this shard seen so far: their identity in the output
    for n, position, obj in _iter_good_records(input_path, stats, on_skip, length_match):
        if shard_of_position(position, batch_size, num_shards) != shard_index:
            on_skip()
            continue
        key = _id_key(obj)
        if key is not None:
            existing = done.by_id.get(key)
        else:
            existing = done.positional[idless] if idless < len(done.positional) else None
            idless += 1
        if existing is not None:
            if existing != _digest(obj["prefix"]):
                raise RankgenError(
                    f"output record for input line {n} has a different prefix: the output was made "
                    "from another input; write to a new output file"
                )
            stats.skipped_existing += 1
            on_skip()
        yield _Record(position, obj, existing is not None)


def _grid_batches(records, batch_size: int):
    """Group records by their fixed batch index (position // batch_size), in order."""
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


def _file_sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _lm_sha256(lm: str) -> str:
    """The LM's identity in a shard header: its GGUF file's sha256, or its folder's (`_folder_sha256`)."""
    path = Path(resolve_model(lm))
    return _file_sha256(path) if path.is_file() else _folder_sha256(path)


def _folder_sha256(folder: Path) -> str:
    """sha256 over the relative path and bytes of every file in the folder (hidden entries left out).

    Path-independent, so copies of one LM on different machines agree; it reads
    the weights once (seconds per GB).
    """
    digest = hashlib.sha256()
    files = sorted(p for p in folder.rglob("*")
                   if p.is_file() and not any(part.startswith(".") for part in p.relative_to(folder).parts))
    for path in files:
        digest.update(path.relative_to(folder).as_posix().encode("utf-8") + b"\0")
        digest.update(_file_sha256(path).encode("ascii") + b"\n")
    return digest.hexdigest()


def _sample(lm: CausalLM, prompts: list[str], seeds: list[int], *, max_prompt_tokens: int | None, top_p: float,
            max_new_tokens: int) -> tuple[list[str], int]:
    """One nucleus sample per prompt, each from its own seed; the decoded continuations and the tokens generated."""
    rows = [SampleRow(prompt_ids(lm, prompt, max_new_tokens, max_prompt_tokens), max_new_tokens, seed)
            for prompt, seed in zip(prompts, seeds)]
    new, _ = sample_rows(lm, rows, Decoding("nucleus", top_p), max_batch_rows=len(rows))
    return [lm.decode(ids) for ids in new], sum(len(ids) for ids in new)


def _sample_batch(lm: CausalLM, prompts: list[str], positions: list[int], targets: list[int] | None, seed: int, *,
                  min_words: int, max_words: int, **sample) -> tuple[list[str], int]:
    """A grid batch's cut negatives (retries for short ones included), each row from its own seeds.

    `targets`: each prompt's gold length in words (`length_match="gold"`), or None for the 10-128 trim.
    """
    if targets is None:
        def cut(i, text):
            return trim_continuation(text, min_words, max_words)

        def quality(i, text):  # longer is better, up to the shortest length
            return (min(count_words(text), min_words),)
    else:
        def cut(i, text):
            return cut_to_length(text, targets[i])

        def quality(i, text):
            # A cut at a sentence end (a gold always ends at one: a mid-sentence cut would be a cue of its
            # own), then one within the tolerance of the gold's length, then the nearest to it.
            words = count_words(text)
            return (ends_sentence(text), words >= math.ceil((1 - LENGTH_TOLERANCE) * targets[i]),
                    -abs(words - targets[i]))

    def good_enough(i, text):
        want = (min_words,) if targets is None else (True, True)
        return quality(i, text)[: len(want)] >= want

    texts, tokens = _sample(lm, prompts, [row_seed(seed, p, 0, 0, 0) for p in positions], **sample)
    results = [cut(i, t) for i, t in enumerate(texts)]
    for attempt in range(1, RESAMPLE_TRIES + 1):
        retry = [i for i, r in enumerate(results) if not good_enough(i, r)]
        if not retry:
            break
        seeds = [row_seed(seed, positions[i], attempt, 0, 0) for i in retry]
        texts, n = _sample(lm, [prompts[i] for i in retry], seeds, **sample)
        tokens += n
        for i, t in zip(retry, texts):
            again = cut(i, t)
            # Keep the better of the two, so a retry never makes a sample worse.
            if quality(i, again) > quality(i, results[i]):
                results[i] = again
    return results, tokens


def _shard_header(lm_dir: str, source: Path, *, shard_index: int, num_shards: int, settings: dict,
                  device: str) -> dict:
    import torch  # heavy and optional (the torch extra): only where an LM runs
    import transformers  # heavy and optional, as torch

    return {
        "shard_index": shard_index,
        "num_shards": num_shards,
        "settings": {"lm_sha256": _lm_sha256(lm_dir), "input_sha256": _file_sha256(source), **settings},
        "made_with": {"lm": str(lm_dir), "input": str(source), "device": device, "torch": torch.__version__,
                      "transformers": transformers.__version__},
    }


def _settings_difference(found: dict, wanted: dict) -> str:
    """The settings two shard headers disagree on, for an error message ('' when none)."""
    keys = sorted(set(found) | set(wanted))
    return ", ".join(f"{k} {json.dumps(found.get(k))} vs {json.dumps(wanted.get(k))}"
                     for k in keys if found.get(k) != wanted.get(k))


def _check_output_header(output: Path, done: _Done, header: dict | None) -> None:
    """Refuse to resume an output whose shard header (or its absence) disagrees with this run's."""
    if header is None:
        if done.header is not None:
            raise RankgenError(
                f"output {output} is shard {done.header.get('shard_index')} of {done.header.get('num_shards')} "
                "(written with `num_shards`); resume it with the same `num_shards` / `shard_index`, or combine "
                "the shards with merge-negatives", names=("num_shards", "shard_index"))
        return
    if done.header is None:
        if done.count:
            raise RankgenError(f"output {output} holds records but no shard header (an unsharded run's output); "
                               "write each shard to a new output file")
        return
    where = (done.header.get("shard_index"), done.header.get("num_shards"))
    if where != (header["shard_index"], header["num_shards"]):
        raise RankgenError(f"output {output} is shard {where[0]} of {where[1]}, not shard {header['shard_index']} "
                           f"of {header['num_shards']}; write to a new output file")
    difference = _settings_difference(done.header.get("settings") or {}, header["settings"])
    if difference:
        raise RankgenError(f"output {output} was made with other settings ({difference}; the file's first); "
                           "rerun with its settings or write to a new output file")


@dataclass(frozen=True)
class NegativeSampling:
    """How generate_negatives samples: nucleus `top_p`, at most `max_new_tokens` new tokens after the last
    `max_prompt_tokens` of the prefix (None: the LM's context less the budget), cut to the gold's length
    (`length_match="gold"`, clamped to min_words..max_words; see the module docstring) or anywhere in
    min_words..max_words (`"range"`); `batch_size` prefixes a batch, seeded from `seed` and the batch's index."""

    batch_size: int = 8
    top_p: float = 0.9
    min_words: int = 10
    max_words: int = 128
    max_new_tokens: int = 192
    max_prompt_tokens: int | None = None
    seed: int = 0
    length_match: str = "gold"

    def check(self) -> None:
        """Raise RankgenError naming the first bad setting."""
        if self.length_match not in LENGTH_MATCHES:
            raise RankgenError(f"`length_match` must be one of {', '.join(LENGTH_MATCHES)}, got {self.length_match!r}",
                               names=("length_match",))
        for name in ("batch_size", "max_new_tokens"):
            if getattr(self, name) < 1:
                raise RankgenError(f"`{name}` must be at least 1, got {getattr(self, name)}", names=(name,))
        if not 0.0 < self.top_p <= 1.0:
            raise RankgenError(f"`top_p` must be in (0, 1], got {self.top_p}", names=("top_p",))
        if not 1 <= self.min_words <= self.max_words:
            raise RankgenError(f"need 1 <= `min_words` <= `max_words`, got {self.min_words} and {self.max_words}",
                               names=("min_words", "max_words"))


def generate_negatives(lm_dir: str, input_path: str, output_path: str, sampling: NegativeSampling = NegativeSampling(),
                       *, device: str = "cpu", num_shards: int = 1, shard_index: int = 0,
                       progress: bool = True) -> dict:
    """Add a sampled `"generative_negative"` to every record of a prefix JSONL file (resumable), as `sampling` says.

    With `num_shards` N > 1 only shard `shard_index`'s batches are sampled and
    the output is a shard file (see the module docstring); `merge_negatives`
    joins the N shard files.

    Returns stats: `done` (records generated by this run), `skipped_existing`
    (already in the output), `bad_lines` (malformed JSON, missing or empty
    prefix, repeated id, no gold to match), `no_gold` (of those, records without a gold continuation),
    `short` (still under `min_words`, or under the gold's length by more than the tolerance, after the
    retries; kept), `mid_sentence` (gold lengths: still without a sentence end near the gold's length after
    the retries, so cut at it mid-sentence; kept), `seconds`, `tokens_per_second` (generated tokens, retries and
    resampled done rows included).
    """
    sampling.check()
    if num_shards < 1:
        raise RankgenError(f"`num_shards` must be at least 1, got {num_shards}", names=("num_shards",))
    if not 0 <= shard_index < num_shards:
        raise RankgenError(f"`shard_index` must be in [0, {num_shards}) for `num_shards` {num_shards}, "
                           f"got {shard_index}", names=("shard_index", "num_shards"))
    batch_size, top_p, min_words, max_words = (
        sampling.batch_size,
        sampling.top_p,
        sampling.min_words,
        sampling.max_words,
    )
    max_new_tokens, max_prompt_tokens, seed = sampling.max_new_tokens, sampling.max_prompt_tokens, sampling.seed
    length_match = sampling.length_match
    source, output = Path(input_path), Path(output_path)
    if not source.is_file():
        raise RankgenError(f"input {input_path} does not exist or is not a file")
    if not output.parent.is_dir():
        raise RankgenError(f"output folder {output.parent} does not exist")
    if output.exists() and output.resolve() == source.resolve():
        raise RankgenError(f"output {output_path} is the input file; write the negatives elsewhere")
    # Check (and repair) the output before loading the model, so a bad output fails fast.
    done = _read_done(output)
    if num_shards == 1:
        _check_output_header(output, done, None)

    lm = load_causal_lm(lm_dir, device)
    if max_prompt_tokens is None:
        limit = lm.max_positions
        # Unknown context size (e.g. rotary models without the attribute): do not truncate.
        max_prompt_tokens = limit - max_new_tokens if limit is not None else None
    if max_prompt_tokens is not None and max_prompt_tokens < 1:
        raise RankgenError(
            f"no room for a prompt: `max_new_tokens` {max_new_tokens} fills the model's context; "
            "lower it or set `max_prompt_tokens`", names=("max_new_tokens", "max_prompt_tokens"))
    header = None
    if num_shards > 1:
        settings = dict(batch_size=batch_size, top_p=top_p, seed=seed, min_words=min_words, max_words=max_words,
                        max_new_tokens=max_new_tokens, max_prompt_tokens=max_prompt_tokens,
                        resample_tries=RESAMPLE_TRIES, length_match=length_match)
        header = _shard_header(lm_dir, source, shard_index=shard_index, num_shards=num_shards,
                               settings=settings, device=device)
        _check_output_header(output, done, header)

    stats = _InputStats()
    bar = tqdm(total=_count_lines(source), unit="line", desc="generate-negatives", dynamic_ncols=True,
               disable=not progress, file=sys.stderr)
    generated = short = mid_sentence = tokens = 0
    start = time.perf_counter()
    sample = dict(max_prompt_tokens=max_prompt_tokens, top_p=top_p, max_new_tokens=max_new_tokens,
                  min_words=min_words, max_words=max_words)
    try:
        with open(output, "a", encoding="utf-8") as out:
            if header is not None and done.header is None:
                out.truncate(0)  # blank lines only (or nothing): the header must be the first line
                out.write(json.dumps({SHARD_HEADER: header}, ensure_ascii=False) + "\n")
                out.flush()
            records = _iter_shard_records(source, done, stats, batch_size=batch_size, num_shards=num_shards,
                                          shard_index=shard_index, on_skip=lambda: bar.update(1),
                                          length_match=length_match)
            for index, batch in _grid_batches(records, batch_size):
                pending = [rec for rec in batch if not rec.done]
                if not pending:
                    continue
                targets = None
                if length_match == "gold":
                    targets = [min(max(count_words(rec.obj[GOLD_FIELD]), min_words), max_words) for rec in batch]
                # The whole grid batch is sampled, done rows included: the same rows as in an uninterrupted run.
                results, n = _sample_batch(lm, [rec.obj["prefix"] for rec in batch],
                                           [rec.position for rec in batch], targets, seed, **sample)
                tokens += n
                lines = []
                for i, (rec, text) in enumerate(zip(batch, results)):
                    if rec.done:
                        continue
                    words = count_words(text)
                    least = min_words if targets is None else math.ceil((1 - LENGTH_TOLERANCE) * targets[i])
                    short += words < least
                    mid_sentence += targets is not None and not ends_sentence(text)
                    lines.append(json.dumps({**rec.obj, "generative_negative": text,
                                             "generative_negative_words": words}, ensure_ascii=False) + "\n")
                # One write + flush per batch: a killed run loses at most this batch.
                out.write("".join(lines))
                out.flush()
                generated += len(pending)
                bar.update(len(pending))
                elapsed = time.perf_counter() - start
                bar.set_postfix(tok_s=f"{tokens / elapsed:.0f}" if elapsed > 0 else "-", refresh=False)
    finally:
        bar.close()
    seconds = time.perf_counter() - start
    if stats.no_gold and not generated and not stats.skipped_existing:
        raise RankgenError(f"{input_path}: no record has a gold \"continuation\" to match the length of "
                           f"({stats.no_gold} without one); `length_match` range samples prefix-only records",
                           names=("length_match",))
    result = {
        "done": generated,
        "skipped_existing": stats.skipped_existing,
        "bad_lines": stats.bad_lines,
        "duplicate_ids": stats.duplicate_ids,
        "no_gold": stats.no_gold,
        "short": short,
        "mid_sentence": mid_sentence,
        "seconds": seconds,
        "tokens_per_second": tokens / seconds if seconds > 0 else 0.0,
    }
    shard = f" (shard {shard_index} of {num_shards})" if num_shards > 1 else ""
    no_gold = (f" ({stats.no_gold} without a gold \"continuation\" to match: length_match range samples "
               "without one)") if stats.no_gold else ""
    shortest = (f"< {min_words} words" if length_match == "range"
                else f"under their gold's length; {mid_sentence} cut mid-sentence")
    print(
        f"generate-negatives{shard}: {generated} generated, {stats.skipped_existing} already done, "
        f"{stats.bad_lines} bad lines skipped{no_gold}, {short} short ({shortest}) in {seconds:.1f}s "
        f"({result['tokens_per_second']:.0f} tokens/s) -> {output}"
    )
    return result


@dataclass
class _ShardFile:
    """One shard file being merged: its header and a reader over its records, in file order."""

    path: Path
    header: dict
    lines: object = None  # the open file, positioned after the header
    line_number: int = 1
    count: int = 0  # records read so far

    def next_record(self) -> tuple[bytes, dict] | None:
        """The next record line and its object; None at the end (a last line cut before its newline is the end)."""
        for raw in self.lines:
            self.line_number += 1
            try:
                obj = _parse_output_line(raw)
            except ValueError:
                if not raw.endswith(b"\n"):
                    return None  # a shard killed while writing: its unfinished tail is missing, not corrupt
                raise RankgenError(f"shard file {self.path} line {self.line_number} is not a generated record")
            if not raw.endswith(b"\n"):
                return None  # complete JSON but maybe a cut-off longer line: a resume would regenerate it
            if obj is not None:
                self.count += 1
                return raw, obj
        return None


def _open_shard(path: Path) -> _ShardFile:
    if not path.is_file():
        raise RankgenError(f"shard file {path} does not exist or is not a file")
    f = open(path, "rb")
    header = _parse_header(f.readline())
    if header is None:
        f.close()
        raise RankgenError(f"shard file {path} has no shard header on its first line: not written by "
                           "generate_negatives with `num_shards` > 1", names=("num_shards",))
    settings, num_shards, index = header.get("settings"), header.get("num_shards"), header.get("shard_index")

    def whole(value, low):  # an int (not a bool) of at least `low`
        return isinstance(value, int) and not isinstance(value, bool) and value >= low

    if not (isinstance(settings, dict) and whole(settings.get("batch_size"), 1) and whole(num_shards, 2)
            and whole(index, 0) and index < num_shards):
        f.close()
        raise RankgenError(f"shard file {path}: its header lacks a valid shard_index, num_shards or "
                           "settings.batch_size")
    return _ShardFile(path, header, f)


def merge_negatives(input_path: str, shard_paths: list[str], output_path: str) -> dict:
    """Join the shard files of one sharded `generate_negatives` run into the file one unsharded run writes.

    Checks that the shards are the N shards of one run (same settings, each
    index once, made from this input) and that every good input record is in
    its shard (`shard_of_position`), in order, exactly once; a missing or
    duplicated record is a RankgenError naming the shard file, its line and the
    record. The output is written in input order (the shards' lines as they
    are) to a temporary file renamed into place, so a refused merge writes
    nothing. Returns `records`, `shards`, `bad_lines` (input lines that are no
    record, as generate-negatives skips them).
    """
    source, output = Path(input_path), Path(output_path)
    if not source.is_file():
        raise RankgenError(f"input {input_path} does not exist or is not a file")
    if not shard_paths:
        raise RankgenError("merging needs the `shard_paths`", names=("shard_paths",))
    if not output.parent.is_dir():
        raise RankgenError(f"output folder {output.parent} does not exist")
    given = [Path(p) for p in shard_paths]
    if output.exists() and any(output.resolve() == p.resolve() for p in [source, *given] if p.exists()):
        raise RankgenError(f"output {output_path} is the input or a shard file; write the merge elsewhere")
    shards: list[_ShardFile] = []
    try:
        for path in given:
            shards.append(_open_shard(path))
        by_index = _check_shard_set(shards)
        first = shards[0]
        if _file_sha256(source) != first.header["settings"].get("input_sha256"):
            raise RankgenError(f"input {input_path} is not the file the shards were made from (its sha256 differs "
                               f"from {first.path}'s header)")
        batch_size, num_shards = first.header["settings"]["batch_size"], first.header["num_shards"]
        # Shards written before length matching existed trimmed to a word range and read prefix-only records.
        length_match = first.header["settings"].get("length_match", "range")
        stats = _InputStats()
        partial = output.with_name(output.name + ".partial")
        merged = 0
        seen: set[tuple] = set()  # identities merged so far, to tell a duplicated record from a missing one
        try:
            with open(partial, "wb") as out:
                records = _iter_good_records(source, stats, lambda: None, length_match)
                for n, position, obj in records:
                    shard = by_index[shard_of_position(position, batch_size, num_shards)]
                    found = shard.next_record()
                    if found is None:
                        missing = 1 + sum(shard_of_position(p, batch_size, num_shards) == shard.header["shard_index"]
                                          for _, p, _ in records)
                        raise RankgenError(
                            f"shard {shard.header['shard_index']} ({shard.path}) ends after {shard.count} records: "
                            f"the record of input line {n} ({_describe(obj)}) and {missing - 1} more of its records "
                            "are missing; finish that shard (rerun it to resume) before merging"
                        )
                    raw, got = found
                    if _identity(got) != _identity(obj):
                        where = f"shard {shard.header['shard_index']} ({shard.path}) line {shard.line_number}"
                        if _identity(got) in seen:
                            raise RankgenError(f"{where}: duplicated record: {_describe(got)} was merged already")
                        raise RankgenError(
                            f"{where}: the record of input line {n} ({_describe(obj)}) is missing; found "
                            f"{_describe(got)} in its place (a shard edited, or made from another input)"
                        )
                    seen.add(_identity(got))
                    out.write(raw)
                    merged += 1
                for shard in shards:
                    extra = shard.next_record()
                    if extra is not None:
                        what = "duplicated record" if _identity(extra[1]) in seen else "a record not in the input"
                        raise RankgenError(
                            f"shard {shard.header['shard_index']} ({shard.path}) line {shard.line_number}: {what}: "
                            f"{_describe(extra[1])} comes after the last record of the shard's part of the input"
                        )
            os.replace(partial, output)
        finally:
            partial.unlink(missing_ok=True)
    finally:
        for shard in shards:
            shard.lines.close()
    made_with = {json.dumps({k: v for k, v in (s.header.get("made_with") or {}).items()
                             if k in ("device", "torch", "transformers")}, sort_keys=True) for s in shards}
    note = ("; note: the shards ran on different devices or torch / transformers versions, so the text may "
            "differ from one run's") if len(made_with) > 1 else ""
    print(f"merge-negatives: {merged} records from {len(shards)} shards, {stats.bad_lines} bad input lines "
          f"skipped -> {output}{note}")
    return {"records": merged, "shards": len(shards), "bad_lines": stats.bad_lines}


def _check_shard_set(shards: list[_ShardFile]) -> dict[int, _ShardFile]:
    """The shards by index, after checking they are all N shards of one run with one set of settings."""
    first = shards[0]
    for shard in shards[1:]:
        if shard.header["num_shards"] != first.header["num_shards"]:
            raise RankgenError(f"shard file {shard.path} is one of {shard.header['num_shards']} shards, "
                               f"{first.path} one of {first.header['num_shards']}: not the same run")
        difference = _settings_difference(shard.header["settings"], first.header["settings"])
        if difference:
            raise RankgenError(f"shard file {shard.path} was made with other settings than {first.path} "
                               f"({difference}); shards of one run must share them")
    by_index: dict[int, _ShardFile] = {}
    for shard in shards:
        index = shard.header["shard_index"]
        if index in by_index:
            raise RankgenError(f"shard {index} is given twice: {by_index[index].path} and {shard.path}")
        by_index[index] = shard
    num_shards = first.header["num_shards"]
    missing = [i for i in range(num_shards) if i not in by_index]
    if missing:
        raise RankgenError(f"missing shard{'s' if len(missing) > 1 else ''} {', '.join(map(str, missing))} of "
                           f"{num_shards} (given: {', '.join(str(s.path) for s in shards)})")
    return by_index
