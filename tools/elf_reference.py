"""Reference files made by ELF's own code, for elfreg's parity checks (docs/elf.md).

Runs the network and sampler of an ELF checkout (github lillian039/ELF, branch ``pytorch_elf``;
its ``src/`` is put on ``sys.path``: it is read from there, never copied) on a small model with
random weights, and writes into ``--out``:

- ``checkpoint_<step>``: ELF's checkpoint format (a ``torch.save`` payload: ``params``,
  ``ema_params1``, ``opt_state``, ``lr_scheduler``, ``step``, ``epoch``, ``dropout_rng``,
  ``grad_accum_buffers``). Every weight is random (ELF zero-initialises its output layer, which
  would make a parity check that cannot fail); the EMA differs from the weights.
- ``train.yml``: an ELF training YAML for it. Its ``model:`` names ELF-B, which the tiny sizes do
  not fit: the importer must read sizes from the tensors.
- ``parity_params.safetensors`` / ``parity_ema.safetensors``: cases of ``ELF.forward`` in fp32
  with each set of weights (the format of :mod:`elfreg.interop.elf_parity`): ``"{i}.x"``
  (B, S, 2C; one case of width C), ``"{i}.t"``, ``"{i}.self_cond_cfg_scale"``, optional
  ``"{i}.attention_mask"`` and ``"{i}.decoder_step_active"``, and ELF's ``"{i}.output"`` and
  ``"{i}.decoder_logits"`` (when the gate is given).
- ``sampler.safetensors``: ELF's sampling loop (``_generate_samples_single_batch`` with the ODE
  step, then ``_dlm_decode_batch``) on the ``params`` weights, every model call recorded:
  ``"call{k}.x"``, ``"call{k}.t"``, ``"call{k}.self_cond_cfg_scale"``, ``"call{k}.output"`` (and
  ``"call{k}.decoder_logits"`` for the decode call), with ``"z0"``, ``"t_steps"`` (ELF's
  logit-normal grid), ``"cond_seq"``, ``"cond_seq_mask"``, ``"final_latent"``, ``"decoded_ids"``.
  With ``--conditional`` a second trace at prompt CFG 2 has every key prefixed ``cfg2.``.
  Metadata: ``cfg_scale``, ``self_cond_cfg_scale``, ``steps``, ``seed``, ``conditional``.
- ``sampler_sde.safetensors``: ELF's loop with its SDE step (``sampling_method: sde``), two traces
  of the same keys prefixed ``0.`` (γ 1.5) and ``1.`` (γ 1.0; prompt CFG 2 with
  ``--conditional``), each from its own grid and noise seeds, plus ``"{i}.sde_noise"``
  (K − 2, B, S, C): the noise σ·ε that ELF's SDE step drew at each of its steps, in its order
  (replayed from the generator's state; the script checks that it accounts for every draw).
  Metadata: ``"{i}.method"``, ``"{i}.gamma"``, ``"{i}.cfg_scale"``, ``"{i}.grid_seed"``,
  ``"{i}.noise_seed"`` and the common keys.

ELF's code needs ``einops`` (``pip install einops``; elfreg does not). Usage::

    python tools/elf_reference.py --elf ../ELF --out /tmp/elf-ref [--seed 0] [--depth 2] [--width 32]
        [--heads 4] [--enc-dim 16] [--vocab 40] [--bottleneck 8] [--time-tokens 4] [--cfg-tokens 4]
        [--mode-tokens 4] [--max-length 12] [--batch 3] [--sampler-steps 5] [--conditional]
        [--self-cond-prob 0.5]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
import yaml
from safetensors.torch import save_file

STEP = 1000


def load_elf(checkout: Path) -> SimpleNamespace:
    """ELF's model class and sampling functions, imported from the checkout."""
    src = checkout / "src"
    if not (src / "modules" / "model.py").is_file():
        raise SystemExit(f"{checkout} is not an ELF checkout (no src/modules/model.py)")
    sys.path.insert(0, str(src))
    try:
        from modules.model import ELF
        from utils.generation_utils import _dlm_decode_batch, _generate_samples_single_batch
        from utils.sampling_utils import get_sampling_steps
    except ImportError as err:
        raise SystemExit(f"cannot import ELF's code ({err}); ELF needs einops: pip install einops") from err
    return SimpleNamespace(ELF=ELF, generate=_generate_samples_single_batch, decode=_dlm_decode_batch,
                           sampling_steps=get_sampling_steps)


