"""ELF's sampling loop replayed through elfreg's (``elfreg import-elf --check``, docs/elf.md).

A trace file (``tools/elf_reference.py`` writes them by running ELF's own sampler) records one
batch of ELF's loop, ``_generate_samples_single_batch`` then ``_dlm_decode_batch``, with the ODE
(Euler) step or ELF's SDE step. Its keys, each under a prefix when a file holds several traces
(``""`` and ``"cfg2."`` in ``sampler.safetensors``, ``"0."`` and ``"1."`` in
``sampler_sde.safetensors``):

- ``z0`` (B, S, C): ELF's initial noise σ·ε; ``t_steps`` (K,): its grid; ``cond_seq`` (B, S, C)
  and ``cond_seq_mask`` (B, S): the prompt states and positions (zeros without a prompt);
- ``call{k}.x`` (B, S, 2C), ``call{k}.t``, ``call{k}.self_cond_cfg_scale``, ``call{k}.output``:
  every model call's input [z ; x̂_prev], time and output, the decode call's
  ``call{k}.decoder_logits`` too;
- ``final_latent`` (B, S, C) and ``decoded_ids`` (B, S): what the loop ends in;
- with the SDE step, ``sde_noise`` (K − 2, B, S, C): the σ·ε each stepped-back step drew, in
  ELF's order.

Metadata: ``cfg_scale`` (prompt CFG), ``self_cond_cfg_scale``, and per trace ``method`` (ode or
sde) and ``gamma``, each possibly under the trace's prefix.

:func:`replay_trace` runs elfreg's own loop (:func:`~elfreg.sampling.samplers.follow_path`, the
full-span sampler or the SDE sampler) from the same initial noise and grid, hands the SDE step
ELF's noise (:class:`GivenNoise`) and compares, call by call, the network input [y ; q] and time
elfreg gives the student with ELF's, then the final state and the decoded tokens. A trace passes
when every difference is within 1e-4 × max(1, max |reference|) (the tolerance of
:mod:`elfreg.interop.elf_parity`) and the tokens are equal.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open

from ..config import FlowConfig, SampleConfig
from ..model.student import Student
from ..sampling.network import CountingNetwork, StudentNetwork
from ..sampling.samplers import BatchContext, SamplerState, decode_rows, follow_path, sampler_spec
from .elf_parity import RELATIVE_TOLERANCE, read_tensor_file


def is_trace_file(path: str | Path) -> bool:
    """Whether a safetensors file holds sampler traces (a ``z0`` key) rather than parity cases."""
    try:
        with safe_open(str(path), "pt") as f:
            return any(key == "z0" or key.endswith(".z0") for key in f.keys())
    except Exception:  # noqa: BLE001 - an unreadable file: the parity reader says why in one line
        return False


def read_traces(path: str | Path) -> dict[str, tuple[dict[str, torch.Tensor], dict[str, str]]]:
    """Every trace of a file by prefix: its tensors and metadata under their unprefixed names."""
    tensors, meta = read_tensor_file(path, "trace file")
    prefixes = sorted(key[:-2] for key in tensors if key == "z0" or key.endswith(".z0"))
    if not prefixes:
        raise ValueError(f"{path} holds no sampler trace (no 'z0' key)")
    traces = {}
    for prefix in prefixes:
        mine = {k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)}
        # the shared metadata, then this trace's own
        settings = {k: v for k, v in meta.items() if "." not in k}
        settings.update({k[len(prefix):]: v for k, v in meta.items() if prefix and k.startswith(prefix)})
        missing = [k for k in ("z0", "t_steps", "cond_seq", "cond_seq_mask", "final_latent", "decoded_ids")
                   if k not in mine]
        if missing:
            raise ValueError(f"{path}: trace {prefix or '(unprefixed)'} lacks {', '.join(missing)}")
        traces[prefix] = (mine, settings)
    return traces


class GivenNoise:
    """The noise source of a replay: ELF's recorded draws σ·ε (K − 2, B, S, C), handed out one
    step at a time in ELF's order, divided by σ (elfreg's steps multiply by σ)."""

    def __init__(self, draws: torch.Tensor, sigma: float):
        self.draws, self.sigma, self.used = draws.float(), sigma, 0

    def normal(self, rows: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
        if self.used >= self.draws.shape[0]:
            raise ValueError(f"the replay asked for more noise than ELF drew ({self.draws.shape[0]} steps)")
        step = self.draws[self.used][rows.cpu()]
        if tuple(step.shape[1:]) != tuple(shape):
            raise ValueError(f"the replay asked for noise of shape {shape}, ELF drew {tuple(step.shape[1:])}")
        self.used += 1
        return step / self.sigma


class _Recording:
    """A network that logs every denoiser call's inputs (what the student was given)."""

    def __init__(self, net: StudentNetwork):
        self.net, self.reg_dim, self.calls = net, net.reg_dim, []
        self.guides_self_conditioning = net.guides_self_conditioning

    def denoise(self, z, q, t, w, prompt_mask, reg, reg_q):
        self.calls.append((z.clone(), q.clone(), t.clone()))
        return self.net.denoise(z, q, t, w, prompt_mask, reg, reg_q)

    def decode(self, x, prompt_mask, reg, w):
        return self.net.decode(x, prompt_mask, reg, w)


