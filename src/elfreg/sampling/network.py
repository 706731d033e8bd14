"""The network as the samplers see it: a denoiser D_θ and a decoder D (ELF-REG §3, App. C).

Samplers talk to a :class:`Network`, so that tests can drive them with stub networks whose
predictions are known analytically. :class:`StudentNetwork` adapts a trained
:class:`~elfreg.model.student.Student`:

- ``denoise`` is one call of the student in denoise mode and returns the clean predictions
  (x̂ for the text, r̂ for the REG token when the student has one);
- ``decode`` is one call of the same student in decode mode (t = 1, self-conditioning 0 at every
  position, the mode tokens on) followed by the vocabulary head and an argmax per answer position. The
  logits are produced in chunks of positions, so a 151,936-entry vocabulary never needs a
  (batch × canvas × vocabulary) tensor. Given ``eos_id``, the vocabulary head runs left to right
  over the answer region and stops for a row once it has produced an EOS: every position after a
  row's first EOS then holds EOS. The answer (the prefix before the first EOS) is the same as with
  a full argmax; only the vocabulary-head work after it is saved.

With ``bf16`` the calls run under bf16 autocast on a bf16 copy of the student's matmul weights
(:class:`~elfreg.model.inference.Bf16Copy`), made once instead of autocast's cast per call and
remade when the student's weights change: the same numbers, bit for bit, without the per-call
weight traffic. With ``compile`` the student's forward runs through ``torch.compile`` (compiled
on first use and again for each new shape, tens of seconds each on a CPU; the same numbers up to
float rounding): it pays at small shapes, where per-call overhead dominates, over many calls
(docs/performance.md).

On a CPU a large batch runs through the Transformer blocks in chunks of samples sized to the
last-level cache (:mod:`elfreg.sampling.cache_chunks`; ``cache_chunks=False`` runs it whole, and the compiled
forward always does): the same predictions bit for bit, 1.33× faster at the B shape's batch 32.

NFE is counted by :class:`CountingNetwork`, which wraps the network the samplers call (ELF-REG §3, App. C).
Definition used throughout elfreg: one forward pass of the network over a batch counts **one
call for every row of that batch, charged to the sample the row belongs to**. A denoiser step on
a batch of 8 samples therefore adds 1 to each of the 8 samples; with prompt CFG the conditional
and the prompt-dropped rows of a sample are two rows, so a step adds 2 to that sample. A sample's
NFE is its denoiser calls plus its decoder calls. The frozen prompt encoder is not a network
call of the student and is never counted; decoding done only to record a trajectory goes to the
unwrapped network and is not counted either.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch

from ..compiling import require_compile
from ..device import autocast
from ..model.inference import Bf16Copy
from ..model.student import Student
from .cache_chunks import chunk_sizes, cpu_cache_bytes

# Upper bound on the number of logits held at once while decoding (positions × vocabulary).
LOGITS_PER_CHUNK = 1 << 25
# Answer positions per row that the EOS stop reads at a time: the head runs past a row's first EOS
# by at most this many positions. A memory-sized window alone covered a whole 192-position answer
# region at batch 1 with a 151,936-entry vocabulary, so the stop never saved anything there.
EOS_WINDOW = 32


def top_token(logits: torch.Tensor) -> torch.Tensor:
    """The argmax over the last dim (the first index on ties, as ``argmax``), by ``max``: on a CPU
    ``argmax`` has no fast bf16 path: 424 ms of a 2,684 ms B-shape decode call at batch 8, ``max``
    102 ms (docs/performance.md); ``tests/sampling/test_sampling_network.py`` checks they agree."""
    return logits.max(dim=-1).indices


@runtime_checkable
class Network(Protocol):
    """What a sampler needs from the model. All tensors are on the network's device.

    ``reg_dim`` is the width d_r of the REG state, or None when the model has no REG token. A
    sampler told to drop REG at inference (``sample.reg: false``) passes ``reg=None`` to a
    network that has one; the network then runs without its REG token. A network may also say
    ``guides_self_conditioning = True`` (the SC-CFG scale is not one of its inputs, as in an ELF
    model trained without SC-CFG tokens): the sampler then guides self-conditioning by calls, as
    ELF's sampler does (:func:`~elfreg.sampling.steps.predict`); absent means False.
    """

    reg_dim: int | None

    def denoise(self, z: torch.Tensor, q: torch.Tensor, t: torch.Tensor, w: torch.Tensor,
                prompt_mask: torch.Tensor, reg: torch.Tensor | None,
                reg_q: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One denoiser call d = D_θ(y, q, t) (Eq. 12): (B, L, d) text and (B, d_r) REG predictions.

        Prompt positions of the returned text prediction equal ``z`` (the clean prompt).
        """
        ...

    def decode(self, x: torch.Tensor, prompt_mask: torch.Tensor, reg: torch.Tensor | None,
               w: torch.Tensor) -> torch.Tensor:
        """One decoder call: (B, L) argmax token ids at answer positions, −1 at prompt positions."""
        ...