def elf_commit(checkout: Path) -> str:
    """The checkout's git commit, or "unknown" (an extracted archive has none)."""
    try:
        out = subprocess.run(["git", "-C", str(checkout), "rev-parse", "HEAD"], capture_output=True, text=True,
                             check=True)
        return out.stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def randomize(model: torch.nn.Module, generator: torch.Generator) -> None:
    """Every weight random and O(1)-preserving: matrices ~ N(0, 1/fan_in), biases and learned
    tokens ~ N(0, 0.1²), norm weights ~ 1 + N(0, 0.1²)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=generator)
            if "norm" in name:
                p.copy_(1 + 0.1 * noise)
            elif p.dim() == 2:
                fan_in = p.shape[0] if name in ("proj_kernel", "unembed_kernel") else p.shape[1]
                p.copy_(noise / fan_in ** 0.5)
            else:
                p.copy_(0.1 * noise)


def training_yaml(args: argparse.Namespace) -> dict[str, Any]:
    elf = {
        "data_path": "reference/tiny", "max_length": args.max_length, "encoder_model_name": "t5-small",
        "latent_mean": 0.0, "latent_std": 0.2, "model": "ELF-B", "bottleneck_dim": args.bottleneck,
        "num_time_tokens": args.time_tokens, "num_self_cond_cfg_tokens": args.cfg_tokens,
        "num_model_mode_tokens": args.mode_tokens, "denoiser_p_mean": -1.5, "denoiser_p_std": 0.8,
        "denoiser_noise_scale": 2.0, "t_eps": 0.05, "time_schedule": "logit_normal", "decoder_prob": 0.2,
        "decoder_noise_scale": 1.0, "decoder_p_mean": 0.8, "decoder_p_std": 0.8, "self_cond_prob": args.self_cond_prob,
        "self_cond_cfg_min": 0.5, "self_cond_cfg_max": 5.0, "optimizer": "muon", "blr": 0.001,
        "global_batch_size": 512, "warmup_steps": 5000, "weight_decay": 0.0, "ema_decay1": 0.9999,
        "seed": args.seed,
    }
    if args.conditional:
        elf.update(max_input_length=args.max_length // 2, pad_token="eos", label_drop_prob=0.1)
    return elf


def parity_cases(model: torch.nn.Module, args: argparse.Namespace, generator: torch.Generator
                 ) -> dict[str, torch.Tensor]:
    """``args.cases`` cases of ``ELF.forward`` (see the module docstring)."""
    b, s, c = args.batch, args.max_length, args.enc_dim
    out: dict[str, torch.Tensor] = {}
    for i in range(args.cases):
        width = c if i == 1 else 2 * c  # case 1 skips self_cond_proj, as a C-wide input does in ELF
        x = torch.randn((b, s, width), generator=generator)
        t = torch.rand((b,), generator=generator)
        t[0], t[-1] = (0.0, 1.0) if i == 0 else (t[0], t[-1])
        scale = 0.5 + 4.5 * torch.rand((b,), generator=generator)
        kwargs: dict[str, Any] = {"self_cond_cfg_scale": scale}
        if i % 2 == 0:
            mask = torch.ones((b, s))
            mask[:, s - 1 - i % 3:] = 0
            mask[0] = 1
            kwargs["attention_mask"] = mask
        if i != 1:
            gate = (torch.arange(b) % 2).float()
            kwargs["decoder_step_active"] = gate
        with torch.no_grad():
            output, logits = model(x, t, deterministic=True, **kwargs)
        out.update({f"{i}.x": x, f"{i}.t": t, f"{i}.output": output})
        out.update({f"{i}.{k}": v for k, v in kwargs.items()})
        if logits is not None:
            out[f"{i}.decoder_logits"] = logits
    return out


class Recorder(torch.nn.Module):
    """Forwards to ELF's model and records every call's inputs and outputs."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model
        self.calls: list[dict[str, torch.Tensor]] = []

    def forward(self, x, t, attention_mask=None, deterministic=True, self_cond_cfg_scale=None,
                decoder_step_active=None):
        output, logits = self.model(x, t, attention_mask=attention_mask, deterministic=deterministic,
                                    self_cond_cfg_scale=self_cond_cfg_scale, decoder_step_active=decoder_step_active)
        call = {"x": x.clone(), "t": t.clone(), "output": output.clone()}
        if self_cond_cfg_scale is not None:
            call["self_cond_cfg_scale"] = self_cond_cfg_scale.clone()
        if logits is not None:
            call["decoder_logits"] = logits.clone()
        self.calls.append(call)
        return output, logits

    def parameters(self, recurse: bool = True):
        return self.model.parameters(recurse)


