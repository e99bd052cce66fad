"""Sentence splitting on real book excerpts (the bundled corpora) and tricky constructed cases."""

from pathlib import Path

import pytest

from rankgen_jax.data.sentences import split_sentences, word_count

REPO = Path(__file__).resolve().parents[1]
CORPUS = REPO / "data" / "corpus"
# The perspectives corpus: Project Gutenberg editions of Shakespeare and Milton, unchanged (data/perspectives/README.md).
PERSPECTIVES = REPO / "data" / "perspectives"
BOOKS = sorted(CORPUS.rglob("*.txt"))


def read_book(path: Path) -> str:
    return path.read_text(encoding="utf-8-sig")


def sentences_of(path: Path) -> list[str]:
    return split_sentences(read_book(path))


def test_bundled_books_found():
    # data/corpus/README.md: 6 Austen novels, Botchan, Moby-Dick, 121 addresses, 18 plays, 21 books of the Bible.
    assert len(BOOKS) == 168


# --- real excerpts ---------------------------------------------------------


def test_emma_opening_headings_and_wrapped_paragraphs():
    sentences = sentences_of(CORPUS / "austen" / "emma.txt")
    assert sentences[:4] == ["EMMA", "By Jane Austen", "VOLUME I", "CHAPTER I"]
    # A hard-wrapped four-line paragraph is one sentence with single spaces.
    assert sentences[4] == (
        "Emma Woodhouse, handsome, clever, and rich, with a comfortable home and happy "
        "disposition, seemed to unite some of the best blessings of existence; and had "
        "lived nearly twenty-one years in the world with very little to distress or vex her."
    )
    assert sentences[5].startswith("She was the youngest of the two daughters")
    assert sentences[6].startswith("Her mother had died too long ago")
    # "Mr." before a name does not end the sentence.
    assert sentences[7].startswith("Sixteen years had Miss Taylor been in Mr. Woodhouse's family,")
    assert sentences[7].endswith("but particularly of Emma.")
    assert sentences[8] == "Between _them_ it was more the intimacy of sisters."


def test_pride_and_prejudice_dialogue():
    sentences = sentences_of(CORPUS / "austen" / "prideprejudice.txt")
    assert sentences[:3] == ["PRIDE AND PREJUDICE", "By Jane Austen", "Chapter 1"]
    assert sentences[3] == (
        "It is a truth universally acknowledged, that a single man in possession of a good "
        "fortune, must be in want of a wife."
    )
    # A quote interrupted by a lowercase speech tag stays one sentence, across the line wrap.
    assert (
        '"My dear Mr. Bennet," said his lady to him one day, "have you heard that Netherfield Park is let at last?"'
    ) in sentences
    assert "Mr. Bennet replied that he had not." in sentences
    assert '"Do you not want to know who has taken it?" cried his wife impatiently.' in sentences
    assert '"What think you of books?" said he, smiling.' in sentences


def test_emma_ellipses_and_doctor():
    sentences = sentences_of(CORPUS / "austen" / "emma.txt")
    # "Dr. and Mrs. Hughes": titles never end a sentence.
    assert "Must go and speak to Dr. and Mrs. Hughes for a moment.--How do you do?" in sentences
    # Miss Bates's trailing "...." before a capital ends her sentence.
    assert "He seems every thing the fondest parent could...." in sentences
    assert "That, you know, was so very...." in sentences
    assert "And I am sure, by his manner, it was no compliment." in sentences


def test_botchan_without_blank_lines():
    """Botchan has no blank lines at all: all-caps heading lines still stand alone."""
    sentences = sentences_of(CORPUS / "botchan" / "botchan.txt")
    i = sentences.index("CHAPTER I")
    assert sentences[i - 1] == "BOTCHAN (MASTER DARLING)"
    assert sentences[i - 2] == "Tokyo, September, 1918."
    assert sentences[i + 1] == (
        "Because of an hereditary recklessness, I have been playing always a losing game since my childhood."
    )
    assert "A NOTE BY THE TRANSLATOR" in sentences
    assert '"I\'ll see I don\'t get dislocated next time," I answered.' in sentences
    # A decimal time stays inside its sentence.
    assert any("at 4.30 in the" in s for s in sentences)
    # "Mr. K. Natsume": a title and an initial in a row.
    assert any("the late Mr. K. Natsume was an epoch-making piece of work." in s for s in sentences)


def test_macbeth_cast_list_speakers_and_verse():
    sentences = sentences_of(PERSPECTIVES / "shakespeare" / "macbeth.txt")
    assert sentences[:4] == ["MACBETH", "by William Shakespeare", "Persons Represented", "DUNCAN, King of Scotland."]
    i = sentences.index("ACT I.")
    assert sentences[i + 1 : i + 8] == [
        "SCENE I.",
        "An open Place.",
        "Thunder and Lightning.",
        "[Enter three Witches.]",
        "FIRST WITCH.",
        "When shall we three meet again?",
        "In thunder, lightning, or in rain?",
    ]
    # Verse lines ending without a full stop are joined into one sentence.
    assert (
        "That now Sweno, the Norways' king, craves composition; Nor would we deign him burial of his men "
        "Till he disbursed, at Saint Colme's-inch, Ten thousand dollars to our general use."
    ) in sentences
    # "!" before a lowercase word does not end the sentence.
    assert "O valiant cousin! worthy gentleman!" in sentences


