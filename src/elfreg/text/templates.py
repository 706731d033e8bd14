"""The prompt template of each task and the answer format its scorer reads: one definition,
used to format training examples (:mod:`elfreg.data.recipe`) and evaluation prompts
(:mod:`elfreg.eval.tasks`).

It lives in ``text/`` because both rooms reach it without a cycle: ``data/`` may import the
benchmark loaders of ``eval/`` (for decontamination), so ``eval/`` cannot import ``data/``; both
import ``text/``, which imports neither.

=========  ====================================================  ================================
template   prompt (``str.format`` fields)                         answer format
=========  ====================================================  ================================
gsm8k      the boxed-answer instruction + ``{question}``          ends in ``\\boxed{N}``
math       the boxed-answer instruction + ``{problem}``           ends in ``\\boxed{...}``
code       the one-code-block instruction + ``{prompt}``          as written (a ```python block)
mmlu       subject, ``{question}``, lettered ``{choices}``        ends in "The answer is (X)"
raw        ``{prompt}``                                           as written
=========  ====================================================  ================================

GSM8K uses ``\\boxed{N}`` because that is how OpenMathInstruct-2, the bulk of the paper's GSM8K
mixture, ends its solutions; answers in GSM8K's own ``#### N`` form (GSM8K, MetaMathQA's GSM
rows, whose ``#### N`` line is followed by ``The answer is: N``) are rewritten to end in
``The answer is $\\boxed{N}$.`` by :func:`format_answer`. The evaluation extracts the number
after "answer is" or the last ``\\boxed{}`` (:mod:`elfreg.eval.tasks.gsm8k`), so both kinds score.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..plugins import PROMPT_FORMATS, lookup

if TYPE_CHECKING:
    from ..config import DataConfig

__all__ = ["TEMPLATES", "Template", "format_answer", "format_example", "get_template", "prompt_for", "prompt_values",
           "render_prompt"]

LETTERS = "ABCD"
_BOXED_INSTRUCTION = ("Solve the following math problem. Make sure to put the answer (and only answer) inside "
                      "\\boxed{{}}.\n\n")


@dataclass(frozen=True)
class Template:
    """A task's prompt template: ``prompt`` is a :meth:`str.format` string over ``fields`` (the
    first is the main field a source's ``prompt_field`` fills); ``answer`` names the answer
    format (``boxed``, ``choice`` or ``as-is``)."""

    name: str
    prompt: str
    fields: tuple[str, ...]
    answer: str

    @property
    def main_field(self) -> str:
        return self.fields[0]


TEMPLATES: dict[str, Template] = {
    "gsm8k": Template("gsm8k", _BOXED_INSTRUCTION + "{question}", ("question",), "boxed"),
    "math": Template("math", _BOXED_INSTRUCTION + "{problem}", ("problem",), "boxed"),
    "code": Template("code", "Write a Python solution to the following problem. Put the whole program, with any "
                     "imports and helpers it needs, in one ```python code block.\n\n{prompt}", ("prompt",), "as-is"),
    "mmlu": Template("mmlu", "The following is a multiple choice question about {subject}. Think step by step, "
                     "then finish with \"The answer is (X)\" where X is the letter of the correct option.\n\n"
                     "{question}\n{choices}\nAnswer:", ("question", "subject", "choices"), "choice"),
    "raw": Template("raw", "{prompt}", ("prompt",), "as-is"),
}


def get_template(name: str) -> Template:
    """The template called ``name`` (``ValueError`` naming the known ones)."""
    if name not in TEMPLATES:
        raise ValueError(f"unknown template {name!r} (known: {', '.join(TEMPLATES)})")
    return TEMPLATES[name]


def prompt_values(values: Mapping[str, Any]) -> dict[str, Any]:
    """The ``str.format`` values of a prompt: ``values`` as given, except that a ``choices``
    list becomes one ``X. choice`` line per option, with each option also under its letter."""
    out = dict(values)
    choices = out.get("choices")
    if isinstance(choices, Sequence) and not isinstance(choices, str):
        if len(choices) != len(LETTERS):
            raise ValueError(f"choices: expected {len(LETTERS)} options, got {len(choices)}")
        out.update(zip(LETTERS, (str(c) for c in choices), strict=True))
        out["choices"] = "\n".join(f"{letter}. {out[letter]}" for letter in LETTERS)
    return out


def render_prompt(template: str, values: Mapping[str, Any]) -> str:
    """The prompt ``template`` (a ``str.format`` string) makes of ``values``: the one function
    that builds both training prompts and evaluation prompts."""
    return template.format(**prompt_values(values))


def prompt_for(data: DataConfig, question: str) -> str:
    """The whole prompt a model trained on ``data`` reads for ``question``, as its training
    prompts were written: by the data source's registered prompt format where it has one
    (:data:`elfreg.plugins.PROMPT_FORMATS`; the toy tasks: the question and a newline), else by
    ``data.template`` with its main field filled (``ValueError`` for a template of several fields,
    such as MMLU's, whose other fields a question alone cannot fill)."""
    own_format = lookup(PROMPT_FORMATS, data.source)
    if own_format is not None:
        return own_format(question)
    template = get_template(data.template)
    if len(template.fields) != 1:
        raise ValueError(f"the prompt template {template.name} needs the fields {', '.join(template.fields)}; "
                         "a question alone fills only the first: write the whole prompt")
    return render_prompt(template.prompt, {template.main_field: question})


_FINAL_PHRASE = re.compile(r"\n?\s*The answer is:?\s*(?P<value>[^\n]*?)\s*\.?\s*$")
_HASHES = re.compile(r"\n?[ \t]*####[ \t]*(?P<value>[^\n]*?)[ \t]*$")


def format_answer(template: Template, answer: str) -> str:
    """``answer`` in the answer format of ``template``.

    ``boxed``: an answer with a ``\\boxed{}`` is kept as written; one that ends in GSM8K's
    ``#### N`` line (optionally followed by MetaMathQA's ``The answer is: N``) or in
    ``The answer is: X`` has that ending replaced by ``The answer is $\\boxed{N}$.``; anything
    else is kept. ``as-is`` and ``choice`` keep the answer as written.
    """
    if template.answer != "boxed" or "\\boxed" in answer:
        return answer
    body = answer.rstrip()
    final = None
    phrase = _FINAL_PHRASE.search(body)
    if phrase is not None:
        final, body = phrase.group("value"), body[: phrase.start()].rstrip()
    hashes = _HASHES.search(body)
    if hashes is not None:
        final, body = hashes.group("value"), body[: hashes.start()].rstrip()
    if not final:
        return answer
    return f"{body}\nThe answer is $\\boxed{{{final}}}$." if body else f"The answer is $\\boxed{{{final}}}$."


def format_example(template: Template, values: Mapping[str, Any], answer: str) -> tuple[str, str]:
    """(prompt, answer) of a training example: the prompt through :func:`render_prompt`, the
    answer through :func:`format_answer`."""
    return render_prompt(template.prompt, values), format_answer(template, answer)