def sampler_trace(elf: SimpleNamespace, model: torch.nn.Module, args: argparse.Namespace, cfg_scale: float,
                  generator: torch.Generator, grid_seed: int, method: str = "ode", gamma: float = 0.0
                  ) -> dict[str, torch.Tensor]:
    """ELF's sampling loop on one batch, every model call recorded (see the module docstring)."""
    b, s, c = 2, args.max_length, args.enc_dim
    torch.manual_seed(grid_seed)  # get_sampling_steps draws from the global generator
    t_steps = elf.sampling_steps(n_steps=args.sampler_steps, time_schedule="logit_normal", P_mean=-1.5, P_std=0.8)
    z0 = torch.randn((b, s, c), generator=generator) * 2.0
    cond_seq = torch.zeros((b, s, c))
    cond_mask = torch.zeros((b, s))
    if args.conditional:
        cond_seq = torch.randn((b, s, c), generator=generator)
        for row, length in enumerate((2, 3)):
            cond_mask[row, :length] = 1
    config = SimpleNamespace(t_eps=0.05, self_cond_prob=args.self_cond_prob, num_self_cond_cfg_tokens=args.cfg_tokens,
                             denoiser_noise_scale=2.0, use_bf16=False)
    sampling = SimpleNamespace(sampling_method=method, sde_gamma=gamma)
    recorder = Recorder(model)
    draws = torch.Generator()
    draws.set_state(generator.get_state())  # replays what ELF's SDE step draws from the generator
    with torch.no_grad():
        latent = elf.generate(model=recorder, generator=generator, z=z0, t_steps=t_steps,
                              cond_seq=cond_seq if args.conditional else None,
                              cond_seq_mask=cond_mask if args.conditional else None, config=config,
                              sampling_config=sampling, cfg_scale=cfg_scale, self_cond_cfg_scale=args.sc_cfg)
        ids = elf.decode(z=latent, model=recorder, t_final_val=t_steps[-1].item(), config=config,
                         self_cond_cfg_scale=args.sc_cfg)
    out = {"z0": z0, "t_steps": t_steps, "cond_seq": cond_seq, "cond_seq_mask": cond_mask,
           "final_latent": latent, "decoded_ids": ids.long()}
    if method == "sde":
        steps = t_steps.numel() - 2  # ELF's last step is an ODE step
        out["sde_noise"] = torch.stack([torch.randn(z0.shape, generator=draws) * 2.0 for _ in range(steps)])
    if not torch.equal(draws.get_state(), generator.get_state()):
        raise SystemExit("ELF's sampler drew noise the trace does not account for")
    for k, call in enumerate(recorder.calls):
        out.update({f"call{k}.{name}": value for name, value in call.items()})
    return out


