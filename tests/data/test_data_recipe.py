"""Sources, filters and field mapping on fixture files in the published schemas; malformed rows
fail with their line; JSONL, Parquet, folders and ``datasets.load_dataset`` read the same rows."""

from __future__ import annotations

import dataclasses
import json

import pytest
from data_helpers import FIXTURES, paper_config

from elfreg.config import Config, ConfigError, DataConfig, FilterConfig, SourceConfig
from elfreg.data.examples import Example, load_examples
from elfreg.data.recipe import SourceCounts, recipe_rows, source_rows
from elfreg.jsonl import read_jsonl
from elfreg.text.templates import TEMPLATES


def _counts(cfg: Config) -> tuple[list, dict[str, SourceCounts]]:
    counts: dict[str, SourceCounts] = {}
    rows = list(recipe_rows(cfg.data, counts))
    return rows, counts


def test_the_gsm8k_recipe_loads_the_gsm8k_part_of_each_source():
    rows, counts = _counts(paper_config("gsm8k"))
    omi, mm = counts["openmathinstruct2-gsm8k"], counts["metamathqa-gsm"]
    source = read_jsonl(FIXTURES / "openmathinstruct2.jsonl")
    assert omi.rows_in == len(source) == 6
    assert omi.rows_out == sum(r["problem_source"] in ("gsm8k", "augmented_gsm8k") for r in source) == 4
    assert omi.filtered == {"problem_source in [gsm8k, augmented_gsm8k]": 2}
    assert (mm.rows_in, mm.rows_out) == (5, 4)
    assert mm.filtered == {"type in [GSM_AnsAug, GSM_Rephrased, GSM_SV, GSM_FOBAR]": 1}
    assert [s for s, _ in rows] == [0] * 4 + [1] * 4
    first = rows[0][1]
    assert first.question == source[0]["problem"] and first.raw_answer == source[0]["generated_solution"]
    assert first.prompt.endswith(source[0]["problem"]) and first.group == first.question
    robe = rows[5][1]  # MetaMathQA rows group by the question they were rewritten from
    assert robe.group.startswith("A robe takes 2 bolts") and robe.question.startswith("If a robe requires")


def test_the_math_and_code_recipes_keep_their_parts():
    _, counts = _counts(paper_config("math"))
    assert counts["openmathinstruct2-math"].rows_out == 2
    rows, counts = _counts(paper_config("code"))
    assert counts["opencodeinstruct-python"].filtered == {"output matches /```python/": 1}
    assert all("```python" in r.answer for _, r in rows) and len(rows) == 4
    cfg = paper_config("code")
    strict = dataclasses.replace(cfg.data.sources[0], filters=[
        *cfg.data.sources[0].filters, FilterConfig(field="average_test_score", min=1.0)])
    counts = SourceCounts()
    assert len(list(source_rows(strict, TEMPLATES["code"], counts))) == 3
    assert counts.filtered["average_test_score >= 1"] == 1


@pytest.mark.parametrize(("lines", "error"), [
    (['{"problem": "a", "generated_solution": "b"}', '{"problem": "c"}'], ":2: field 'generated_solution' must be a "
                                                                          "string, got missing"),
    (['{"problem": "a", "generated_solution": "b"}', "", "{oops"], ":3: not valid JSON (Expecting property name "
                                                                   "enclosed in double quotes)"),
    (['{"problem": 5, "generated_solution": "b"}'], ":1: field 'problem' must be a string, got int 5"),
])
def test_a_malformed_row_fails_with_its_line_number(tmp_path, lines, error):
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(lines) + "\n")
    src = SourceConfig(kind="jsonl", path=str(path), prompt_field="problem", answer_field="generated_solution")
    with pytest.raises(ValueError) as err:
        list(source_rows(src, TEMPLATES["math"], SourceCounts()))
    assert str(err.value) == f"{path}{error}"


def test_a_filter_on_a_missing_column_names_the_row(tmp_path):
    src = SourceConfig(kind="jsonl", path=str(FIXTURES / "metamathqa.jsonl"), prompt_field="query",
                       answer_field="response", filters=[FilterConfig(field="problem_source", keep=["gsm8k"])])
    with pytest.raises(ValueError, match=r"metamathqa.jsonl:1: filter field 'problem_source' is missing"):
        list(source_rows(src, TEMPLATES["gsm8k"], SourceCounts()))


def test_jsonl_parquet_folders_and_load_dataset_read_the_same_rows(tmp_path, monkeypatch):
    pq = pytest.importorskip("pyarrow.parquet")
    pa = pytest.importorskip("pyarrow")
    pytest.importorskip("datasets")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    rows = read_jsonl(FIXTURES / "openmathinstruct2.jsonl")
    folder = tmp_path / "omi2"
    folder.mkdir()
    pq.write_table(pa.Table.from_pylist(rows[:4]), folder / "train-00000.parquet")
    pq.write_table(pa.Table.from_pylist(rows[4:]), folder / "train-00001.parquet")
    base = SourceConfig(kind="jsonl", path=str(FIXTURES / "openmathinstruct2.jsonl"), prompt_field="problem",
                        answer_field="generated_solution")

    def read(src):
        return [(r.prompt, r.answer) for r in source_rows(src, TEMPLATES["math"], SourceCounts())]

    want = read(base)
    assert len(want) == 6
    assert read(dataclasses.replace(base, kind="parquet", path=str(folder))) == want
    assert read(dataclasses.replace(base, kind="parquet", path=str(folder / "train-00000.parquet"))) == want[:4]
    assert read(dataclasses.replace(base, kind="hf", path=str(folder), split="train")) == want
    assert read(dataclasses.replace(base, limit=2)) == want[:2]


