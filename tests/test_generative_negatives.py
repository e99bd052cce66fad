"""`generate-negatives` and `merge-negatives`: tiny local GPT-2, word limits, determinism, resume, shards, errors."""

import json
from dataclasses import replace

import numpy as np
import pytest

from rankgen_jax.cli.main import build_parser
from rankgen_jax.lm.generative_negatives import (NegativeSampling, cut_to_length, ends_sentence, generate_negatives,
                                                 merge_negatives, trim_continuation)
from rankgen_jax.errors import RankgenError
from rankgen_jax.data.vocab import REPO_ROOT

BOTCHAN = REPO_ROOT / "data" / "corpus" / "botchan" / "botchan.txt"
EOS = "<|endoftext|>"
# Small sampling settings keep every generate call to a few milliseconds.
FAST = NegativeSampling(batch_size=4, min_words=3, max_words=12, max_new_tokens=24, length_match="range")


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def lm_dir(tmp_path_factory, one_torch_thread):
    """A randomly initialised 2-layer GPT-2 with a byte-level BPE trained on Botchan, saved as an HF folder."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    lines = [l for l in BOTCHAN.read_text(encoding="utf-8").splitlines() if l.strip()][:3000]
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=[EOS],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    bpe.train_from_iterator(lines, trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token=EOS)  # no pad token: the code must add one
    eos_id = tokenizer.convert_tokens_to_ids(EOS)

    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_head=2, n_embd=32, n_positions=256, vocab_size=len(tokenizer),
                        bos_token_id=eos_id, eos_token_id=eos_id)
    out = tmp_path_factory.mktemp("tiny_gpt2")
    GPT2LMHeadModel(config).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return str(out)


def prefixes(n):
    """n distinct Botchan passages of 20-40 words as prefixes."""
    words = BOTCHAN.read_text(encoding="utf-8").split()
    return [" ".join(words[1000 + 50 * i: 1000 + 50 * i + 20 + i % 3 * 10]) for i in range(n)]


def write_jsonl(path, objs):
    path.write_text("".join(json.dumps(o) + "\n" for o in objs), encoding="utf-8")
    return path


def read_jsonl(path):
    return [json.loads(l) for l in path.read_text(encoding="utf-8").splitlines()]


@pytest.fixture
def records(tmp_path):
    """10 records with ids and extra fields that must pass through untouched."""
    objs = [{"id": f"doc{i}", "doc_id": i // 3, "prefix": p, "continuation": "gold text", "negatives": ["x"]}
            for i, p in enumerate(prefixes(10))]
    return write_jsonl(tmp_path / "in.jsonl", objs), objs


def test_trim_cuts_at_last_sentence_end_within_limits():
    text = "One two three. Four five six seven! Eight nine ten eleven twelve"
    assert trim_continuation(text, 2, 20) == "One two three. Four five six seven!"
    # The only sentence end within 8 words comes before min_words=5: cut at max_words instead.
    assert trim_continuation(text, 8, 8) == "One two three. Four five six seven! Eight"
    assert trim_continuation(text, 5, 8) == "One two three. Four five six seven!"
    # Closing quotes after the stop still end a sentence; inner newlines are kept.
    assert trim_continuation('  He said "go."\nThen she left', 1, 50) == 'He said "go."'
    assert trim_continuation("no stop here at all", 2, 3) == "no stop here"
    assert trim_continuation(" \n ", 1, 5) == ""


def test_generation_fills_every_line_within_limits(lm_dir, records, tmp_path, capsys):
    path, objs = records
    out = tmp_path / "out.jsonl"
    stats = generate_negatives(lm_dir, str(path), str(out), replace(FAST, seed=1), progress=False)
    rows = read_jsonl(out)
    assert [r["id"] for r in rows] == [o["id"] for o in objs]  # input order, each once
    for row, obj in zip(rows, objs):
        neg = row.pop("generative_negative")
        assert isinstance(neg, str) and neg.strip()
        assert row.pop("generative_negative_words") == len(neg.split())
        assert len(neg.split()) <= FAST.max_words
        assert row == obj  # every other field unchanged
    assert stats["done"] == 10 and stats["skipped_existing"] == 0 and stats["bad_lines"] == 0
    assert stats["tokens_per_second"] > 0 and stats["seconds"] > 0
    assert "10 generated" in capsys.readouterr().out


def test_same_seed_same_text_other_seed_differs(lm_dir, records, tmp_path):
    path, _ = records
    a, b, c = (tmp_path / f"{n}.jsonl" for n in "abc")
    generate_negatives(lm_dir, str(path), str(a), replace(FAST, seed=3), progress=False)
    generate_negatives(lm_dir, str(path), str(b), replace(FAST, seed=3), progress=False)
    generate_negatives(lm_dir, str(path), str(c), replace(FAST, seed=4), progress=False)
    assert a.read_bytes() == b.read_bytes()
    negs = lambda p: [r["generative_negative"] for r in read_jsonl(p)]  # noqa: E731
    assert negs(a) != negs(c)


def test_resume_after_whole_batches_matches_uninterrupted_run(lm_dir, records, tmp_path, capsys):
    path, _ = records
    full = tmp_path / "full.jsonl"
    generate_negatives(lm_dir, str(path), str(full), FAST, progress=False)
    lines = full.read_bytes().splitlines(keepends=True)
    # A run killed while writing batch 1: batch 0 (4 lines) complete, then half a line.
    part = tmp_path / "part.jsonl"
    part.write_bytes(b"".join(lines[:4]) + lines[4][: len(lines[4]) // 2])
    capsys.readouterr()
    stats = generate_negatives(lm_dir, str(path), str(part), FAST, progress=False)
    assert stats["skipped_existing"] == 4 and stats["done"] == 6
    assert "4 already done" in capsys.readouterr().out
    assert part.read_bytes() == full.read_bytes()
    # A second resume finds nothing left to do and leaves the file alone.
    again = generate_negatives(lm_dir, str(path), str(part), FAST, progress=False)
    assert again["done"] == 0 and again["skipped_existing"] == 10
    assert part.read_bytes() == full.read_bytes()


def test_resume_regenerates_a_last_line_cut_before_its_newline(lm_dir, records, tmp_path):
    path, _ = records
    full = tmp_path / "full.jsonl"
    generate_negatives(lm_dir, str(path), str(full), FAST, progress=False)
    lines = full.read_bytes().splitlines(keepends=True)
    # Line 5 is complete JSON, but without its newline it may be a cut-off prefix of a longer line.
    part = tmp_path / "part.jsonl"
    part.write_bytes(b"".join(lines[:4]) + lines[4].rstrip(b"\n"))
    stats = generate_negatives(lm_dir, str(path), str(part), FAST, progress=False)
    assert stats["skipped_existing"] == 4 and part.read_bytes() == full.read_bytes()


def test_each_batch_gets_its_own_seed(lm_dir, tmp_path):
    # Same prompt in every row: batches 0 and 1 differ only through their seeds (seed + batch index).
    path = write_jsonl(tmp_path / "in.jsonl", [{"id": i, "prefix": prefixes(1)[0]} for i in range(8)])
    out = tmp_path / "out.jsonl"
    generate_negatives(lm_dir, str(path), str(out), FAST, progress=False)
    negs = [r["generative_negative"] for r in read_jsonl(out)]
    assert negs[:4] != negs[4:]


def test_resume_mid_batch_matches_uninterrupted_run(lm_dir, records, tmp_path):
    path, objs = records
    full = tmp_path / "full.jsonl"
    generate_negatives(lm_dir, str(path), str(full), FAST, progress=False)
    # 6 lines done: batch 1 (records 4-7) is split. It is sampled again as the whole batch (records 4-5
    # included, not written again), so 6-7 get the text of the uninterrupted run.
    part = tmp_path / "part.jsonl"
    part.write_bytes(b"".join(full.read_bytes().splitlines(keepends=True)[:6]))
    stats = generate_negatives(lm_dir, str(path), str(part), FAST, progress=False)
    assert stats["skipped_existing"] == 6 and stats["done"] == 4
    assert part.read_bytes() == full.read_bytes()
    # Sampled as a batch of 2 (as a resume did before), records 6-7 get other text: the test can fail.
    alone = write_jsonl(tmp_path / "alone.jsonl", objs[6:8])
    generate_negatives(lm_dir, str(alone), str(tmp_path / "alone_out.jsonl"), replace(FAST, seed=1), progress=False)
    assert read_jsonl(tmp_path / "alone_out.jsonl") != read_jsonl(full)[6:8]


def test_resume_without_ids_matches_by_position(lm_dir, tmp_path):
    path = write_jsonl(tmp_path / "in.jsonl", [{"prefix": p} for p in prefixes(6)])
    full, part = tmp_path / "full.jsonl", tmp_path / "part.jsonl"
    generate_negatives(lm_dir, str(path), str(full), FAST, progress=False)
    part.write_bytes(b"".join(full.read_bytes().splitlines(keepends=True)[:4]) + b'{"prefix": "trunc')
    stats = generate_negatives(lm_dir, str(path), str(part), FAST, progress=False)
    assert stats["skipped_existing"] == 4 and stats["done"] == 2
    assert part.read_bytes() == full.read_bytes()


def test_resume_refuses_output_of_another_input(lm_dir, records, tmp_path):
    path, _ = records
    other = write_jsonl(tmp_path / "other.jsonl", [{"id": "doc0", "prefix": "something else entirely"}])
    out = tmp_path / "out.jsonl"
    generate_negatives(lm_dir, str(other), str(out), FAST, progress=False)
    with pytest.raises(RankgenError, match="different prefix"):
        generate_negatives(lm_dir, str(path), str(out), FAST, progress=False)


def test_bad_lines_are_counted_and_skipped(lm_dir, tmp_path):
    good = prefixes(3)
    path = tmp_path / "in.jsonl"
    path.write_text("\n".join([
        json.dumps({"id": 1, "prefix": good[0]}),
        '{"id": 2, "prefix": "unterminated',      # malformed JSON
        json.dumps({"id": 3, "text": "no prefix"}),  # missing prefix
        json.dumps({"id": 4, "prefix": "   "}),     # empty prefix
        json.dumps({"id": 5, "prefix": 7}),         # prefix not a string
        json.dumps(["not", "an", "object"]),
        json.dumps({"id": 1, "prefix": good[1]}),   # repeated id
        "",                                         # blank lines are not records
        json.dumps({"prefix": good[2]}),
    ]) + "\n", encoding="utf-8")
    out = tmp_path / "out.jsonl"
    stats = generate_negatives(lm_dir, str(path), str(out), FAST, progress=False)
    assert stats["bad_lines"] == 6 and stats["duplicate_ids"] == 1 and stats["done"] == 2
    rows = read_jsonl(out)
    assert [r["prefix"] for r in rows] == [good[0], good[2]]
    assert all(r["generative_negative"] for r in rows)


def test_short_samples_are_resampled_then_kept_and_counted(lm_dir, records, tmp_path):
    path, _ = records
    out = tmp_path / "out.jsonl"
    # 4 new tokens can never make 50 words: every record is retried, then kept as it is.
    stats = generate_negatives(
        lm_dir,
        str(path),
        str(out),
        NegativeSampling(batch_size=4, min_words=50, max_words=60, max_new_tokens=4),
        progress=False,
    )
    rows = read_jsonl(out)
    assert stats["short"] == len(rows) == 10
    assert all(0 < r["generative_negative_words"] < 50 for r in rows)
    # 3 tries x 4 tokens x 10 records (no eos is likely within 4 tokens of a 400-token vocab).
    assert stats["tokens_per_second"] * stats["seconds"] == pytest.approx(120, abs=12)


def test_prompt_is_truncated_from_the_left(lm_dir, tmp_path):
    # A prompt far longer than the 256-position context works only if it is cut to fit.
    long_prefix = " ".join(prefixes(40))
    path = write_jsonl(tmp_path / "in.jsonl", [{"id": 0, "prefix": long_prefix}])
    out = tmp_path / "out.jsonl"
    stats = generate_negatives(lm_dir, str(path), str(out), FAST, progress=False)
    assert stats["done"] == 1 and read_jsonl(out)[0]["generative_negative"]
    with pytest.raises(RankgenError, match="no room for a prompt"):
        generate_negatives(
            lm_dir, str(path), str(out), NegativeSampling(batch_size=1, max_new_tokens=256), progress=False
        )


def test_clear_errors(lm_dir, records, tmp_path):
    from transformers import T5Config, T5EncoderModel

    path, _ = records
    with pytest.raises(RankgenError, match="does not exist"):
        generate_negatives(lm_dir, str(tmp_path / "missing.jsonl"), str(tmp_path / "o.jsonl"), FAST, progress=False)
    with pytest.raises(RankgenError, match="output folder .* does not exist"):
        generate_negatives(lm_dir, str(path), str(tmp_path / "nope" / "o.jsonl"), FAST, progress=False)
    with pytest.raises(RankgenError, match="no config.json"):
        generate_negatives(str(tmp_path), str(path), str(tmp_path / "o.jsonl"), FAST, progress=False)
    with pytest.raises(RankgenError, match="is not a folder"):
        generate_negatives(str(tmp_path / "no_lm"), str(path), str(tmp_path / "o.jsonl"), FAST, progress=False)
    # An encoder-only model folder is a model, but not a causal LM.
    t5 = tmp_path / "t5"
    T5EncoderModel(T5Config(d_model=16, d_ff=32, d_kv=8, num_layers=1, num_heads=2, vocab_size=64)).save_pretrained(t5)
    with pytest.raises(RankgenError, match="not a causal LM transformers can load"):
        generate_negatives(str(t5), str(path), str(tmp_path / "o.jsonl"), FAST, progress=False)
    # A file that is not GGUF, named as one.
    fake = tmp_path / "fake.gguf"
    fake.write_bytes(b"not a gguf file")
    with pytest.raises(RankgenError, match="fake.gguf is not a causal LM transformers can load"):
        generate_negatives(str(fake), str(path), str(tmp_path / "o.jsonl"), FAST, progress=False)
    with pytest.raises(RankgenError, match="`length_match` must be one of"):
        generate_negatives(
            lm_dir, str(path), str(tmp_path / "o.jsonl"), replace(FAST, length_match="words"), progress=False
        )
    # A corrupt line before the end of an existing output is not a crash-truncated tail.
    bad_out = tmp_path / "bad_out.jsonl"
    bad_out.write_text("not json\n" + json.dumps({"prefix": "p", "generative_negative": "n"}) + "\n")
    with pytest.raises(RankgenError, match="line 1 is not a generated record"):
        generate_negatives(lm_dir, str(path), str(bad_out), FAST, progress=False)
    with pytest.raises(RankgenError, match="`min_words` <= `max_words`"):
        generate_negatives(lm_dir, str(path), str(tmp_path / "o.jsonl"), NegativeSampling(min_words=20, max_words=10))
    assert not (tmp_path / "o.jsonl").exists()  # no failed call left an output behind


def test_subparser_runs_and_reports_errors(lm_dir, records, tmp_path, capsys):
    path, _ = records
    parser = build_parser()
    out = tmp_path / "cli.jsonl"
    args = parser.parse_args(["generate-negatives", "--lm", lm_dir, "--input", str(path), "--out", str(out),
                              "--batch_size", "5", "--max_new_tokens", "16", "--min_words", "2",
                              "--max_words", "8", "--seed", "2", "--no_progress"])
    assert (args.batch_size, args.top_p, args.device, args.max_prompt_tokens) == (5, 0.9, "cpu", None)
    args.run(args)
    assert len(read_jsonl(out)) == 10 and "10 generated" in capsys.readouterr().out
    args = parser.parse_args(["generate-negatives", "--lm", lm_dir, "--input", str(tmp_path / "x.jsonl"),
                              "--out", str(out)])
    with pytest.raises(RankgenError, match="x.jsonl does not exist"):
        args.run(args)


# ------------------------------------------------------------------------------------------
# Sharded runs and merge-negatives
# ------------------------------------------------------------------------------------------


@pytest.fixture
def mixed_input(tmp_path):
    """11 good records (ids on some, none on others), a bad line and a repeated id: 3 batches of 4."""
    texts = prefixes(11)
    objs = [{"id": f"doc{i}", "doc_id": i // 3, "prefix": p} if i % 3 else {"doc_id": i // 3, "prefix": p}
            for i, p in enumerate(texts)]
    lines = [json.dumps(o) for o in objs]
    lines.insert(5, '{"prefix": "unterminated')
    lines.insert(7, json.dumps({"id": "doc1", "prefix": "a repeated id is left out"}))
    path = tmp_path / "mixed.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path, objs


def shard_run(lm_dir, path, out, index, num_shards=2, **overrides):
    return generate_negatives(lm_dir, str(path), str(out), replace(FAST, **overrides), num_shards=num_shards,
                              shard_index=index, progress=False)


def test_two_shards_merge_to_one_unsharded_run(lm_dir, mixed_input, tmp_path, capsys):
    path, objs = mixed_input
    full = tmp_path / "full.jsonl"
    generate_negatives(lm_dir, str(path), str(full), replace(FAST, seed=5), progress=False)
    shards = [tmp_path / f"neg-{i:05d}-of-00002.jsonl" for i in range(2)]
    # Shard 1 runs first, in a process whose torch RNG has moved: a batch's text must not depend on either.
    import torch
    torch.rand(100)
    stats = [shard_run(lm_dir, path, shards[1], 1, seed=5), shard_run(lm_dir, path, shards[0], 0, seed=5)]
    # Shard 0 samples batches 0 and 2 (records 0-3, 8-10), shard 1 batch 1 (records 4-7).
    assert [s["done"] for s in stats] == [4, 7] and all(s["bad_lines"] == 2 for s in stats)
    header, *rows = read_jsonl(shards[0])
    assert header["generate_negatives_shard"]["shard_index"] == 0
    assert header["generate_negatives_shard"]["settings"]["seed"] == 5
    assert [r["prefix"] for r in rows] == [o["prefix"] for o in objs[:4] + objs[8:]]
    merged = tmp_path / "merged.jsonl"
    capsys.readouterr()
    result = merge_negatives(str(path), [str(s) for s in reversed(shards)], str(merged))
    assert result == {"records": 11, "shards": 2, "bad_lines": 2}
    assert "11 records from 2 shards" in capsys.readouterr().out
    assert merged.read_bytes() == full.read_bytes()
    # Three shards (batch 2 alone in shard 2) give the same file too.
    three = [tmp_path / f"three-{i}.jsonl" for i in range(3)]
    for i, out in enumerate(three):
        shard_run(lm_dir, path, out, i, num_shards=3, seed=5)
    merge_negatives(str(path), [str(s) for s in three], str(merged))
    assert merged.read_bytes() == full.read_bytes()


def test_merged_shards_read_as_a_generative_task_source(lm_dir, tmp_path):
    """What the generative seqio tasks read (prefix, continuation, generative_negative, doc_id) survives a merge."""
    objs = [{"id": i, "doc_id": f"d{i // 4}", "prefix": p, "continuation": "gold text here"}
            for i, p in enumerate(prefixes(8))]
    path = write_jsonl(tmp_path / "in.jsonl", objs)
    shards = [tmp_path / f"s{i}.jsonl" for i in range(2)]
    for i, out in enumerate(shards):
        shard_run(lm_dir, path, out, i)
    merged = tmp_path / "merged.jsonl"
    merge_negatives(str(path), [str(s) for s in shards], str(merged))
    pytest.importorskip("seqio")
    from rankgen_jax.data.seqio import tasks  # imports seqio and tensorflow

    stats = tasks.ReadStats()
    examples = list(tasks._generative_records(str(merged), stats))
    assert [(e.doc_id, e.prefix) for e in examples] == [(o["doc_id"], o["prefix"]) for o in objs]
    assert [e.negatives[0] for e in examples] == [r["generative_negative"] for r in read_jsonl(merged)]
    assert stats.skipped == {}


def test_resumed_interrupted_shard_equals_uninterrupted_one(lm_dir, mixed_input, tmp_path):
    path, _ = mixed_input
    whole = tmp_path / "whole.jsonl"
    shard_run(lm_dir, path, whole, 0)
    lines = whole.read_bytes().splitlines(keepends=True)
    # Killed while writing batch 0: the header, two records and half of the third.
    part = tmp_path / "part.jsonl"
    part.write_bytes(b"".join(lines[:3]) + lines[3][:20])
    stats = shard_run(lm_dir, path, part, 0)
    assert stats["skipped_existing"] == 2 and stats["done"] == 5
    assert part.read_bytes() == whole.read_bytes()
    # Killed while writing the header: the file starts again.
    part.write_bytes(lines[0][:30])
    shard_run(lm_dir, path, part, 0)
    assert part.read_bytes() == whole.read_bytes()
    assert shard_run(lm_dir, path, part, 0)["done"] == 0


def test_shard_resume_refuses_other_settings_or_shard(lm_dir, mixed_input, tmp_path):
    path, _ = mixed_input
    out = tmp_path / "s0.jsonl"
    shard_run(lm_dir, path, out, 0)
    before = out.read_bytes()
    with pytest.raises(RankgenError, match=r"other settings \(seed 0 vs 1"):
        shard_run(lm_dir, path, out, 0, seed=1)
    with pytest.raises(RankgenError, match="is shard 0 of 2, not shard 1 of 2"):
        shard_run(lm_dir, path, out, 1)
    with pytest.raises(RankgenError, match="is shard 0 of 2 .* merge-negatives"):
        generate_negatives(lm_dir, str(path), str(out), FAST, progress=False)
    other = write_jsonl(tmp_path / "other.jsonl", [{"prefix": p} for p in prefixes(3)])
    with pytest.raises(RankgenError, match="input_sha256"):
        shard_run(lm_dir, other, out, 0)
    assert out.read_bytes() == before
    plain = tmp_path / "plain.jsonl"
    generate_negatives(lm_dir, str(path), str(plain), FAST, progress=False)
    with pytest.raises(RankgenError, match="no shard header"):
        shard_run(lm_dir, path, plain, 0)
    with pytest.raises(RankgenError, match=r"`shard_index` must be in \[0, 2\)"):
        shard_run(lm_dir, path, tmp_path / "x.jsonl", 2)
    with pytest.raises(RankgenError, match="`num_shards` must be at least 1"):
        shard_run(lm_dir, path, tmp_path / "x.jsonl", 0, num_shards=0)


@pytest.fixture
def two_shards(lm_dir, mixed_input, tmp_path):
    path, _ = mixed_input
    shards = [tmp_path / f"s{i}.jsonl" for i in range(2)]
    for i, out in enumerate(shards):
        shard_run(lm_dir, path, out, i)
    return path, shards


def test_merge_refuses_missing_or_duplicated_records(two_shards, tmp_path):
    path, shards = two_shards
    merged = tmp_path / "merged.jsonl"
    good = [s.read_bytes() for s in shards]
    s1 = good[1].splitlines(keepends=True)  # header, then records 4-7 (ids doc4, doc5, none, doc7)
    # A record left out of the middle.
    shards[1].write_bytes(b"".join(s1[:2] + s1[3:]))
    with pytest.raises(RankgenError, match=r"shard 1 \(.*s1.jsonl\) line 3: the record of input line 7 "
                                           r"\(id \"doc5\"\) is missing; found prefix"):
        merge_negatives(str(path), [str(s) for s in shards], str(merged))
    # An unfinished shard: its last batch not written, the last line cut.
    shards[1].write_bytes(b"".join(s1[:3]) + s1[3][:10])
    with pytest.raises(RankgenError, match=r"shard 1 .* ends after 2 records: the record of input line 9 .* and 1 "
                                           "more of its records are missing"):
        merge_negatives(str(path), [str(s) for s in shards], str(merged))
    # A record written twice, in its place and at the end.
    shards[1].write_bytes(b"".join(s1[:3] + s1[2:]))
    with pytest.raises(RankgenError, match=r"shard 1 .* line 4: duplicated record: id \"doc5\" was merged already"):
        merge_negatives(str(path), [str(s) for s in shards], str(merged))
    shards[1].write_bytes(good[1] + s1[1])
    with pytest.raises(RankgenError, match=r"shard 1 .* line 6: duplicated record: id \"doc4\" comes after"):
        merge_negatives(str(path), [str(s) for s in shards], str(merged))
    # Another shard's record in this one (shard 0's record 8 before shard 1's record 5).
    s0 = good[0].splitlines(keepends=True)
    shards[1].write_bytes(b"".join(s1[:2]) + s0[5] + b"".join(s1[2:]))
    with pytest.raises(RankgenError, match=r"shard 1 .* line 3: the record of input line 7 .* is missing; "
                                           r"found id \"doc8\""):
        merge_negatives(str(path), [str(s) for s in shards], str(merged))
    assert not merged.exists() and not list(tmp_path.glob("merged.jsonl*"))  # a refused merge writes nothing


def test_merge_refuses_missing_shards_or_other_settings(lm_dir, two_shards, tmp_path):
    path, shards = two_shards
    merged = tmp_path / "merged.jsonl"
    with pytest.raises(RankgenError, match="missing shard 1 of 2"):
        merge_negatives(str(path), [str(shards[0])], str(merged))
    with pytest.raises(RankgenError, match="shard 0 is given twice"):
        merge_negatives(str(path), [str(shards[0]), str(shards[0])], str(merged))
    other_seed = tmp_path / "seed1.jsonl"
    shard_run(lm_dir, path, other_seed, 1, seed=1)
    with pytest.raises(RankgenError, match=r"seed1.jsonl was made with other settings than .*s0.jsonl \(seed 1 vs 0\)"):
        merge_negatives(str(path), [str(shards[0]), str(other_seed)], str(merged))
    other_words = tmp_path / "words.jsonl"
    shard_run(lm_dir, path, other_words, 1, max_words=14)
    with pytest.raises(RankgenError, match=r"other settings .*max_words 14 vs 12"):
        merge_negatives(str(path), [str(shards[0]), str(other_words)], str(merged))
    three = tmp_path / "three.jsonl"
    shard_run(lm_dir, path, three, 1, num_shards=3)
    with pytest.raises(RankgenError, match="one of 3 shards, .* one of 2: not the same run"):
        merge_negatives(str(path), [str(shards[0]), str(three)], str(merged))
    other = write_jsonl(tmp_path / "other.jsonl", [{"prefix": p} for p in prefixes(3)])
    with pytest.raises(RankgenError, match="not the file the shards were made from"):
        merge_negatives(str(other), [str(s) for s in shards], str(merged))
    plain = tmp_path / "plain.jsonl"
    generate_negatives(lm_dir, str(path), str(plain), FAST, progress=False)
    with pytest.raises(RankgenError, match="plain.jsonl has no shard header"):
        merge_negatives(str(path), [str(shards[0]), str(plain)], str(merged))
    with pytest.raises(RankgenError, match="is the input or a shard file"):
        merge_negatives(str(path), [str(s) for s in shards], str(shards[0]))
    header, rest = shards[1].read_bytes().split(b"\n", 1)
    shards[1].write_bytes(header.replace(b'"shard_index": 1', b'"shard_index": 7') + b"\n" + rest)
    with pytest.raises(RankgenError, match="s1.jsonl: its header lacks a valid shard_index"):
        merge_negatives(str(path), [str(s) for s in shards], str(merged))
    assert not merged.exists()


def test_sharded_cli_path(lm_dir, mixed_input, tmp_path, capsys):
    path, _ = mixed_input
    parser = build_parser()
    full = tmp_path / "full.jsonl"
    common = [
        "--lm",
        lm_dir,
        "--input",
        str(path),
        "--batch_size",
        "3",
        "--max_new_tokens",
        "16",
        "--length_match",
        "range",
        "--min_words",
        "2",
        "--max_words",
        "8",
        "--no_progress",
    ]
    args = parser.parse_args(["generate-negatives", *common, "--out", str(full)])
    assert (args.num_shards, args.shard_index) == (1, 0)
    args.run(args)
    shards = []
    for i in range(2):
        shards.append(tmp_path / f"neg-{i:05d}-of-00002.jsonl")
        args = parser.parse_args(["generate-negatives", *common, "--out", str(shards[-1]), "--num_shards", "2",
                                  "--shard_index", str(i)])
        args.run(args)
    assert "(shard 1 of 2): 5 generated" in capsys.readouterr().out  # batches 1 and 3: records 3-5, 9-10
    merged = tmp_path / "merged.jsonl"
    args = parser.parse_args(["merge-negatives", "--input", str(path), "--shards", *map(str, shards),
                              "--out", str(merged)])
    args.run(args)
    assert merged.read_bytes() == full.read_bytes()
    args = parser.parse_args(["merge-negatives", "--input", str(path), "--shards", str(shards[1]),
                              "--out", str(merged)])
    with pytest.raises(RankgenError, match="missing shard 0 of 2"):
        args.run(args)


def test_cut_to_length_takes_the_sentence_end_nearest_the_gold():
    text = "a b c. d e f g h. i j k l m n o p. q r"
    assert cut_to_length(text, 3) == "a b c."
    assert cut_to_length(text, 7) == "a b c. d e f g h."  # ends at 3 and 8 words: 8 is nearer
    assert cut_to_length(text, 12) == "a b c. d e f g h."  # 8 and 16 are as near: the shorter
    assert cut_to_length(text, 14) == "a b c. d e f g h. i j k l m n o p."
    assert cut_to_length("one two three four five six", 4) == "one two three four"  # no sentence end: cut at 4
    assert cut_to_length("one two three. four five six seven eight nine ten", 10) == (
        "one two three. four five six seven eight nine ten")  # shorter than or as long as the gold: whole
    # The nearest end lies further than the tolerance (half the gold): cut at the gold's length.
    assert (
        cut_to_length("x. " + " ".join("w" * 30), 20, tolerance=0.5).split()
        == ("x. " + " ".join("w" * 30)).split()[:20]
    )


def test_a_sentence_end_is_told_from_a_mid_sentence_cut():
    assert ends_sentence("He left.") and ends_sentence('She said "go!"') and ends_sentence("Why? (Nobody knew.)")
    assert not ends_sentence("He left and") and not ends_sentence("") and not ends_sentence("a. b")


def length_only_accuracy(gold_words, negative_words):
    """How often "the longer one is the gold" picks the gold (ties count half): chance is 0.5."""
    gold, negative = np.asarray(gold_words), np.asarray(negative_words)
    return float(np.mean((gold > negative) + 0.5 * (gold == negative)))


def test_gold_length_cut_leaves_a_length_only_scorer_at_chance():
    """Samples with sentence ends every 5-30 words: cut to the gold's length, length tells nothing; trimmed to
    the last sentence end within 128 words (the old rule), "the shorter one is human" is right most of the time."""
    rng = np.random.default_rng(0)
    golds, matched, trimmed = [], [], []
    for _ in range(2000):
        sentences = [" ".join(["w"] * (int(rng.integers(5, 31)) - 1) + ["end."]) for _ in range(12)]
        sample = " ".join(sentences)
        gold = int(rng.integers(10, 129))  # RankGen's gold lengths, drawn from 10-128 words
        golds.append(gold)
        matched.append(len(cut_to_length(sample, gold).split()))
        trimmed.append(len(trim_continuation(sample, 10, 128).split()))
    # 2000 pairs: the accuracy's standard error is about 0.011.
    assert abs(length_only_accuracy(golds, matched) - 0.5) < 0.04
    assert abs(np.mean(matched) - np.mean(golds)) < 2.0
    assert length_only_accuracy(golds, trimmed) < 0.2  # the cue the gold cut removes


def test_generated_negatives_take_their_gold_lengths(lm_dir, tmp_path):
    words = BOTCHAN.read_text(encoding="utf-8").split()
    rng = np.random.default_rng(1)
    objs = []
    for i in range(12):
        gold = int(rng.integers(3, 13))
        objs.append({"id": i, "prefix": " ".join(words[2000 + 40 * i: 2020 + 40 * i]),
                     "continuation": " ".join(words[2020 + 40 * i: 2020 + 40 * i + gold])})
    objs.append({"id": "no gold", "prefix": "a prefix without its continuation"})
    path = write_jsonl(tmp_path / "in.jsonl", objs)
    out = tmp_path / "out.jsonl"
    settings = replace(FAST, length_match="gold", min_words=1, max_new_tokens=40)
    stats = generate_negatives(lm_dir, str(path), str(out), settings, progress=False)
    assert stats["done"] == 12 and stats["no_gold"] == 1 and stats["bad_lines"] == 1
    written = read_jsonl(out)
    gold = [len(o["continuation"].split()) for o in written]
    negative = [o["generative_negative_words"] for o in written]
    assert all(n == len(o["generative_negative"].split()) for n, o in zip(negative, written))
    # Cuts without a sentence end were resampled; those left are counted.
    assert stats["mid_sentence"] == sum(not ends_sentence(o["generative_negative"]) for o in written)
    # Each within the tolerance of its gold (a random LM rarely ends a sentence: mostly exactly the gold's length).
    assert all(abs(n - g) <= 0.5 * g for n, g in zip(negative, gold)), list(zip(negative, gold))
    assert abs(length_only_accuracy(gold, negative) - 0.5) <= 0.25
