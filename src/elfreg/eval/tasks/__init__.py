"""Benchmark tasks: problems, zero-shot prompt templates and answer checking.

=============  ==========================================  =====================================
task           problems (task ids)                         scoring
=============  ==========================================  =====================================
gsm8k          1,319 test questions (``gsm8k/N``)          final number, compared numerically
math500        500 MATH problems (``math500/N``)           last boxed answer, math-verify 0.9.0
mmlu           14,042 questions (``mmlu/N``)               option letter from the rationale
humaneval      164 (``HumanEval/N``)                       original tests, sandboxed
humaneval+     164 (``HumanEval/N``)                       original tests and EvalPlus extended
                                                           tests (base + plus inputs)
mbpp           500 = task ids 11–510 (``Mbpp/N``)          MBPP's three asserts
mbpp+          378 EvalPlus subset (``Mbpp/N``)            EvalPlus base inputs ("MBPP-378") and
                                                           base + plus inputs
xsum           XSum validation (``xsum/N``)                ROUGE-1/2/L of the corpus (ELF's)
wmt14-de-en    WMT14 De-En validation (``wmt14-de-en/N``)  corpus BLEU, sacreBLEU (ELF's)
owt-genppl     1,000 empty prompts (``owt/N``)             Gen-PPL under GPT-2 Large, unigram
                                                           entropy (ELF's)
=============  ==========================================  =====================================

``N`` of ``gsm8k/N``, ``math500/N`` and ``mmlu/N`` is the 0-based row of the loaded test set
(MMLU: of the local copy with its two embedded header rows removed; the Hub copy has another
order). Templates are :meth:`str.format` strings; their fields are listed in each task's
``template_fields``.

The pieces: :mod:`.base` (the :class:`Task` interface), :mod:`.text` (GSM8K, MATH-500, MMLU),
:mod:`.code` (HumanEval(+), MBPP(+)), :mod:`.elf` (ELF's tasks, scored as corpora) and
:mod:`.registry` (names, aliases, :func:`get_task`).
"""

from .base import Task
from .code import HumanEvalPlusTask, HumanEvalTask, MbppPlusTask, MbppTask
from .elf import CorpusTask, OwtGenPplTask, Wmt14DeEnTask, XsumTask
from .registry import TASKS, canonical_task_name, get_task, task_names
from .text import Gsm8kTask, Math500Task, MmluTask

__all__ = [
    "Task",
    "Gsm8kTask",
    "Math500Task",
    "MmluTask",
    "HumanEvalTask",
    "HumanEvalPlusTask",
    "MbppTask",
    "MbppPlusTask",
    "CorpusTask",
    "XsumTask",
    "Wmt14DeEnTask",
    "OwtGenPplTask",
    "TASKS",
    "get_task",
    "task_names",
    "canonical_task_name",
]
