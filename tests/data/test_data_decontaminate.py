"""Decontamination: planted test items are caught under case, whitespace and punctuation
changes (exact), with a few words changed (8-gram Jaccard) and as reformatted, commented code
(AST); unrelated rows are kept; groups go whole; the command on the GSM8K test slice of
tests/fixtures; and, where the whole GSM8K is at hand, its train split measured against its test
split (docs/data.md)."""

from __future__ import annotations

import json

import pytest
from data_helpers import FIXTURES

from elfreg.cli import main
from elfreg.data.decontaminate import Decontaminator, ReferenceIndex, decontaminate_file
from elfreg.data.normalize import function_fingerprints, jaccard, normalize_text, word_ngrams, words
from elfreg.data.references import BenchmarkItem, load_references
from elfreg.jsonl import read_jsonl
from elfreg.paths import data_dir

QUESTION = ("Janet's ducks lay 16 eggs per day. She eats three for breakfast every morning and bakes muffins for "
            "her friends every day with four. She sells the remainder at the farmers' market daily for $2 per fresh "
            "duck egg. How much in dollars does she make every day at the farmers' market?")
PROGRAM = '''def below_zero(operations: list) -> bool:
    """Detect a negative balance."""
    balance = 0
    for op in operations:
        balance += op
        if balance < 0:
            return True
    return False
'''
ITEMS = [BenchmarkItem("gsm8k", "gsm8k/0", QUESTION),
         BenchmarkItem("humaneval", "HumanEval/3", "Detect if the balance falls below zero.", (PROGRAM,))]


def test_normalisation_ignores_case_whitespace_and_punctuation_and_keeps_numbers():
    assert normalize_text("  JANET’S ducks,\tlay 1,600 eggs... at $2.50!") == "janets ducks lay 1600 eggs at 2.50"
    assert words("x^2+3x = 12") == ["x", "2", "3", "x", "12"]
    assert normalize_text("lay 16 eggs") != normalize_text("lay 61 eggs")
    grams = word_ngrams(words("a b c d e f g h i"))
    assert grams == {tuple("abcdefgh"), tuple("bcdefghi")} and word_ngrams(["a", "b"]) == {("a", "b")}
    assert jaccard(frozenset({1, 2, 3}), frozenset({2, 3, 4})) == 0.5


@pytest.mark.parametrize(("question", "rule"), [
    (QUESTION.upper().replace(".", " !").replace("  ", "\n   "), "exact"),
    (QUESTION.replace("'", "").replace("$", "").replace("?", "").lower(), "exact"),
    (QUESTION.replace("breakfast", "lunch").replace("remainder", "rest"), "8gram"),
    (QUESTION.replace("muffins", "cakes").replace("fresh", "large").replace("Janet's", "Mary's"), "8gram"),
])
def test_planted_questions_are_caught(question, rule):
    found = ReferenceIndex(ITEMS, threshold=0.2).match(question)
    assert found is not None and found.rule == rule and found.item.id == "gsm8k/0"
    assert found.similarity > 0.2


def test_reformatted_and_commented_code_is_caught_by_its_syntax_tree():
    reformatted = ('Here is the solution:\n```python\n# keep a running total\ndef below_zero(operations: list)->bool:\n'
                   '    balance=0  # start empty\n    for op in operations:\n        balance += op\n'
                   '        if (balance < 0):\n            return True\n    return False\n\n'
                   'print(below_zero([1, -2]))\n```')
    index = ReferenceIndex(ITEMS)
    found = index.match("Write a function over a list of deposits and withdrawals.", reformatted)
    assert found is not None and found.rule == "ast" and found.item.id == "HumanEval/3"
    assert function_fingerprints(reformatted) & function_fingerprints(PROGRAM)
    changed = reformatted.replace("balance < 0", "balance <= 0")
    assert index.match("Write a function over a list of deposits and withdrawals.", changed) is None
    assert function_fingerprints("def broken(:\n") == frozenset()


@pytest.mark.parametrize("question", [
    "Tom has 3 boxes with 12 pencils each. He gives away 10 pencils. How many pencils does he have left?",
    "Janet's cat sleeps 16 hours per day. How many hours does it sleep in a week?",
    "", "duck",
])
def test_unrelated_rows_are_kept(question):
    assert ReferenceIndex(ITEMS).match(question, "def f(x):\n    return x\n") is None