def test_sonnet_numerals_are_their_own_sentences():
    sentences = sentences_of(PERSPECTIVES / "shakespeare" / "sonnets.txt")
    assert sentences[:3] == ["THE SONNETS", "by William Shakespeare", "I"]
    assert sentences[3].startswith("From fairest creatures we desire increase,")
    assert sentences[3].endswith("To eat the world's due, by the grave and thee.")
    assert sentences[4] == "II"


# --- constructed cases -----------------------------------------------------


@pytest.mark.parametrize(
    "text, expected",
    [
        ('"Is it?" she asked. Then she left.', ['"Is it?" she asked.', "Then she left."]),
        ('"Go!" He left.', ['"Go!"', "He left."]),
        ("He said (quietly.) Then left.", ["He said (quietly.)", "Then left."]),
        ("'Stop.' She did.", ["'Stop.'", "She did."]),
        ("\u201cReally?\u201d \u201cYes.\u201d", ["\u201cReally?\u201d", "\u201cYes.\u201d"]),
        ("Mr. and Mrs. Smith met Dr. Jones at St. Paul's. Capt. Gen. Col. Rev. Mt. Hood.",
         ["Mr. and Mrs. Smith met Dr. Jones at St. Paul's.", "Capt. Gen. Col. Rev. Mt. Hood."]),
        ("J. R. R. Tolkien and Wm. Blake met. J.R.R. Tolkien wrote.", ["J. R. R. Tolkien and Wm. Blake met.", "J.R.R. Tolkien wrote."]),
        ("Pi is 3.14 or so. It is 2.5 now.", ["Pi is 3.14 or so.", "It is 2.5 now."]),
        ("Red vs. Blue, e.g. Tom, i.e. Ann, etc. and so on.", ["Red vs. Blue, e.g. Tom, i.e. Ann, etc. and so on."]),
        ("We met at 9 a.m. on Monday and left at 5 p.m. The end.", ["We met at 9 a.m. on Monday and left at 5 p.m.", "The end."]),
        ("It was No. 5 on the list. No. That was all.", ["It was No. 5 on the list.", "No.", "That was all."]),
        ("Well... I think so. Wait... what?", ["Well...", "I think so.", "Wait... what?"]),
        ("It was me, said I. Then I left.", ["It was me, said I.", "Then I left."]),
        ("What? Who? Why! Fine.", ["What?", "Who?", "Why!", "Fine."]),
        ("_He_ said _no._ She agreed.", ["_He_ said _no._", "She agreed."]),
    ],
)
def test_tricky_cases(text, expected):
    assert split_sentences(text) == expected


def test_wrapped_lines_join_and_blank_lines_separate():
    text = "The first sentence is wrapped\nacross two lines. And a second\nstarts here\n\nwithout an end\n\n\nNew paragraph."
    assert split_sentences(text) == [
        "The first sentence is wrapped across two lines.",
        "And a second starts here",  # never continued across the blank line
        "without an end",
        "New paragraph.",
    ]


def test_headings_are_never_glued():
    text = "CHAPTER I\nIt began.\n\nACT II. SCENE 1.\n\nA Title Without Stop\n\nChapter 12\nThe end came."
    assert split_sentences(text) == [
        "CHAPTER I",
        "It began.",
        "ACT II. SCENE 1.",
        "A Title Without Stop",
        "Chapter 12",
        "The end came.",
    ]


def test_all_caps_boilerplate_is_not_cut_at_its_short_last_line():
    long_line = "THE FOUNDATION AND ANY DISTRIBUTOR UNDER THIS AGREEMENT WILL NOT BE LIABLE"
    text = f"{long_line}\nTO YOU FOR DAMAGES. NEXT CLAUSE"
    assert split_sentences(text) == [f"{long_line} TO YOU FOR DAMAGES.", "NEXT CLAUSE"]


def test_whitespace_collapsed_and_edge_inputs():
    assert split_sentences("  Tabs\tand   spaces\u00a0here.\r\n  Next  one. ") == ["Tabs and spaces here.", "Next one."]
    assert split_sentences("") == []
    assert split_sentences(" \n\n \t\n") == []
    assert split_sentences("no punctuation at all") == ["no punctuation at all"]
    assert word_count("  a b\n\nc\td  ") == 4
    assert word_count("") == 0


# --- invariants on whole books ---------------------------------------------


@pytest.mark.parametrize("path", BOOKS, ids=lambda p: p.name)
def test_whole_book_words_preserved(path):
    text = read_book(path)
    sentences = split_sentences(text)
    assert " ".join(sentences).split() == text.split()  # nothing lost, duplicated or reordered
    assert all(s and s == s.strip() and "  " not in s for s in sentences)
    assert sum(word_count(s) for s in sentences) == word_count(text)
    # Splitting really happens: sentences of sane length. Early State of the Union addresses run
    # long (Madison's 1815 address: a median of 51 words, its longest sentence 165), hence 60.
    assert len(sentences) >= word_count(text) / 60
    assert sorted(word_count(s) for s in sentences)[len(sentences) // 2] < 60


@pytest.mark.parametrize("name", ["shakespeare/hamlet.txt", "milton/paradise_lost.txt", "shakespeare/sonnets.txt"])
def test_whole_play_and_poem_words_preserved(name):
    text = read_book(PERSPECTIVES / name)
    sentences = split_sentences(text)
    assert " ".join(sentences).split() == text.split()
    assert all(sentences)
