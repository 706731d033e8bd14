"""One template per task: training examples of every paper recipe and the evaluation prompts
of the same task come out of the same function, and answers end in what the scorer reads."""

from __future__ import annotations

import pytest
from data_helpers import paper_config

from elfreg.data.recipe import recipe_rows
from elfreg.eval.tasks import base as task_base
from elfreg.eval.tasks import get_task
from elfreg.text import templates
from elfreg.text.templates import TEMPLATES, format_answer, render_prompt

# recipe -> (its template, an evaluation task of it, the problem fields that task fills from a question)
CASES = {
    "gsm8k": ("gsm8k", "gsm8k", lambda row: {"question": row.question}),
    "math": ("math", "math500", lambda row: {"problem": row.question}),
    "code": ("code", "mbpp+", lambda row: {"prompt": row.question}),
    "mmlu": ("mmlu", "mmlu", None),
}


@pytest.mark.parametrize("recipe", list(CASES))
def test_a_training_example_and_the_eval_prompt_are_built_by_the_same_function(recipe, monkeypatch):
    template, task_name, problem_of = CASES[recipe]
    cfg = paper_config(recipe)
    assert cfg.data.template == template
    calls = []

    def spy(text, values):
        calls.append(text)
        return real(text, values)

    real = templates.render_prompt
    # the eval room imports the function by name: it must be this very object
    assert task_base.render_prompt is templates.render_prompt
    monkeypatch.setattr(templates, "render_prompt", spy)
    monkeypatch.setattr(task_base, "render_prompt", spy)
    _, row = next(iter(recipe_rows(cfg.data)))
    task = get_task(task_name)
    if problem_of is None:  # MMLU: the rationale file carries the published question fields
        from elfreg.jsonl import read_jsonl

        first = read_jsonl(cfg.data.sources[0].path)[0]
        problem = {"question": first["question"], "subject": first["subject"], "choices": first["choices"]}
    else:
        problem = problem_of(row)
    assert task.prompt(problem) == row.prompt
    assert calls == [TEMPLATES[template].prompt, TEMPLATES[template].prompt] and task.template == calls[0]


def test_mmlu_prompt_lays_out_the_choices_as_in_evaluation():
    prompt = render_prompt(TEMPLATES["mmlu"].prompt, {"question": "Q?", "subject": "physics",
                                                      "choices": ["w", "x", "y", "z"]})
    assert "Q?\nA. w\nB. x\nC. y\nD. z\nAnswer:" in prompt and "about physics" in prompt
    with pytest.raises(ValueError, match="expected 4 options"):
        render_prompt(TEMPLATES["mmlu"].prompt, {"question": "Q?", "subject": "s", "choices": ["a"]})


@pytest.mark.parametrize(("answer", "expected"), [
    # MetaMathQA GSM rows: "#### N" then "The answer is: N"
    ("Half is 1.\nIn total 2 + 1 = 3 bolts.\n#### 3\nThe answer is: 3",
     "Half is 1.\nIn total 2 + 1 = 3 bolts.\nThe answer is $\\boxed{3}$."),
    # GSM8K's own solutions
    ("She makes 9 * 2 = $<<9*2=18>>18.\n#### 18", "She makes 9 * 2 = $<<9*2=18>>18.\nThe answer is $\\boxed{18}$."),
    ("12 + 3 = 15\n#### 1,080", "12 + 3 = 15\nThe answer is $\\boxed{1,080}$."),
    # MetaMathQA MATH rows
    ("$91 = 7 \\cdot 13$.\nThe answer is: 13", "$91 = 7 \\cdot 13$.\nThe answer is $\\boxed{13}$."),
    # OpenMathInstruct-2: already boxed, kept as written
    ("So Tom has \\boxed{26} pencils left.", "So Tom has \\boxed{26} pencils left."),
    ("no final answer here", "no final answer here"),
    ("#### 7", "The answer is $\\boxed{7}$."),
])
def test_boxed_answers_are_rewritten_to_end_in_boxed(answer, expected):
    assert format_answer(TEMPLATES["gsm8k"], answer) == expected
    assert format_answer(TEMPLATES["code"], answer) == answer and format_answer(TEMPLATES["raw"], answer) == answer


def test_the_scorers_read_the_training_answers():
    gsm8k, math500, mmlu = get_task("gsm8k"), get_task("math500"), get_task("mmlu")
    for _, row in recipe_rows(paper_config("gsm8k").data):
        assert "####" not in row.answer and "\\boxed{" in row.answer
        gold = row.answer.rsplit("\\boxed{", 1)[1].split("}")[0]
        assert gsm8k.check({"answer": gold}, row.answer).passed, row.answer
        assert not gsm8k.check({"answer": gold + "1"}, row.answer).passed
    for _, row in recipe_rows(paper_config("math").data):
        gold = row.answer.rsplit("\\boxed{", 1)[1].split("}")[0]
        assert math500.check({"answer": gold}, row.answer).passed
    for _, row in recipe_rows(paper_config("mmlu").data):
        assert mmlu.check({"answer": "B"}, row.answer).passed


def test_a_checkpoint_trained_on_raw_prompts_is_evaluated_on_raw_prompts():
    task = get_task("gsm8k")
    problem = {"question": "What is 2 + 3?"}
    assert task.prompt(problem).endswith("What is 2 + 3?") and task.prompt(problem) != "What is 2 + 3?"
    task.use_trained_template("gsm8k")
    assert task.template == TEMPLATES["gsm8k"].prompt
    task.use_trained_template("raw")
    assert task.prompt(problem) == "What is 2 + 3?"
    custom = get_task("gsm8k", template="Q: {question}\nA:")
    custom.use_trained_template("raw")
    assert custom.prompt(problem) == "Q: What is 2 + 3?\nA:"


def test_a_question_becomes_the_prompt_its_training_data_wrote():
    """``prompt_for`` (what ``elfreg sample --question``, ``Model.prompt`` and the chat endpoint
    send): a toy source's own format, which is the prompt of its training examples; else the
    recipe's template with its main field filled; a template of several fields is refused."""
    from elfreg.config import DataConfig
    from elfreg.text.templates import prompt_for
    from elfreg.toy.registry import toy_examples, toy_records

    for source in ("toy-arith", "toy-code"):
        data = DataConfig(source=source, toy_count=3)
        records, examples = toy_records(data), toy_examples(data)
        assert [prompt_for(data, r["prompt"]) for r in records] == [e.prompt for e in examples]
        assert prompt_for(data, "Q?") == "Q?\n"
    gsm8k = prompt_for(DataConfig(source="jsonl", path="rows.jsonl", template="gsm8k"), "What is 2 + 3?")
    assert gsm8k == render_prompt(TEMPLATES["gsm8k"].prompt, {"question": "What is 2 + 3?"})
    assert gsm8k.startswith("Solve the following math problem.") and gsm8k.endswith("\n\nWhat is 2 + 3?")
    assert prompt_for(DataConfig(source="jsonl", path="rows.jsonl"), "add 1 2") == "add 1 2"  # raw
    with pytest.raises(ValueError, match="^the prompt template mmlu needs the fields question, subject, choices; "):
        prompt_for(DataConfig(source="jsonl", path="rows.jsonl", template="mmlu"), "Which?")
