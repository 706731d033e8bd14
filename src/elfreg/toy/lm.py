"""Tiny ``Qwen3ForCausalLM`` models pretrained on the toy corpus, and their greedy accuracy.

These are the CPU stand-ins for the paper's frozen encoder (Qwen3-0.6B-Base) and teacher
(Qwen3-1.7B-Base): same class, same ``save_pretrained`` / ``from_pretrained`` path, toy size.
Each is trained from scratch with the causal-LM loss on ``prompt + "\\n" + answer + EOS`` (see
:mod:`elfreg.toy.corpus`); padding is never supervised and prompt tokens can be
down-weighted (``prompt_loss_weight``): the prompts' names and numbers are random, so their
tokens carry most of the loss but teach nothing about answering; on a CPU budget a weight of
0.1 gave higher held-out accuracy for the same steps (see ``docs/toy-tasks.md``).

Precision follows :func:`elfreg.device.resolve_precision` (``auto`` is fp32 on a CPU whatever
its instruction set, so the toy LMs are the same models on every machine); the loss is always
computed in fp32.
"""

from __future__ import annotations

import math
import os
import random
import time
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm
from transformers import AutoModelForCausalLM, PreTrainedTokenizerBase, Qwen3Config, Qwen3ForCausalLM

from elfreg.device import use_bf16
from elfreg.text.frozen import freeze
from elfreg.text.tokenizer import load_tokenizer
from elfreg.toy.arith import is_correct
from elfreg.toy.code import score_program
from elfreg.toy.corpus import lm_prompt
from elfreg.train.optim import scheduled_lr

LR_FLOOR_RATIO = 0.1
"""The cosine schedule ends at this fraction of the peak learning rate (not part of
:class:`ToyLMConfig`, whose fields key the asset cache)."""


@dataclass(frozen=True)
class ToyLMConfig:
    """Size and pretraining budget of one tiny LM (part of the toy-asset cache key)."""

    hidden_size: int = 128
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    intermediate_size: int = 384
    steps: int = 500
    batch_size: int = 32
    lr: float = 3e-3
    warmup_steps: int = 30
    weight_decay: float = 0.01
    seed: int = 0
    prompt_loss_weight: float = 1.0
    """Loss weight of prompt tokens (answer and EOS tokens weigh 1)."""
    precision: str = "auto"
    """``auto``, ``bf16`` or ``fp32``, as :func:`elfreg.device.resolve_precision` reads them; the
    toy-asset cache key holds the resolved value."""
    tie_embeddings: bool = True
    """Share the input embedding with the output head (as Qwen3-0.6B and 1.7B do). Tied, a
    128-wide LM must turn each token's embedding into the next token's along its depth, and
    some builds lose the current token on the way: the toy encoder's layer-2 digit readout
    (:mod:`elfreg.toy.readout`) for seeds 0 / 1 / 2 was 48 / 36 / 48 % tied and 75 / 72 / 45 %
    untied (docs/records/2026-12-04-toy-recipe.md)."""

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_heads:
            raise ValueError("hidden_size must be divisible by num_heads")
        if self.num_heads % self.num_kv_heads:
            raise ValueError("num_heads must be divisible by num_kv_heads")
        if self.precision not in ("auto", "bf16", "fp32"):
            raise ValueError(f"precision must be auto, bf16 or fp32, got {self.precision!r}")

    def to_dict(self) -> dict:
        """Plain-data form (for hashing and the settings file)."""
        return asdict(self)


@dataclass(frozen=True)
class PretrainStats:
    """What one pretraining run measured."""

    steps: int
    seconds: float
    """Wall-clock time of the training loop."""
    cpu_seconds: float
    """CPU time of this process during the loop (wall time inflates on a shared machine)."""
    final_loss: float
    """Mean training loss over the last 10 % of steps (nats per token, weighted by
    ``prompt_loss_weight``, so below the plain LM loss when prompts are down-weighted)."""
    tokens: int
    params: int
    bf16: bool
    loss_curve: tuple[float, ...] = ()
    """Mean training loss over each tenth of the run."""