class StudentNetwork:
    """A :class:`Network` backed by a :class:`Student` (eval mode, no gradient, optional bf16)."""

    def __init__(self, student: Student, bf16: bool = False, eos_id: int | None = None,
                 logits_per_chunk: int = LOGITS_PER_CHUNK, compile: bool = False, eos_window: int = EOS_WINDOW,
                 cache_chunks: bool = True):
        self.student = student.eval()
        self.cache_chunks = cache_chunks and not compile
        self.bf16 = bf16
        self._bf16_copy = Bf16Copy(student) if bf16 else None
        self.compile = compile
        self._compiled: tuple[Student, Student] | None = None  # (module, its compiled wrapper)
        self.eos_id = eos_id
        self.reg_dim = student.teacher_dim if student.extra_token == "reg" else None
        # a self-conditioned model whose SC-CFG scale is not an input: predict() guides it (ELF's sampler)
        self.guides_self_conditioning = student.cfg.cfg_tokens == 0 and student.self_conditioning
        self.positions_per_chunk = max(1, logits_per_chunk // student.vocab_size)
        if eos_window < 1:
            raise ValueError(f"eos_window must be at least 1 position, got {eos_window}")
        self.eos_window = eos_window

    @property
    def device(self) -> torch.device:
        return next(self.student.parameters()).device

    def calling_module(self) -> Student:
        """The module that runs the calls: the student, or its bf16 copy (kept current);
        compiled when asked (the compiled wrapper's other methods run the module's own)."""
        model = self.student if self._bf16_copy is None else self._bf16_copy.get()
        if not self.compile:
            return model
        if self._compiled is None or self._compiled[0] is not model:
            require_compile("--compile (compile=True)")
            self._compiled = (model, torch.compile(model))
        return self._compiled[1]

    def sample_chunks(self, x: torch.Tensor) -> list[int] | None:
        """The chunks of samples the blocks run on for a call on states ``x`` (B, L, d)
        (:mod:`elfreg.sampling.cache_chunks`), or None for the whole batch at once."""
        if not self.cache_chunks:
            return None
        element_bytes = 2 if self.bf16 else x.element_size()
        return chunk_sizes(x.shape[0], x.shape[1] + self.student.n_prefix, self.student.blocks[0].mlp.down.in_features,
                           element_bytes, cpu_cache_bytes(x.device))

    def _call(self, model: Student, z: torch.Tensor, q: torch.Tensor | None, t: torch.Tensor, w: torch.Tensor,
              prompt_mask: torch.Tensor, decode: torch.Tensor | None = None, reg: torch.Tensor | None = None,
              reg_q: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        """(x̂, r̂, hidden) of one call: the student's forward, or on a CPU its stages with the
        blocks run on cache-sized chunks of samples (:meth:`sample_chunks`; the same values)."""
        chunks = self.sample_chunks(z)
        if chunks is None:
            out = model(z, q, t, w, prompt_mask, decode=decode, reg=reg, reg_self_cond=reg_q, drop_reg=reg is None)
            return out.x_hat, out.reg_hat, out.hidden
        seq = model.embed(z, q, t, w, decode, reg, reg_q, drop_reg=reg is None)
        h = torch.cat([model.run_blocks(part, seq.cos, seq.sin)[0] for part in seq.h.split(chunks)])
        return model.heads(h, seq, z, prompt_mask)

    @torch.no_grad()
    def denoise(self, z: torch.Tensor, q: torch.Tensor, t: torch.Tensor, w: torch.Tensor,
                prompt_mask: torch.Tensor, reg: torch.Tensor | None = None,
                reg_q: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        with autocast(self.device, self.bf16):
            x_hat, reg_hat, _ = self._call(self.calling_module(), z, q if self.student.self_conditioning else None,
                                           t, w, prompt_mask, reg=reg, reg_q=reg_q)
        return x_hat.float(), None if reg_hat is None else reg_hat.float()

    @torch.no_grad()
    def decode_hidden(self, x: torch.Tensor, prompt_mask: torch.Tensor, reg: torch.Tensor | None,
                      w: torch.Tensor) -> torch.Tensor:
        """The decode-mode hidden states h (B, L, width) that the vocabulary head maps to logits
        (``student.decode_logits(h)``); one uncounted call, for analyses of the decoder."""
        with autocast(self.device, self.bf16):
            return self._decode_mode(self.calling_module(), x, prompt_mask, reg, w)

    def _decode_mode(self, model: Student, x: torch.Tensor, prompt_mask: torch.Tensor, reg: torch.Tensor | None,
                     w: torch.Tensor) -> torch.Tensor:
        b = x.shape[0]
        sc = torch.zeros_like(x) if self.student.self_conditioning else None
        return self._call(model, x, sc, torch.ones(b, device=x.device), w, prompt_mask,
                          decode=torch.ones(b, dtype=torch.bool, device=x.device), reg=reg)[2]

    @torch.no_grad()
    def decode(self, x: torch.Tensor, prompt_mask: torch.Tensor, reg: torch.Tensor | None,
               w: torch.Tensor) -> torch.Tensor:
        model = self.calling_module()
        with autocast(self.device, self.bf16):
            hidden = self._decode_mode(model, x, prompt_mask, reg, w)
            if self.eos_id is None:
                return self._argmax_all(model, hidden, prompt_mask)
            return self._argmax_until_eos(model, hidden, prompt_mask, self.eos_id)

    def _argmax_all(self, model: Student, hidden: torch.Tensor, prompt_mask: torch.Tensor) -> torch.Tensor:
        h = hidden[~prompt_mask]
        parts = [top_token(model.decode_logits(h[i:i + self.positions_per_chunk]))
                 for i in range(0, h.shape[0], self.positions_per_chunk)]
        ids = torch.full(prompt_mask.shape, -1, dtype=torch.long, device=hidden.device)
        if parts:
            ids[~prompt_mask] = torch.cat(parts)
        return ids

    def _argmax_until_eos(self, model: Student, hidden: torch.Tensor, prompt_mask: torch.Tensor,
                          eos: int) -> torch.Tensor:
        """Argmax over windows of answer positions, left to right, for the rows without an EOS yet.

        A window is ``eos_window`` positions per row, fewer when the rows still pending would hold
        more than ``positions_per_chunk`` positions' logits at once. Assumes each row's answer
        region is contiguous after its prompt (the canvas layout).
        """
        b, length = prompt_mask.shape
        dev = hidden.device
        ids = torch.full((b, length), eos, dtype=torch.long, device=dev)
        ids[prompt_mask] = -1
        start = prompt_mask.sum(1)  # first answer position of each row
        pending = torch.ones(b, dtype=torch.bool, device=dev)
        offset = 0
        longest = int(length - start.min())
        while offset < longest and bool(pending.any()):
            rows = pending.nonzero().squeeze(1)
            width = max(1, min(self.eos_window, self.positions_per_chunk // rows.numel()))
            cols = start[rows, None] + torch.arange(offset, offset + width, device=dev)[None, :]
            valid = cols < length
            r_idx = rows[:, None].expand_as(cols)[valid]
            c_idx = cols[valid]
            tokens = top_token(model.decode_logits(hidden[r_idx, c_idx]))
            ids[r_idx, c_idx] = tokens
            hit = torch.zeros(b, dtype=torch.bool, device=dev)
            hit[r_idx[tokens == eos]] = True
            pending &= ~hit & (start + offset + width < length)
            offset += width
        # everything after a row's first EOS is EOS
        answer = ~prompt_mask
        after_eos = (torch.cumsum((ids == eos) & answer, dim=1) - ((ids == eos) & answer).long()) > 0
        ids[after_eos & answer] = eos
        return ids


def as_network(model: Student | Network, bf16: bool = False) -> Network:
    """Wrap a Student; pass any other :class:`Network` through unchanged."""
    if isinstance(model, Student):
        return StudentNetwork(model, bf16)
    if isinstance(model, Network):
        return model
    raise TypeError(f"expected a Student or a sampling Network, got {type(model).__name__}")


class CountingNetwork:
    """Wraps a :class:`Network` and charges every row of every call to its sample.

    Each call takes ``rows``: the sample index (0..n−1) of each row of the batch passed in
    (a sample may appear more than once). ``rows=None`` means rows 0..B−1.
    """

    def __init__(self, net: Network, n_samples: int):
        self.net = net
        self.reg_dim = net.reg_dim
        self.guides_self_conditioning = getattr(net, "guides_self_conditioning", False)
        self.denoiser_calls = torch.zeros(n_samples, dtype=torch.long)
        self.decoder_calls = torch.zeros(n_samples, dtype=torch.long)

    @property
    def nfe(self) -> torch.Tensor:
        """(n,) network calls made for each sample so far."""
        return self.denoiser_calls + self.decoder_calls

    def _charge(self, counter: torch.Tensor, rows: torch.Tensor | None, batch: int) -> None:
        if rows is None:
            if batch > counter.numel():
                raise ValueError(f"a batch of {batch} rows needs explicit sample indices")
            rows = torch.arange(batch)
        rows = rows.detach().cpu().long()
        if rows.numel() != batch:
            raise ValueError(f"{rows.numel()} sample indices for a batch of {batch} rows")
        counter.index_add_(0, rows, torch.ones_like(rows))

    def denoise(self, z: torch.Tensor, q: torch.Tensor, t: torch.Tensor, w: torch.Tensor,
                prompt_mask: torch.Tensor, reg: torch.Tensor | None, reg_q: torch.Tensor | None,
                rows: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        self._charge(self.denoiser_calls, rows, z.shape[0])
        return self.net.denoise(z, q, t, w, prompt_mask, reg, reg_q)

    def decode(self, x: torch.Tensor, prompt_mask: torch.Tensor, reg: torch.Tensor | None, w: torch.Tensor,
               rows: torch.Tensor | None = None) -> torch.Tensor:
        self._charge(self.decoder_calls, rows, x.shape[0])
        return self.net.decode(x, prompt_mask, reg, w)
