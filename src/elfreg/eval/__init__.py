"""Evaluation harness: benchmark tasks, answer checking, sandboxed code execution, pass@k.

Public API (see ``docs/eval.md``)::

    from elfreg.eval import get_task, score_predictions
    task = get_task("gsm8k")
    problem = task.problems()[0]
    prompt = task.prompt(problem)
    verdict = task.check(problem, "... #### 18")          # Verdict(passed=True, extracted="18", ...)
    report = score_predictions("humaneval", "samples.jsonl", out_dir="out/")

Helpers for other code: :func:`extract_gsm8k_answer`, :func:`numbers_equal`,
:func:`run_in_sandbox`, :func:`check_program` (assert tests for a small function task),
:func:`pass_at_k`, :func:`extract_code`, :func:`sanitize`.
"""

from .code.execute import check_program
from .code.sandbox import SandboxLimits, SandboxResult, run_in_sandbox, run_many, sandbox_isolation
from .code.sanitize import SanitizedProgram, extract_code, sanitize
from .generation import EvalError, EvalStopped, evaluate_checkpoint
from .passk import pass_at_k, summarize
from .predictions import Prediction, PredictionError, read_predictions
from .reporting import EvalReport
from .scoring import evaluate_predictions, score_predictions
from .tasks import TASKS, Task, get_task, task_names
from .tasks.gsm8k import extract_gsm8k_answer, gsm8k_gold_answer, numbers_equal, parse_number
from .tasks.math500 import check_math, extract_math_answer, math_equal
from .tasks.mmlu import extract_choice
from .tasks.sources import DataUnavailable
from .verdict import Verdict

__all__ = [
    "DataUnavailable",
    "EvalError",
    "EvalStopped",
    "EvalReport",
    "Prediction",
    "PredictionError",
    "SandboxLimits",
    "SandboxResult",
    "SanitizedProgram",
    "TASKS",
    "Task",
    "Verdict",
    "check_math",
    "check_program",
    "evaluate_checkpoint",
    "evaluate_predictions",
    "extract_choice",
    "extract_code",
    "extract_gsm8k_answer",
    "extract_math_answer",
    "get_task",
    "gsm8k_gold_answer",
    "math_equal",
    "numbers_equal",
    "parse_number",
    "pass_at_k",
    "read_predictions",
    "run_in_sandbox",
    "run_many",
    "sandbox_isolation",
    "sanitize",
    "score_predictions",
    "summarize",
    "task_names",
]