def qwen3_config(cfg: ToyLMConfig, tokenizer: PreTrainedTokenizerBase) -> Qwen3Config:
    """The ``Qwen3Config`` of a toy LM; the vocabulary is padded to a multiple of 64 (as hub models)."""
    vocab = int(math.ceil(len(tokenizer) / 64) * 64)
    return Qwen3Config(
        vocab_size=vocab, hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers, num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads, head_dim=cfg.hidden_size // cfg.num_heads,
        max_position_embeddings=getattr(tokenizer, "model_max_length", 512), tie_word_embeddings=cfg.tie_embeddings,
        bos_token_id=None, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
    )


def encode_texts(tokenizer: PreTrainedTokenizerBase, texts: Sequence[str]) -> list[list[int]]:
    """Token ids of each text followed by EOS."""
    ids = tokenizer(list(texts), add_special_tokens=False)["input_ids"]
    return [x + [tokenizer.eos_token_id] for x in ids]


def encode_examples(tokenizer: PreTrainedTokenizerBase, examples: Sequence[dict]) -> list[tuple[list[int], int]]:
    """``(ids of prompt + SEP + answer + EOS, number of prompt + SEP tokens)`` per example."""
    prompts = tokenizer([lm_prompt(e) for e in examples], add_special_tokens=False)["input_ids"]
    answers = encode_texts(tokenizer, [e["answer"] for e in examples])
    return [(p + a, len(p)) for p, a in zip(prompts, answers, strict=True)]