def test_a_matching_row_takes_its_whole_group_along():
    rows = [("a rewrite that shares nothing", None, "group-1"), (QUESTION.lower(), None, "group-1"),
            ("another question entirely", None, "group-2"), ("rewritten words only", None, QUESTION)]
    decon = Decontaminator(ReferenceIndex(ITEMS))
    verdicts = [(row, why) for row, why in decon.filter(lambda: iter(rows), lambda r: r)]
    rules = [None if why is None else why.rule for _, why in verdicts]
    assert rules == ["group", "exact", None, "group"]
    assert decon.counts.as_dict() == {"rows_in": 4, "rows_kept": 1, "rows_dropped": 3, "groups_dropped": 2,
                                      "by_rule": {"exact": 1, "8gram": 0, "ast": 0, "group": 2},
                                      "by_benchmark": {"gsm8k": 3}}


def test_the_command_writes_kept_dropped_and_counts(tmp_path, capsys):
    test = read_jsonl(data_dir() / "gsm8k" / "test.jsonl")
    rows = [{"question": test[5]["question"].upper(), "answer": "1", "tag": "planted"},
            {"question": "How many legs do 3 spiders have?", "answer": "24", "tag": "clean"},
            {"question": test[7]["question"].replace(".", " ;"), "answer": "2", "tag": "planted"}]
    src = tmp_path / "train.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out"
    assert main(["data", "decontaminate", "--input", str(src), "--prompt-field", "question", "--answer-field",
                 "answer", "--against", "gsm8k", "--out", str(out)]) == 0
    assert "3 rows: kept 1, dropped 2 (exact 2, 8gram 0, ast 0, group 0) in 2 groups" in capsys.readouterr().out
    assert read_jsonl(out / "kept.jsonl") == [rows[1]]
    dropped = read_jsonl(out / "dropped.jsonl")
    assert [d["decontamination"]["test_id"] for d in dropped] == ["gsm8k/5", "gsm8k/7"]
    assert dropped[0]["decontamination"]["rule"] == "exact" and dropped[0]["decontamination"]["row"].endswith(":1")
    assert {k: v for k, v in dropped[0].items() if k != "decontamination"} == rows[0]
    counts = json.loads((out / "counts.json").read_text())
    assert (counts["rows_in"], counts["rows_kept"], counts["test_items"]) == (3, 1, len(test))
    src.write_text(src.read_text() + '{"question": 7}\n')
    assert main(["data", "decontaminate", "--input", str(src), "--prompt-field", "question", "--against", "gsm8k",
                 "--out", str(out)]) == 2
    assert capsys.readouterr().err.strip() == (f"elfreg data: error: {src}:4: field 'question' must be a string, "
                                               "got int 7")
    assert main(["data", "decontaminate", "--input", str(src), "--prompt-field", "q", "--against", "gsm9k",
                 "--out", str(out)]) == 2
    assert "unknown benchmark(s) gsm9k" in capsys.readouterr().err


def test_code_rows_are_caught_against_humaneval_and_mbpp(tmp_path):
    counts = decontaminate_file(str(FIXTURES / "opencodeinstruct.jsonl"), "input", ["humaneval", "mbpp"],
                                str(tmp_path), answer_field="output")
    dropped = {d["id"][-1]: d["decontamination"] for d in read_jsonl(tmp_path / "dropped.jsonl")}
    assert dropped["2"]["rule"] == "ast" and dropped["2"]["test_id"] == "HumanEval/2"
    assert dropped["4"]["rule"] == "exact" and dropped["4"]["test_id"] == "Mbpp/17"
    assert counts.rows_kept == 3 and counts.by_benchmark == {"humaneval": 1, "mbpp": 1}


@pytest.mark.full_data("gsm8k/train.jsonl", "gsm8k/test.jsonl", "math500/test.jsonl")
def test_gsm8k_train_against_the_gsm8k_test_split(tmp_path):
    """The measurement of docs/data.md: the real GSM8K train split against its test split."""
    train = data_dir() / "gsm8k" / "train.jsonl"
    counts = decontaminate_file(str(train), "question", ["gsm8k"], str(tmp_path), answer_field="answer")
    assert counts.as_dict() == {"rows_in": 7473, "rows_kept": 7470, "rows_dropped": 3, "groups_dropped": 3,
                                "by_rule": {"exact": 0, "8gram": 3, "ast": 0, "group": 0},
                                "by_benchmark": {"gsm8k": 3}}
    dropped = read_jsonl(tmp_path / "dropped.jsonl")
    assert sorted(d["decontamination"]["test_id"] for d in dropped) == ["gsm8k/602", "gsm8k/602", "gsm8k/632"]
    assert sorted(d["decontamination"]["similarity"] for d in dropped) == [0.2727, 0.5, 0.5]
    # a lower threshold would take questions that only share a phrase with a test question
    loose = decontaminate_file(str(train), "question", ["gsm8k"], str(tmp_path / "loose"), threshold=0.09)
    assert loose.rows_dropped == 6
    assert len(load_references(["gsm8k", "math500", "mmlu"])) == 1319 + 500 + 14042
