"""ELF's tasks (ELF, arXiv 2605.10938): scored on the whole corpus of outputs, not sample by sample.

=============  ==========================================  =====================================
task           problems (task ids)                         scoring
=============  ==========================================  =====================================
xsum           XSum validation documents (``xsum/N``)      ROUGE-1/2/L against the summary
wmt14-de-en    WMT14 De-En validation (``wmt14-de-en/N``)  BLEU against the English sentence
owt-genppl     ``n`` empty prompts (``owt/N``, default     Gen-PPL under a causal LM (GPT-2
               1,000, ELF's ``num_samples``)               Large by default) and unigram entropy
=============  ==========================================  =====================================

The prompt is the document, the German sentence, or nothing, as ELF's models were trained
(``raw`` template). A :class:`CorpusTask` scores the outputs of one generation seed as a corpus
(:meth:`CorpusTask.corpus_scores`; the metrics are :mod:`elfreg.eval.text_metrics`); the
scoring room reports the metrics of each seed and their mean and spread
(:mod:`elfreg.eval.corpus_scoring`). ELF reports the validation sets (its README's numbers);
``--source FILE.jsonl`` scores any other split in the Hub's row format.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import torch

from ...text.templates import TEMPLATES
from ..text_metrics import bleu, generative_perplexity, rouge, rouge_per_pair
from ..verdict import Verdict
from .base import Task
from .sources import DataSource

__all__ = ["CorpusTask", "OwtGenPplTask", "Wmt14DeEnTask", "XsumTask"]


class CorpusTask(Task):
    """A task scored on a corpus of outputs (one per problem): :meth:`corpus_scores`."""

    kind = "corpus"
    template_name = "raw"
    default_template = TEMPLATES["raw"].prompt
    metric_names: ClassVar[tuple[str, ...]]
    headline: ClassVar[str]

    def corpus_scores(self, problems: Sequence[dict[str, Any]], outputs: Sequence[str]) -> dict[str, Any]:
        """The metrics of ``outputs[i]`` answering ``problems[i]``, every i together."""
        raise NotImplementedError

    def sample_scores(self, problem: dict[str, Any], output: str) -> dict[str, float]:
        """Per-sample metrics kept with each record (none unless the metric is per sample)."""
        return {}

    def check(self, problem: dict[str, Any], output: str, form: str = "solution") -> Verdict:
        raise TypeError(f"{self.name} is scored on a corpus of outputs, not one output at a time")

    def primary_score(self, alias: bool = True) -> str | None:
        return self.headline


class XsumTask(CorpusTask):
    """XSum summarisation (ELF's ``train_xsum_ELF-B.yml``): ROUGE-1/2/L."""

    name = "xsum"
    template_fields = ("document",)
    data = DataSource("xsum", lambda d: d / "xsum" / "validation.jsonl", "EdinburghNLP/xsum", None, "validation")
    id_pattern = "xsum/N (N = the row of the loaded split)"
    metric_names = ("rouge1", "rouge2", "rougeL")
    headline = "rouge1"

    def _build(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{"task_id": f"xsum/{i}", "document": r["document"], "reference": r["summary"]}
                for i, r in enumerate(rows)]

    def corpus_scores(self, problems, outputs):
        return rouge(outputs, [p["reference"] for p in problems])

    def sample_scores(self, problem, output):
        return rouge_per_pair([output], [problem["reference"]])[0]


class Wmt14DeEnTask(CorpusTask):
    """WMT14 German → English (ELF's ``train_de-en_ELF-B.yml``): corpus BLEU."""

    name = "wmt14-de-en"
    template_fields = ("source",)
    data = DataSource("wmt14-de-en", lambda d: d / "wmt14" / "de-en-validation.jsonl", "wmt/wmt14", "de-en",
                      "validation")
    id_pattern = "wmt14-de-en/N (N = the row of the loaded split)"
    metric_names = ("bleu", "bleu_elf")
    headline = "bleu"

    def _build(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{"task_id": f"wmt14-de-en/{i}", "source": r["translation"]["de"], "reference": r["translation"]["en"]}
                for i, r in enumerate(rows)]

    def corpus_scores(self, problems, outputs):
        return bleu(outputs, [p["reference"] for p in problems])


class OwtGenPplTask(CorpusTask):
    """Unconditional generation (ELF's OpenWebText models): Gen-PPL under a frozen causal LM and
    unigram entropy (:func:`~elfreg.eval.text_metrics.generative_perplexity`).

    Options: ``n`` prompts (ELF's ``num_samples``), the scoring LM ``ppl_model`` (a Hub id or a
    local folder; ELF's ``gpt2-large``), ``ppl_batch_size``, ``ppl_max_length`` (ELF's 1,024),
    ``device`` of the scoring LM (``auto``: CUDA when present; bf16 on CUDA, fp32 on a CPU).
    """

    name = "owt-genppl"
    template_fields = ("prompt",)
    id_pattern = "owt/N (N = 0 … n − 1)"
    metric_names = ("gen_ppl", "entropy")
    headline = "gen_ppl"

    def __init__(self, *, n: int = 1000, ppl_model: str = "gpt2-large", ppl_batch_size: int = 16,
                 ppl_max_length: int = 1024, device: str = "auto", **options: Any):
        super().__init__(**options)
        if n < 1 or ppl_batch_size < 1 or ppl_max_length < 2:
            raise ValueError(f"owt-genppl: n ({n}) and ppl_batch_size ({ppl_batch_size}) must be >= 1 and "
                             f"ppl_max_length ({ppl_max_length}) >= 2")
        self.n, self.ppl_model, self.ppl_batch_size, self.ppl_max_length = n, ppl_model, ppl_batch_size, ppl_max_length
        self.device = device
        self._scorer: tuple[Any, Any] | None = None

    def _rows(self) -> list[dict[str, Any]]:
        self.provenance = {"origin": "none", "prompts": self.n}
        return [{"prompt": ""}] * self.n

    def _build(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{"task_id": f"owt/{i}", "prompt": r["prompt"]} for i, r in enumerate(rows)]

    def scorer(self) -> tuple[Any, Any]:
        """The scoring LM and its tokenizer, loaded once (frozen; its own tokenizer)."""
        if self._scorer is None:
            from ...device import resolve_device, use_bf16
            from ...text.frozen import load_causal_lm
            from ...text.tokenizer import load_tokenizer

            device = resolve_device(self.device)
            dtype = torch.bfloat16 if use_bf16(device, "auto") else torch.float32
            model = load_causal_lm(self.ppl_model).to(device=device, dtype=dtype)
            self._scorer = (model, load_tokenizer(self.ppl_model))
        return self._scorer

    def corpus_scores(self, problems, outputs):
        model, tokenizer = self.scorer()
        result = generative_perplexity(outputs, model, tokenizer, self.ppl_max_length, self.ppl_batch_size)
        return {"gen_ppl": result.gen_ppl, "entropy": result.entropy, "ppl_tokens": result.tokens,
                "texts_scored": result.texts}

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "ppl_model": self.ppl_model, "ppl_max_length": self.ppl_max_length}

    def identity(self) -> dict[str, Any]:
        return {**super().identity(), "n": self.n, "ppl_model": self.ppl_model, "ppl_max_length": self.ppl_max_length}
