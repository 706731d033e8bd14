"""ELF checkpoints as elfreg checkpoints: ``elfreg import-elf`` (docs/elf.md).

ELF (arXiv 2605.10938; its PyTorch code, branch ``pytorch_elf``) saves a ``torch.save`` payload
per checkpoint, a file ``checkpoint_<step>`` holding ``params`` (the network's state dict) and
``ema_params1`` (its EMA, the same names) among the optimiser state. elfreg's student is ELF's
network (:mod:`elfreg.model.student`), so a checkpoint converts tensor for tensor:

- every size comes from the tensors (depth, width, heads from the q/k-norm size, the three prefix
  token counts, the bottleneck, the encoder width, the SwiGLU width, the vocabulary), never from
  the YAML's ``model:`` name, so models no ELF preset names import too;
- everything else (encoder, latent mean and std, canvas length, the prompt cap and ELF's
  truncation of a long prompt (its first tokens kept), the answer's ``gen_length``, objective and
  sampling settings) comes from ELF's training YAML, with ELF's own defaults for keys it leaves out;
- a progressively distilled checkpoint (branch ``distillation``: the same payload, a YAML with
  ``pd_step_size``) samples as ELF samples its distilled student at the YAML's N = 1/pd_step_size
  steps (``few_step_sampling``: ``elf-pd-few`` up to 8 steps, ``elf-pd-many`` beyond, N + 1 NFE),
  and ``meta.json`` records its distillation;
- state-dict names under ``torch.compile``'s ``_orig_mod.`` read as the module's own (ELF's
  distillation code strips it when it loads a checkpoint);
- q and k projections (and their norm weights) have each head's dimensions reordered from ELF's
  adjacent RoPE pairs (2i, 2i + 1) to elfreg's halves (i, i + head_dim/2): the same function;
- the decoder's ``(in, out)`` kernels become ``nn.Linear`` weights (transposed).

The result is an ordinary elfreg checkpoint folder (no teacher: ELF has none), which
``elfreg sample``, ``elfreg eval`` and ``train.init_from`` read.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
import yaml

from ..checkpoint import write_description, write_weights
from ..config import SAMPLING_PRESETS, Config, apply_config_overrides, few_step_sampling
from ..folders import written_whole
from ..model.presets import student_from_config
from ..model.student import STUDENT_FORMAT, Student
from ..provenance import file_sha256

Weights = Literal["params", "ema"]
PAYLOAD_KEYS = {"params": "params", "ema": "ema_params1"}
_STEP = re.compile(r"checkpoint_(\d+)$")

# ELF's Config defaults (src/configs/config.py) for the keys the conversion reads.
ELF_DEFAULTS: dict[str, Any] = {
    "encoder_model_name": "t5-small", "tokenizer_name": None, "latent_mean": 0.0, "latent_std": 1.0,
    "max_length": 128, "max_input_length": None, "pad_token": "pad", "denoiser_p_mean": 0.8,
    "denoiser_p_std": 0.8, "denoiser_noise_scale": 1.0, "t_eps": 0.05, "decoder_prob": 0.5,
    "decoder_noise_scale": 1.0, "decoder_p_mean": 0.8, "decoder_p_std": 0.8, "label_drop_prob": 0.0,
    "self_cond_prob": 0.5, "self_cond_cfg_min": 0.5, "self_cond_cfg_max": 5.0, "proj_dropout": 0.0,
    "global_batch_size": 512, "lr": None, "blr": 5e-5, "warmup_steps": 5000, "lr_schedule": "constant",
    "weight_decay": 0.0, "optimizer": "muon", "ema_decay1": 0.9999, "seed": 0, "time_schedule": "logit_normal",
    "pd_step_size": 0.0, "pd_teacher_steps": 1, "teacher_path": None,
}
COMPILED = "_orig_mod."  # torch.compile's prefix of a compiled module's state-dict names


class ElfImportError(ValueError):
    """An ELF checkpoint or training YAML that cannot be converted; the message names it."""


def find_elf_checkpoint(source: str | Path, revision: str | None = None) -> Path:
    """The checkpoint file of ``source``: a ``checkpoint_<step>`` file itself, the newest such file
    of a folder, or of a Hugging Face Hub repo (downloaded with ``huggingface_hub``)."""
    path = Path(source).expanduser()
    if path.is_file():
        return path
    if not path.exists():
        if str(source).startswith((".", "/", "~")) or str(source).count("/") != 1:
            raise FileNotFoundError(f"no ELF checkpoint at {source} (a file, a folder, or a Hub repo id org/name)")
        from huggingface_hub import snapshot_download

        path = Path(snapshot_download(repo_id=str(source), revision=revision))
    found = sorted((int(m.group(1)), p) for p in path.rglob("checkpoint_*")
                   if p.is_file() and (m := _STEP.search(p.name)))
    if not found:
        raise ElfImportError(f"{source} holds no ELF checkpoint file (checkpoint_<step>)")
    return found[-1][1]


def load_elf_payload(file: Path) -> dict[str, Any]:
    """ELF's ``torch.save`` payload, read without running pickled code (``weights_only``)."""
    try:
        payload = torch.load(file, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - torch.load raises many kinds for a bad file
        first = (str(err).strip().splitlines() or [""])[0]
        raise ElfImportError(f"cannot read ELF checkpoint {file}: not a torch.save payload "
                             f"({type(err).__name__}: {first})") from err
    if not isinstance(payload, dict) or "params" not in payload:
        raise ElfImportError(f"{file} is not an ELF checkpoint (no 'params' state dict)")
    for key in PAYLOAD_KEYS.values():
        tensors = payload.get(key)
        if tensors is not None and not (isinstance(tensors, dict)
                                        and all(isinstance(v, torch.Tensor) for v in tensors.values())):
            raise ElfImportError(f"{file} is not an ELF checkpoint ({key!r} is not a state dict of tensors)")
        if tensors is not None:
            payload[key] = {k.removeprefix(COMPILED): v for k, v in tensors.items()}
    return payload


@dataclass(frozen=True)
class ElfSizes:
    """The network's sizes, read from its tensors."""

    depth: int
    width: int
    heads: int
    mlp_hidden: int
    bottleneck: int
    enc_dim: int
    vocab: int
    time_tokens: int
    cfg_tokens: int
    mode_tokens: int
    freq_dim: int


def elf_sizes(params: dict[str, torch.Tensor]) -> ElfSizes:
    """:class:`ElfSizes` of an ELF state dict (``ElfImportError`` naming a missing tensor)."""
    def shape(name: str) -> tuple[int, ...]:
        if name not in params:
            raise ElfImportError(f"not an ELF network: no tensor {name!r}")
        return tuple(params[name].shape)

    depth = 1 + max((int(m.group(1)) for k in params if (m := re.match(r"blocks\.(\d+)\.", k))), default=-1)
    if depth < 1:
        raise ElfImportError("not an ELF network: no blocks.<i>.* tensors")
    width = shape("blocks.0.attn.qkv.weight")[1]
    head_dim = shape("blocks.0.attn.q_norm.weight")[0]
    cfg_tokens = shape("self_cond_cfg_tokens")[1] if "self_cond_cfg_tokens" in params else 0
    mode_tokens = shape("mode_tokens")[1] if "mode_tokens" in params else 0
    return ElfSizes(depth=depth, width=width, heads=width // head_dim, mlp_hidden=shape("blocks.0.mlp.w3.weight")[1],
                    bottleneck=shape("text_proj.proj1.weight")[0], enc_dim=shape("self_cond_proj.weight")[0],
                    vocab=shape("unembed_kernel")[1], time_tokens=shape("t_emb_tokens")[1], cfg_tokens=cfg_tokens,
                    mode_tokens=mode_tokens, freq_dim=shape("t_embedder.mlp_0.weight")[1])


def rope_halves(head_dim: int) -> torch.Tensor:
    """The order that takes a head's dimensions from ELF's RoPE pairs (2i, 2i + 1) to elfreg's
    halves (i, i + head_dim/2): new i ← old 2i, new i + head_dim/2 ← old 2i + 1."""
    return torch.cat([torch.arange(0, head_dim, 2), torch.arange(1, head_dim, 2)])


def _qk_reordered(tensor: torch.Tensor, width: int, heads: int) -> torch.Tensor:
    """A qkv weight (3H, H) or bias (3H,) with the q and k rows of every head reordered."""
    head_dim = width // heads
    order = torch.arange(3 * width).reshape(3, heads, head_dim)
    order[:2] = order[:2][..., rope_halves(head_dim)]
    return tensor[order.reshape(-1)]


# ELF's names → elfreg's: fragments renamed in place (regular expressions), and whole tensors that
# become another module's (the decoder's kernels are transposed on the way)
RENAMES = [
    (r"text_proj\.proj1\.", "text_down."), (r"text_proj\.proj2\.", "text_up."),
    (r"t_embedder\.mlp_0\.", "prefix.time_embedder.mlp_in."),
    (r"t_embedder\.mlp_2\.", "prefix.time_embedder.mlp_out."),
    (r"self_cond_cfg_embedder\.mlp_0\.", "prefix.cfg_embedder.mlp_in."),
    (r"self_cond_cfg_embedder\.mlp_2\.", "prefix.cfg_embedder.mlp_out."),
    (r"^t_emb_tokens$", "prefix.time_tokens"), (r"^self_cond_cfg_tokens$", "prefix.cfg_tokens"),
    (r"^mode_tokens$", "prefix.mode_tokens"), (r"\.norm1\.", ".attn_norm."), (r"\.norm2\.", ".mlp_norm."),
    (r"\.mlp\.w12\.", ".mlp.gate_up."), (r"\.mlp\.w3\.", ".mlp.down."),
    (r"final_layer\.norm_final\.", "final_layer.norm."),
]
MOVED = {"proj_kernel": "dec_proj.weight", "proj_bias": "dec_proj.bias", "unembed_kernel": "vocab_head.weight",
         "unembed_bias": "vocab_head.bias"}
TRANSPOSED = {"proj_kernel", "unembed_kernel"}


def elf_name(name: str) -> str:
    """The ELF name of elfreg's tensor ``name`` (the inverse of the renaming, for messages)."""
    moved = {ours: elf for elf, ours in MOVED.items()}
    if name in moved:
        return moved[name]
    for pattern, ours in reversed(RENAMES):
        anchored = pattern.startswith("^")
        name = re.sub(f"^{re.escape(ours)}$" if anchored else re.escape(ours), pattern.strip("^$").replace("\\", ""),
                      name)
    return name


def to_elfreg_state(params: dict[str, torch.Tensor], sizes: ElfSizes) -> dict[str, torch.Tensor]:
    """ELF's tensors under elfreg's names and layouts (see the module docstring)."""
    head_dim = sizes.width // sizes.heads
    out = {}
    for name, value in params.items():
        value = value.detach().float().contiguous()
        if name in MOVED:
            out[MOVED[name]] = value.T.contiguous() if name in TRANSPOSED else value
            continue
        qkv, qk_norm = name.endswith(("attn.qkv.weight", "attn.qkv.bias")), name.endswith(("attn.q_norm.weight",
                                                                                           "attn.k_norm.weight"))
        rows = 3 * sizes.width if qkv else head_dim
        if (qkv or qk_norm) and (value.ndim == 0 or value.shape[0] != rows):
            raise ElfImportError(f"{name}: ELF's tensor has shape {tuple(value.shape)}, where an ELF network of "
                                 f"width {sizes.width} and {sizes.heads} heads has {rows} rows")
        if qkv:
            value = _qk_reordered(value, sizes.width, sizes.heads)
        elif qk_norm:
            value = value[rope_halves(head_dim)]
        for pattern, new in RENAMES:
            name = re.sub(pattern, new, name)
        out[name] = value.contiguous()
    return out


NUMERIC_WITHOUT_DEFAULT = {"max_input_length", "lr"}


def _elf_setting(elf: dict[str, Any], key: str) -> Any:
    """``key`` of ELF's training YAML, or ELF's default; a number where ELF reads one (YAML may
    write 5e-5 as text), else an :class:`ElfImportError` naming the key."""
    value = elf[key] if elf.get(key) is not None else ELF_DEFAULTS[key]
    default = ELF_DEFAULTS[key]
    if value is None or not (key in NUMERIC_WITHOUT_DEFAULT or isinstance(default, int | float)):
        return value
    try:
        if isinstance(value, bool):
            raise ValueError(value)
        return float(value)
    except (TypeError, ValueError):
        raise ElfImportError(f"ELF training YAML: {key} must be a number, got {value!r}") from None


def elfreg_config(sizes: ElfSizes, elf: dict[str, Any], overrides: list[str] | None = None) -> Config:
    """The elfreg config of an ELF model: sizes from the tensors, the rest from ELF's training YAML
    (``elf``, a mapping; ELF's defaults for absent keys), then ``key=value`` overrides."""
    get = lambda key: _elf_setting(elf, key)  # noqa: E731
    max_length = int(get("max_length"))
    conditional = get("max_input_length") is not None
    lr = get("lr") if get("lr") and get("lr") > 0 else get("blr") * get("global_batch_size") / 256
    data = {
        "text": {"encoder": get("encoder_model_name"), "tokenizer": get("tokenizer_name"), "encoder_layer": -1,
                 "standardize": "global", "latent_mean": float(get("latent_mean")),
                 "latent_std": float(get("latent_std")), "teacher": None, "canvas_len": max_length,
                 "prompt_cap": int(get("max_input_length")) if conditional else max_length - 1,
                 # ELF keeps a long prompt's first max_input_length tokens and reads gen_length =
                 # max_length - max_input_length answer tokens
                 "prompt_truncation": "right",
                 "answer_cap": max_length - int(get("max_input_length")) if conditional else 0},
        "model": {"width": sizes.width, "depth": sizes.depth, "heads": sizes.heads, "mlp_hidden": sizes.mlp_hidden,
                  "vocab_size": sizes.vocab,
                  "bottleneck": sizes.bottleneck, "time_tokens": sizes.time_tokens, "cfg_tokens": sizes.cfg_tokens,
                  "mode_tokens": sizes.mode_tokens, "time_freq_dim": sizes.freq_dim, "bias": True,
                  "dropout": float(get("proj_dropout")), "repa_block": 1, "repa": False, "extra_token": "none"},
        "flow": {"sigma": float(get("denoiser_noise_scale")), "c_min": float(get("t_eps")),
                 "t_logit_mean": float(get("denoiser_p_mean")), "t_logit_std": float(get("denoiser_p_std")),
                 "sc_prob": float(get("self_cond_prob")), "w_min": float(get("self_cond_cfg_min")),
                 "w_max": float(get("self_cond_cfg_max")), "decode_prob": float(get("decoder_prob")),
                 "decode_lambda_mean": float(get("decoder_p_mean")), "decode_lambda_std": float(get("decoder_p_std")),
                 "decode_noise_scale": float(get("decoder_noise_scale")),
                 "prompt_drop": float(get("label_drop_prob"))},
        "train": {"optimizer": "muon" if get("optimizer") == "muon" else "adamw", "lr": float(lr),
                  "batch_size": int(get("global_batch_size")), "warmup_steps": max(0, int(get("warmup_steps"))),
                  "schedule": "cosine" if get("lr_schedule") == "cosine" else "constant",
                  "weight_decay": float(get("weight_decay")), "ema_decay": float(get("ema_decay1")),
                  "seed": int(get("seed"))},
        "sample": {**elf_sampling(elf, conditional),
                   "full_span_grid": "uniform" if get("time_schedule") == "uniform" else "logit-normal"},
    }
    apply_config_overrides(data, overrides)
    return Config.from_dict(data)


def distilled_steps(elf: dict[str, Any]) -> int | None:
    """The student steps N of a progressively distilled model's YAML (its ``pd_step_size`` 1/N),
    or None for a model that was not distilled."""
    span = _elf_setting(elf, "pd_step_size")
    if span <= 0:
        return None
    if span > 1:
        raise ElfImportError(f"ELF training YAML: pd_step_size must be in (0, 1] (1/N of an N-step student), "
                             f"got {span}")
    return max(1, round(1 / span))


def elf_sampling(elf: dict[str, Any], conditional: bool) -> dict[str, Any]:
    """How ELF samples the model of a training YAML: its distilled student's few-step setting at
    its steps, its conditional setting, or its unconditional 64-step one."""
    steps = distilled_steps(elf)
    if steps is not None:
        return few_step_sampling(steps)
    return SAMPLING_PRESETS["elf-cond" if conditional else "elf-uncond-64"]


def read_elf_yaml(path: str | Path) -> dict[str, Any]:
    """ELF's training YAML as a mapping (one-line errors for a missing or malformed file)."""
    try:
        loaded = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as err:
        raise ElfImportError(f"{path}: not valid YAML ({str(err).splitlines()[0]})") from err
    if not isinstance(loaded, dict):
        raise ElfImportError(f"{path}: an ELF training YAML is a mapping of settings")
    return loaded


def imported_student(payload: dict[str, Any], weights: Weights, cfg: Config, sizes: ElfSizes) -> Student:
    """The elfreg student holding ``weights`` (params or EMA) of an ELF payload, in eval mode."""
    if weights not in PAYLOAD_KEYS:
        raise ElfImportError(f"--weights must be params or ema, not {weights!r}")
    key = PAYLOAD_KEYS[weights]
    tensors = payload.get(key)
    if not isinstance(tensors, dict) or not tensors:
        other = next(w for w in PAYLOAD_KEYS if w != weights)
        raise ElfImportError(f"the checkpoint has no {key!r} weights (--weights {other} imports its {other})")
    student = student_from_config(cfg, sizes.enc_dim, sizes.vocab, None)
    state = to_elfreg_state(tensors, sizes)
    expected = student.state_dict()
    missing, extra = sorted(set(expected) - set(state)), sorted(set(state) - set(expected))
    if missing:
        raise ElfImportError(f"the checkpoint's {key!r} lack {', '.join(elf_name(n) for n in missing[:3])}"
                             f"{' …' if len(missing) > 3 else ''}, which an ELF network of its sizes has")
    if extra:
        raise ElfImportError(f"the checkpoint's {key!r} hold {', '.join(elf_name(n) for n in extra[:3])}"
                             f"{' …' if len(extra) > 3 else ''}, which an ELF network of its sizes has no place for")
    for name, value in state.items():
        want = tuple(expected[name].shape)
        if value.shape != want:
            original = elf_name(name)
            shape = (tuple(value.shape), want) if original not in TRANSPOSED else (tuple(value.T.shape), want[::-1])
            raise ElfImportError(f"{original}: ELF's tensor has shape {shape[0]}, where an ELF network of the "
                                 f"checkpoint's sizes has {shape[1]}")
    student.load_state_dict(state)
    return student.eval()



def import_elf(checkpoint: str | Path, elf_config: str | Path, out: str | Path, weights: Weights = "ema",
               overrides: list[str] | None = None, revision: str | None = None) -> tuple[Path, Student]:
    """Convert an ELF checkpoint into the elfreg checkpoint folder ``out`` (which must not exist):
    ``weights`` (``params`` or ``ema``) become both its weights and its EMA, so sampling (EMA by
    default) and ``train.init_from`` (weights) read the same ones. Written whole or not at all
    (:func:`elfreg.folders.written_whole`). Returns the folder and the imported student."""
    out = Path(out)
    if out.exists():
        raise FileExistsError(f"{out} already exists; choose a new --out")
    file = find_elf_checkpoint(checkpoint, revision)
    payload = load_elf_payload(file)
    sizes = elf_sizes(payload["params"])
    elf = read_elf_yaml(elf_config)
    cfg = elfreg_config(sizes, elf, overrides)
    student = imported_student(payload, weights, cfg, sizes)
    step = int(payload.get("step") or 0)
    source = {"format": "ELF (pytorch_elf)", "checkpoint": str(checkpoint), "file": file.name,
              "sha256": file_sha256(file), "weights": weights, "epoch": payload.get("epoch"),
              "elf_config": str(elf_config), "revision": revision}
    steps = distilled_steps(elf)
    if steps is not None:
        source.update(format="ELF (distillation)", distilled={
            "student_steps": steps, "teacher_steps": int(_elf_setting(elf, "pd_teacher_steps")),
            "teacher": _elf_setting(elf, "teacher_path")})
    meta = {"student_format": STUDENT_FORMAT, "step": step, "enc_dim": sizes.enc_dim, "vocab_size": sizes.vocab,
            "teacher_dim": None, "imported_from": source}
    with written_whole(out) as tmp:
        state = student.state_dict()
        write_weights(tmp, state, state, {"optimizer": None})
        write_description(tmp, cfg, meta)
    return out, student