@dataclass
class TraceResult:
    """One trace: how many of ELF's denoiser calls it matched, the largest difference of the network
    inputs and times over them, of the final state, and whether the decoded tokens are ELF's."""

    name: str
    calls: int
    differences: dict[str, float]
    limit: float
    tokens_equal: bool

    @property
    def ok(self) -> bool:
        return self.tokens_equal and all(d <= self.limit for d in self.differences.values())

    def line(self) -> str:
        parts = ", ".join(f"{k} max|diff| {v:.2e}" for k, v in self.differences.items())
        return (f"trace {self.name}: {self.calls} denoiser calls, {parts} (limit {self.limit:.1e}), tokens "
                f"{'equal' if self.tokens_equal else 'DIFFER'}: {'ok' if self.ok else 'FAILED'}")


@torch.no_grad()
def replay_trace(student: Student, flow: FlowConfig, trace: dict[str, torch.Tensor], settings: dict[str, str],
                 name: str = "") -> TraceResult:
    """ELF's traced loop run through elfreg's (see the module docstring), in fp32 on the CPU."""
    student = student.float().cpu().eval()
    z0, grid = trace["z0"].float(), trace["t_steps"].double()
    cond, cond_mask = trace["cond_seq"].float(), trace["cond_seq_mask"] > 0
    b, name = z0.shape[0], name or "(unprefixed)"
    if z0.shape[-1] != student.enc_dim:
        raise ValueError(f"trace {name}: states of width {z0.shape[-1]}, this model's encoder "
                         f"width is {student.enc_dim} (a trace of another model)")
    method = settings.get("method", "ode")
    if method not in ("ode", "sde"):
        raise ValueError(f"trace {name}: unknown sampling method {method!r}")
    prompt_cfg = float(settings.get("cfg_scale", 1.0))
    w = float(settings.get("self_cond_cfg_scale", 1.0))
    sample = SampleConfig(sampler="sde" if method == "sde" else "full-span", nfe=grid.numel(), sc_cfg=w,
                          prompt_cfg=prompt_cfg, sde_gamma=float(settings.get("gamma", 0.0)))
    noise = GivenNoise(trace["sde_noise"], flow.sigma) if method == "sde" else None
    recording = _Recording(StudentNetwork(student))
    ctx = BatchContext(CountingNetwork(recording, b), sample, flow, cond, cond_mask, noise, torch.full((b,), w),
                       None)
    path = SamplerState(torch.where(cond_mask[..., None], cond, z0),
                        None, torch.where(cond_mask[..., None], cond, torch.zeros_like(z0)), None,
                        torch.zeros(b, dtype=torch.long))
    spec = sampler_spec(sample)
    follow_path(ctx, path, grid.expand(b, -1), spec.move, back_step=spec.back_step)
    ids = decode_rows(ctx, path.y, None, None, None)

    # each of elfreg's forwards holds ELF's calls of one step as row groups, in ELF's order
    # (:func:`~elfreg.sampling.steps.predict`), then ELF's decode call
    groups = [(z[g * b:(g + 1) * b], q[g * b:(g + 1) * b], t[g * b:(g + 1) * b])
              for z, q, t in recording.calls for g in range(z.shape[0] // b)]
    elf_calls = sum(1 for k in trace if k.startswith("call") and k.endswith(".x"))
    if elf_calls != len(groups) + 1:
        raise ValueError(f"trace {name}: ELF made {elf_calls} calls, elfreg {len(groups) + 1}")
    inputs = times = 0.0
    for k, (z, q, t) in enumerate(groups):
        x = trace[f"call{k}.x"].float()
        mine = z if x.shape[-1] == z.shape[-1] else torch.cat([z, q], dim=-1)
        inputs = max(inputs, float((mine - x).abs().max()))
        times = max(times, float((t.float() - trace[f"call{k}.t"].float()).abs().max()))
    final = float((path.y - trace["final_latent"].float()).abs().max())
    scale = max(1.0, float(trace["final_latent"].abs().max()),
                *(float(trace[k].abs().max()) for k in trace if k.startswith("call") and k.endswith(".x")))
    answer = ~cond_mask
    return TraceResult(name, len(groups),
                       {"inputs": inputs, "times": times, "final_state": final}, RELATIVE_TOLERANCE * scale,
                       bool(torch.equal(ids[answer], trace["decoded_ids"][answer])))


def check_traces(student: Student, flow: FlowConfig, path: str | Path) -> list[TraceResult]:
    """Every trace of a trace file replayed through ``student`` (:func:`replay_trace`)."""
    return [replay_trace(student, flow, trace, settings, prefix.rstrip("."))
            for prefix, (trace, settings) in read_traces(path).items()]
