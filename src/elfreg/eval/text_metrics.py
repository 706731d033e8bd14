"""ELF's text metrics (ELF, arXiv 2605.10938; its ``metrics_utils.py``), through the scorer
libraries that define them: ROUGE-1/2/L with ``rouge-score`` and BLEU with ``sacrebleu`` (the
``elf-eval`` extra), Gen-PPL and unigram entropy under a frozen Hugging Face causal LM.

- **ROUGE** (XSum): ``rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL"],
  use_stemmer=True)``, each pair's F-measure × 100, averaged over pairs (as ELF).
- **BLEU** (WMT14 De-En): ``sacrebleu.corpus_bleu`` with sacreBLEU's standard settings (13a
  tokenisation, case-sensitive, exponential smoothing), the headline; and ELF's own setting
  (``lowercase=True, use_effective_order=True``) beside it as ``bleu_elf``, the number ELF's
  README reports.
- **Gen-PPL** (unconditional generation): each text retokenised by the scoring LM's tokenizer
  (no special tokens added, cut to ``max_length`` tokens), its NLL summed over every token after
  the first and, for a text shorter than ``max_length``, over the EOS after it; Gen-PPL =
  exp(total NLL / total count) over the corpus. ELF pads a batch with EOS and counts the first pad
  as that end-of-text token, which leaves it out for the longest text of each batch: its number
  depends on how texts are batched, elfreg's does not. Empty texts are left out, as ELF leaves
  them out.
- **Unigram entropy**: −Σ p·log(p + 1e-10) over the token frequencies of each retokenised text
  (natural log), averaged over texts (ELF's ``mean_entropy``).
"""

from __future__ import annotations

import importlib
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

ROUGE_TYPES = ("rouge1", "rouge2", "rougeL")


def _scorer_module(module: str, package: str) -> Any:
    """An optional scorer library, or an ImportError in one line naming the extra to install."""
    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise ImportError(f"this metric needs the {package} package: pip install 'elfreg[elf-eval]'") from err


def rouge_per_pair(hypotheses: Sequence[str], references: Sequence[str]) -> list[dict[str, float]]:
    """ROUGE-1/2/L F-measures × 100 of each (hypothesis, reference) pair."""
    rouge_scorer = _scorer_module("rouge_score.rouge_scorer", "rouge-score")
    scorer = rouge_scorer.RougeScorer(list(ROUGE_TYPES), use_stemmer=True)
    return [{k: 100 * s[k].fmeasure for k in ROUGE_TYPES} for s in
            (scorer.score(ref, hyp) for hyp, ref in zip(hypotheses, references, strict=True))]


def rouge(hypotheses: Sequence[str], references: Sequence[str]) -> dict[str, float]:
    """ROUGE-1/2/L: the pairs' F-measures × 100, averaged (ELF's ``compute_rouge``)."""
    pairs = rouge_per_pair(hypotheses, references)
    return {k: sum(p[k] for p in pairs) / len(pairs) for k in ROUGE_TYPES} if pairs else {}


def bleu(hypotheses: Sequence[str], references: Sequence[str]) -> dict[str, float | str]:
    """Corpus BLEU with sacreBLEU's standard settings (``bleu``, its signature ``bleu_signature``)
    and with ELF's (``bleu_elf``: lowercased, effective order)."""
    sacrebleu = _scorer_module("sacrebleu", "sacrebleu")
    hyps, refs = list(hypotheses), [list(references)]
    standard = sacrebleu.metrics.BLEU()
    return {"bleu": standard.corpus_score(hyps, refs).score, "bleu_signature": str(standard.get_signature()),
            "bleu_elf": sacrebleu.corpus_bleu(hyps, refs, lowercase=True, use_effective_order=True).score}


def unigram_entropy(ids: Sequence[int]) -> float:
    """−Σ p·log(p + 1e-10) over the frequencies of the tokens of one text (natural log)."""
    counts = torch.tensor(list(Counter(ids).values()), dtype=torch.float64)
    if counts.numel() == 0:
        return 0.0
    p = counts / counts.sum()
    return float(-(p * torch.log(p + 1e-10)).sum())


@dataclass
class PerplexityResult:
    gen_ppl: float
    entropy: float  # mean unigram entropy over the scored texts
    tokens: int  # NLL terms in the corpus total
    texts: int  # texts scored (empty ones are left out)
    per_text_ppl: list[float]


@torch.no_grad()
def generative_perplexity(texts: Sequence[str], model, tokenizer, max_length: int = 1024,
                          batch_size: int = 16) -> PerplexityResult:
    """Gen-PPL and unigram entropy of ``texts`` under a causal LM (see the module docstring).

    ``model`` is an HF causal LM in eval mode on its device; ``tokenizer`` its tokenizer (it needs
    an EOS token). Texts are batched by ``batch_size`` with right padding, masked: the result
    does not depend on the batching (up to float rounding).
    """
    eos = tokenizer.eos_token_id
    if eos is None:
        raise ValueError("the scoring LM's tokenizer has no EOS token (Gen-PPL counts the end of each text)")
    kept = [t for t in texts if isinstance(t, str) and t.strip()]
    ids = [tokenizer(t, add_special_tokens=False)["input_ids"][:max_length] for t in kept]
    device = next(model.parameters()).device
    nll_sum, count, per_text = 0.0, 0, []
    for start in range(0, len(ids), batch_size):
        rows = ids[start:start + batch_size]
        # each row with its EOS when the text was not cut; positions past a row's end are masked
        seqs = [r + [eos] if len(r) < max_length else r for r in rows]
        width = max(len(s) for s in seqs)
        tokens = torch.full((len(seqs), width), eos, dtype=torch.long)
        mask = torch.zeros((len(seqs), width), dtype=torch.long)
        for i, s in enumerate(seqs):
            tokens[i, :len(s)] = torch.tensor(s)
            mask[i, :len(s)] = 1
        tokens, mask = tokens.to(device), mask.to(device)
        logits = model(input_ids=tokens, attention_mask=mask).logits[:, :-1].float()
        nll = torch.logsumexp(logits, -1) - logits.gather(-1, tokens[:, 1:, None]).squeeze(-1)
        counted = mask[:, 1:].double()
        sums = (nll.double() * counted).sum(1).cpu()
        counts = counted.sum(1).cpu()
        nll_sum += float(sums.sum())
        count += int(counts.sum())
        per_text += [math.exp(s / c) if c > 0 else float("nan") for s, c in zip(sums.tolist(), counts.tolist(),
                                                                                  strict=True)]
    entropies = [unigram_entropy(r) for r in ids]
    return PerplexityResult(gen_ppl=math.exp(nll_sum / count) if count else float("nan"),
                            entropy=sum(entropies) / len(entropies) if entropies else float("nan"),
                            tokens=count, texts=len(ids), per_text_ppl=per_text)