def test_legacy_single_sources_keep_working(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps({"q": f"add {i} 1", "a": f"#### {i + 1}"}) + "\n" for i in range(3)))
    plain = load_examples(DataConfig(source="jsonl", path=str(path), prompt_field="q", answer_field="a"))
    assert plain == [Example(f"add {i} 1", f"#### {i + 1}") for i in range(3)]
    boxed = load_examples(DataConfig(source="jsonl", path=str(path), prompt_field="q", answer_field="a",
                                     template="gsm8k", limit=2))
    assert [e.answer for e in boxed] == ["The answer is $\\boxed{1}$.", "The answer is $\\boxed{2}$."]
    assert boxed[0].prompt == TEMPLATES["gsm8k"].prompt.format(question="add 0 1")
    toy = DataConfig(source="toy-arith", toy_count=5)
    from elfreg.plugins import DATA_SOURCES, lookup

    assert load_examples(toy) == lookup(DATA_SOURCES, "toy-arith")(toy)
    with pytest.raises(ValueError, match="elfreg data prepare"):
        load_examples(DataConfig(source="mixture", sources=[SourceConfig(kind="jsonl", path=str(path))]))


@pytest.mark.parametrize(("override", "key"), [
    ("data.source=nonsense", "data.source"), ("data.template=chat", "data.template"),
    ("data.jaccard_threshold=0", "data.jaccard_threshold"), ("data.decontaminate=[gsm9k]", "data.decontaminate"),
    ("data.shard_rows=0", "data.shard_rows"), ("train.epochs=-1", "train.epochs"),
    ("data.sources=[{kind: jsonl, path: x}]", "data.sources"),
    ("data.prepared=' '", "data.prepared"), ("data.paper=gsm9k", "data.paper"),
])
def test_new_data_settings_fail_with_one_line_naming_the_key(override, key):
    with pytest.raises(ConfigError) as err:
        Config.load(FIXTURES.parents[2] / "configs" / "tiny.yaml", [override])
    assert str(err.value).startswith(f"config error: {key}") and "\n" not in str(err.value)


@pytest.mark.parametrize(("source", "key"), [
    ({"kind": "ftp", "path": "x"}, "data.sources[0].kind"), ({"kind": "hf"}, "data.sources[0].path"),
    ({"kind": "jsonl", "path": "x", "epochs": 0}, "data.sources[0].epochs"),
    ({"kind": "jsonl", "path": "x", "filters": [{"field": "f"}]}, "data.sources[0].filters[0]"),
    ({"kind": "jsonl", "path": "x", "filters": [{"field": "f", "min": 2, "max": 1}]}, "data.sources[0].filters[0].max"),
    ({"kind": "jsonl", "path": "x", "filters": [{"field": "f", "pattern": "("}]},
     "data.sources[0].filters[0].pattern"),
    ({"kind": "jsonl", "path": "x", "filters": [{"field": "f", "keep": "a"}]}, "data.sources[0].filters[0].keep"),
    ({"kind": "jsonl", "path": "x", "colour": 1}, "data.sources[0].colour"),
])
def test_source_settings_fail_with_one_line_naming_the_key(source, key):
    with pytest.raises(ConfigError) as err:
        Config.from_dict({"data": {"source": "mixture", "sources": [source]}})
    assert str(err.value).startswith(f"config error: {key}") and "\n" not in str(err.value)


def test_the_shipped_paper_configs_load_the_papers_subsets_with_epoch_budgets():
    from data_helpers import CONFIGS

    budgets = {"elf-reg-b-gsm8k.yaml": ("gsm8k", 12), "elf-b-gsm8k.yaml": ("gsm8k", 12),
               "elf-reg-l-gsm8k.yaml": ("gsm8k", 12), "elf-reg-l-math.yaml": ("math", 8),
               "elf-reg-l-code.yaml": ("code", 12), "elf-reg-b-mmlu.yaml": ("mmlu", 30)}
    subsets = {("nvidia/OpenMathInstruct-2", "gsm8k"): ("problem_source", ["gsm8k", "augmented_gsm8k"]),
               ("nvidia/OpenMathInstruct-2", "math"): ("problem_source", ["math", "augmented_math"]),
               ("meta-math/MetaMathQA", "gsm8k"): ("type", ["GSM_AnsAug", "GSM_Rephrased", "GSM_SV", "GSM_FOBAR"])}
    for name, (paper, epochs) in budgets.items():
        text = (CONFIGS / name).read_text()
        cfg = Config.load(CONFIGS / name)
        assert (cfg.data.source, cfg.data.paper, cfg.data.template, cfg.train.epochs) == ("mixture", paper, paper,
                                                                                          epochs)
        assert cfg.data.decontaminate and "Not reproducible offline" in text
        for src in cfg.data.sources:
            if (src.path, paper) in subsets:
                assert [(f.field, f.keep) for f in src.filters] == [subsets[(src.path, paper)]]
    math = Config.load(CONFIGS / "elf-reg-l-math.yaml")
    assert math.train.init_from == "runs/elf-reg-l-gsm8k/checkpoints/epoch-7.5"
    assert math.data.decontaminate == ["math500"]
    # the warm start exists: the GSM8K run keeps its epoch-7.5 checkpoint out of the rotation
    assert Config.load(CONFIGS / "elf-reg-l-gsm8k.yaml").train.keep_epochs == [7.5]