def add_network_flags(p: argparse.ArgumentParser, checkout: str, **more: int) -> None:
    """``--elf`` (a checkout, ``checkout`` says of what), ``--out``, ``--seed`` and the small
    network's sizes, with ``more`` integer flags (``max_length=12`` is ``--max-length``)."""
    p.add_argument("--elf", type=Path, required=True, help=checkout)
    p.add_argument("--out", type=Path, required=True, help="the folder to write (created)")
    p.add_argument("--seed", type=int, default=0)
    for name, default in (("depth", 2), ("width", 32), ("heads", 4), ("enc-dim", 16), ("vocab", 40),
                          ("bottleneck", 8), ("time-tokens", 4), ("cfg-tokens", 4), ("mode-tokens", 4),
                          *((k.replace("_", "-"), v) for k, v in more.items())):
        p.add_argument(f"--{name}", type=int, default=default)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_network_flags(p, "an ELF checkout (holding src/modules/model.py)", max_length=12, batch=3, cases=3,
                      sampler_steps=5)
    p.add_argument("--sc-cfg", type=float, default=3.0, help="SC-CFG scale of the sampler trace")
    p.add_argument("--conditional", action="store_true", help="a conditional model: prompts in the trace")
    p.add_argument("--self-cond-prob", type=float, default=0.5,
                   help="ELF's self_cond_prob (0: a model trained and sampled without self-conditioning)")
    args = p.parse_args(argv)
    elf = load_elf(args.elf.resolve())
    torch.manual_seed(args.seed)
    model = elf.ELF(text_encoder_dim=args.enc_dim, max_length=args.max_length, hidden_size=args.width,
                    depth=args.depth, num_heads=args.heads, bottleneck_dim=args.bottleneck,
                    num_time_tokens=args.time_tokens, num_self_cond_cfg_tokens=args.cfg_tokens,
                    num_model_mode_tokens=args.mode_tokens, vocab_size=args.vocab).eval()
    generator = torch.Generator().manual_seed(args.seed)
    randomize(model, generator)
    params = {k: v.clone() for k, v in model.state_dict().items()}
    ema = {k: v.detach() + 0.05 * torch.randn(v.shape, generator=generator) for k, v in model.named_parameters()}
    args.out.mkdir(parents=True, exist_ok=True)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    torch.save({"params": params, "ema_params1": ema, "opt_state": optimizer.state_dict(), "lr_scheduler": None,
                "step": STEP, "epoch": 1, "dropout_rng": None, "grad_accum_buffers": {}},
               args.out / f"checkpoint_{STEP}")
    print(f"wrote {args.out / f'checkpoint_{STEP}'}")
    (args.out / "train.yml").write_text(yaml.safe_dump(training_yaml(args), sort_keys=False))
    print(f"wrote {args.out / 'train.yml'}")
    sizes = {k: str(getattr(args, k)) for k in ("depth", "width", "heads", "enc_dim", "vocab", "bottleneck",
                                                "time_tokens", "cfg_tokens", "mode_tokens", "max_length")}
    common = {"seed": str(args.seed), "elf_commit": elf_commit(args.elf), **sizes}
    for weights, state in (("params", params), ("ema", ema)):
        model.load_state_dict(state)
        path = args.out / f"parity_{weights}.safetensors"
        save_file(parity_cases(model, args, torch.Generator().manual_seed(args.seed + 2)), str(path),
                  metadata={"weights": weights, **common})
        print(f"wrote {path}")
    model.load_state_dict(params)
    trace = sampler_trace(elf, model, args, 1.0, torch.Generator().manual_seed(args.seed + 3), args.seed + 1)
    meta = {"cfg_scale": "1.0", "self_cond_cfg_scale": str(args.sc_cfg), "steps": str(args.sampler_steps),
            "conditional": str(args.conditional), **common}
    if args.conditional:
        guided = sampler_trace(elf, model, args, 2.0, torch.Generator().manual_seed(args.seed + 3), args.seed + 1)
        trace.update({f"cfg2.{k}": v for k, v in guided.items()})
        meta["cfg2.cfg_scale"] = "2.0"
    save_file({k: v.contiguous() for k, v in trace.items()}, str(args.out / "sampler.safetensors"), metadata=meta)
    print(f"wrote {args.out / 'sampler.safetensors'}")
    sde: dict[str, torch.Tensor] = {}
    sde_meta = {"self_cond_cfg_scale": str(args.sc_cfg), "steps": str(args.sampler_steps), **common}
    for i, (gamma, cfg_scale) in enumerate(((1.5, 1.0), (1.0, 2.0 if args.conditional else 1.0))):
        grid_seed, noise_seed = args.seed + 10 + i, args.seed + 20 + i
        one = sampler_trace(elf, model, args, cfg_scale, torch.Generator().manual_seed(noise_seed), grid_seed,
                            "sde", gamma)
        sde.update({f"{i}.{k}": v.contiguous() for k, v in one.items()})
        sde_meta.update({f"{i}.method": "sde", f"{i}.gamma": str(gamma), f"{i}.cfg_scale": str(cfg_scale),
                         f"{i}.grid_seed": str(grid_seed), f"{i}.noise_seed": str(noise_seed)})
    save_file(sde, str(args.out / "sampler_sde.safetensors"), metadata=sde_meta)
    print(f"wrote {args.out / 'sampler_sde.safetensors'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