def collate(seqs: Sequence[tuple[list[int], int]], pad_id: int, prompt_weight: float = 1.0
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded ids, attention mask and per-token loss weights (``prompt_weight`` on prompt
    tokens, 1 on answer and EOS tokens, 0 on padding)."""
    width = max(len(s) for s, _ in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    weights = torch.zeros((len(seqs), width))
    for i, (s, n_prompt) in enumerate(seqs):
        ids[i, : len(s)] = torch.tensor(s)
        mask[i, : len(s)] = 1
        weights[i, : len(s)] = 1.0
        weights[i, :n_prompt] = prompt_weight
    return ids, mask, weights


def _batches(lengths: list[int], batch_size: int, rng: random.Random) -> list[list[int]]:
    """One epoch of index batches, grouped by similar length to limit padding, in random order."""
    order = list(range(len(lengths)))
    rng.shuffle(order)
    chunk = batch_size * 32
    batches = []
    for c in range(0, len(order), chunk):
        part = sorted(order[c : c + chunk], key=lengths.__getitem__)
        batches += [part[i : i + batch_size] for i in range(0, len(part), batch_size)]
    rng.shuffle(batches)
    return [b for b in batches if len(b) == batch_size] or batches


def _causal_loss(model: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor, weights: torch.Tensor,
                 bf16: bool) -> torch.Tensor:
    """Weighted next-token cross-entropy, computed in fp32 (the forward may run under bf16 autocast)."""
    ctx = torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else nullcontext()
    with ctx:
        logits = model(input_ids=ids, attention_mask=mask).logits
    logits = logits[:, :-1].float()
    nll = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1), reduction="none")
    w = weights[:, 1:].reshape(-1)
    return (nll * w).sum() / w.sum().clamp_min(1e-8)


def pretrain_lm(cfg: ToyLMConfig, tokenizer: PreTrainedTokenizerBase, examples: Sequence[dict],
                progress: bool = True, desc: str = "pretrain", num_threads: int | None = None,
                position: int = 0, threads_now: Callable[[], int] | None = None,
                resume: Path | None = None, resume_every: int = 500) -> tuple[Qwen3ForCausalLM, PretrainStats]:
    """Train a fresh toy ``Qwen3ForCausalLM`` on ``examples`` (``prompt + SEP + answer + EOS``)
    with the causal-LM loss, prompt tokens weighted by ``cfg.prompt_loss_weight``.

    AdamW, linear warm-up then cosine decay to 10 % (the training room's
    :func:`~elfreg.train.optim.scheduled_lr`), gradient clipping at 1, batches grouped by
    length. Returns the model (eval mode, frozen) and its :class:`PretrainStats`.
    ``num_threads`` sets torch's intra-op threads for the run only (restored afterwards); on a
    shared machine one thread can be several times faster than two busy-waiting ones.
    ``position`` is the progress bar's line (two LMs trained at once keep one line each).
    ``threads_now``, when given, is asked before every step how many threads to use from then on
    (a build that frees a CPU midway hands it on); the weights do not depend on it.

    With ``resume``, a file path, the run's whole state (weights, optimiser, batch order, losses,
    time spent) is written there atomically every ``resume_every`` steps, and a run that finds it
    goes on from that step, giving the weights and losses of a run never stopped. A state written
    by another pretraining (other settings or examples) is refused in one line. The caller removes
    the file once it has kept the model.
    """
    previous = torch.get_num_threads()
    if num_threads:
        torch.set_num_threads(num_threads)
    try:
        return _pretrain(cfg, tokenizer, examples, progress, desc, position, threads_now, resume, resume_every)
    finally:
        torch.set_num_threads(previous)


def _identity(cfg: ToyLMConfig, lengths: list[int]) -> dict:
    """What a resume state must have been written by: these settings on examples of these lengths."""
    return {"lm": asdict(cfg), "examples": len(lengths), "tokens": sum(lengths)}


def _resume_state(path: Path | None, identity: dict) -> dict | None:
    if path is None or not path.exists():
        return None
    state = torch.load(path, map_location="cpu", weights_only=False)  # our own file: optimiser and RNG state
    if state.get("identity") != identity:
        raise ValueError(f"{path} holds a pretraining of other settings or examples; remove it to start afresh")
    return state


def _write_resume_state(path: Path, state: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)


def _pretrain(cfg: ToyLMConfig, tokenizer: PreTrainedTokenizerBase, examples: Sequence[dict], progress: bool,
              desc: str, position: int, threads_now: Callable[[], int] | None, resume: Path | None = None,
              resume_every: int = 500) -> tuple[Qwen3ForCausalLM, PretrainStats]:
    rng = random.Random(cfg.seed)
    with torch.random.fork_rng(devices=[]):  # seeded init without touching the caller's RNG
        torch.manual_seed(cfg.seed)
        model = Qwen3ForCausalLM(qwen3_config(cfg, tokenizer))
    model.train()
    seqs = encode_examples(tokenizer, examples)
    lengths = [len(s) for s, _ in seqs]
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2 and "norm" not in n]
    no_decay = [p for n, p in model.named_parameters() if not (p.ndim >= 2 and "norm" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=cfg.lr, betas=(0.9, 0.98))

    bf16 = use_bf16("cpu", cfg.precision)
    queue: list[list[int]] = []
    losses: list[float] = []
    tokens, first, spent, cpu_spent = 0, 0, 0.0, 0.0
    identity = _identity(cfg, lengths)
    if (state := _resume_state(resume, identity)) is not None:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        rng.setstate(state["rng"])
        queue, losses, tokens, first = state["queue"], state["losses"], state["tokens"], state["step"]
        spent, cpu_spent = state["seconds"], state["cpu_seconds"]
    start, cpu_start = time.perf_counter(), time.process_time()
    bar = tqdm(range(first, cfg.steps), desc=desc, disable=not progress, leave=True, mininterval=0.5,
               position=position, initial=first, total=cfg.steps)
    for step in bar:
        if threads_now is not None and (wanted := threads_now()) != torch.get_num_threads():
            torch.set_num_threads(wanted)
        if not queue:
            queue = _batches(lengths, cfg.batch_size, rng)
        batch = queue.pop()
        ids, mask, weights = collate([seqs[i] for i in batch], tokenizer.pad_token_id, cfg.prompt_loss_weight)
        for group in opt.param_groups:
            group["lr"] = scheduled_lr(step, cfg.lr, cfg.warmup_steps, cfg.steps, LR_FLOOR_RATIO)
        loss = _causal_loss(model, ids, mask, weights, bf16)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
        tokens += int(mask.sum())
        if step % 10 == 0 or step == cfg.steps - 1:
            bar.set_postfix(loss=f"{losses[-1]:.3f}")
        if resume is not None and (step + 1) % resume_every == 0 and step + 1 < cfg.steps:
            _write_resume_state(resume, {
                "identity": identity, "step": step + 1, "model": model.state_dict(), "optimizer": opt.state_dict(),
                "rng": rng.getstate(), "queue": queue, "losses": losses, "tokens": tokens,
                "seconds": spent + time.perf_counter() - start,
                "cpu_seconds": cpu_spent + time.process_time() - cpu_start})
    bar.close()
    seconds = spent + time.perf_counter() - start
    cpu_seconds = cpu_spent + time.process_time() - cpu_start
    tail = losses[-max(1, len(losses) // 10):]
    tenth = max(1, len(losses) // 10)
    curve = tuple(round(sum(losses[i : i + tenth]) / len(losses[i : i + tenth]), 4)
                  for i in range(0, len(losses), tenth))
    freeze(model)
    stats = PretrainStats(steps=cfg.steps, seconds=round(seconds, 2), cpu_seconds=round(cpu_seconds, 2),
                          final_loss=round(sum(tail) / len(tail), 4),
                          tokens=tokens, params=sum(p.numel() for p in model.parameters()), bf16=bf16, loss_curve=curve)
    return model, stats


@torch.no_grad()
def lm_loss(model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase, texts: Sequence[str],
            batch_size: int = 64) -> float:
    """Mean causal-LM loss (nats per predicted token, fp32) of ``model`` on ``texts`` + EOS."""
    model.eval()
    seqs = [(s, 0) for s in encode_texts(tokenizer, texts)]
    total, count = 0.0, 0
    for i in range(0, len(seqs), batch_size):
        ids, mask, weights = collate(seqs[i : i + batch_size], tokenizer.pad_token_id)
        n = int(weights[:, 1:].sum())
        total += _causal_loss(model, ids, mask, weights, bf16=False).item() * n
        count += n
    return total / max(count, 1)


def load_lm(lm_dir: str | os.PathLike) -> tuple[torch.nn.Module, PreTrainedTokenizerBase]:
    """Load a saved toy LM and its tokenizer exactly as a hub model is loaded; frozen, eval mode."""
    model = freeze(AutoModelForCausalLM.from_pretrained(str(lm_dir)))
    return model, load_tokenizer(str(lm_dir))


@torch.no_grad()
def greedy_generate(model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase, prompts: Sequence[str],
                    max_new_tokens: int = 96, batch_size: int = 64) -> list[str]:
    """Greedy continuations of ``prompts`` (left-padded batches, fp32), cut at the first EOS."""
    eos = tokenizer.eos_token_id
    outs: list[str] = []
    for i in range(0, len(prompts), batch_size):
        enc = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts[i : i + batch_size]]
        width = max(len(e) for e in enc)
        ids = torch.full((len(enc), width), tokenizer.pad_token_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for j, e in enumerate(enc):
            ids[j, width - len(e):] = torch.tensor(e)
            mask[j, width - len(e):] = 1
        gen = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens,
                             do_sample=False, eos_token_id=eos, pad_token_id=tokenizer.pad_token_id)
        for row in gen[:, width:].tolist():
            row = row[: row.index(eos)] if eos in row else row
            outs.append(tokenizer.decode(row))
    return outs


def score_answer(example: dict, generated: str) -> bool:
    """Arith: extracted final number equals ``final``. Code: the program passes the hidden tests."""
    if "final" in example:
        return is_correct(generated, example)
    return score_program(example, generated)


def greedy_accuracy(lm_dir: str | os.PathLike, examples: Sequence[dict], max_new_tokens: int = 96,
                    batch_size: int = 64) -> float:
    """Fraction of ``examples`` an LM folder answers correctly when decoded greedily.

    The LM continues ``prompt + "\\n"`` (the convention it was trained with) until EOS or
    ``max_new_tokens``; the continuation is scored by :func:`score_answer`.
    """
    if not examples:
        raise ValueError("greedy_accuracy needs at least one example")
    model, tokenizer = load_lm(lm_dir)
    outs = greedy_generate(model, tokenizer, [lm_prompt(e) for e in examples], max_new_tokens, batch_size)
    return sum(score_answer(e, o) for e, o in zip(examples, outs, strict=True)) / len(examples)
