"""Reference files made by ELF's progressive distillation, for elfreg's parity checks (docs/distillation.md).

Runs ``distill_train_step`` of an ELF checkout of the branch ``distillation`` (github
lillian039/ELF; its ``src/`` is put on ``sys.path``: it is read from there, never copied) on a
small teacher with random weights and a student near it, and writes into ``--out``:

- ``train.yml``: an ELF training YAML of the teacher's settings (the importer reads it);
- ``distill.yml``: the distillation YAML the cases ran with, read by ELF's own
  ``load_config_from_yaml`` (each case overrides ``pd_step_size`` and ``pd_teacher_steps``);
- ``parity.safetensors``: the teacher's and the student's weights under ELF's names
  (``teacher.{name}``, ``student.{name}``) and, per case ``i`` (one batch at one seed, one call of
  ``distill_train_step``), what ELF's step computed: ``"{i}.x0"`` (B, S, C) the clean states,
  ``"{i}.cond_seq_mask"`` and ``"{i}.input_ids"`` (B, S), ``"{i}.decoder_mask"``, ``"{i}.t_s"``,
  ``"{i}.t_t"``, ``"{i}.w"`` (B,), ``"{i}.z_t_s"`` (B, S, C), ``"{i}.sc_half"`` (B, S, C) the
  self-conditioning input of the teacher's first step and of the student, ``"{i}.sub_step_times"``
  (B, K + 1) (absent for K = 1), ``"{i}.target"`` (B, S, C) the teacher's PD target, the student's
  ``"{i}.student_input"`` (B, S, 2C), and its ``"{i}.loss"``, ``"{i}.ce_loss"``, ``"{i}.l2_loss"``.
  Metadata: ``"{i}.pd_step_size"``, ``"{i}.pd_teacher_steps"``, ``"{i}.seed"``, ``cases``, the
  sizes and ``elf_commit``;
- with ``--pd-checkpoint STEPS``: ``pd/checkpoint_<STEPS>`` and ``pd/config.yml``, what ELF's
  ``save_checkpoint`` and ``train.py`` write after STEPS distillation steps of the student with
  AdamW (a progressively distilled checkpoint and its YAML, the importer's input, the first
  case's round), and ``pd/parity_ema.safetensors``: cases of ``ELF.forward`` with its EMA weights
  (the format of ``tools/elf_reference.py``'s parity files).

Each case is the first of its seeds (``--seed`` + 100 + i, then every 1000th after) whose batch
holds decode rows, distillation rows and self-conditioned rows, so that every branch of ELF's step
is in the file. ELF's code needs ``einops`` (``pip install
einops``). Usage::

    python tools/elf_distill_reference.py --elf ../ELF-distillation --out /tmp/elf-pd [--seed 0] [--depth 2]
        [--width 32] [--heads 4] [--enc-dim 16] [--vocab 40] [--bottleneck 8] [--time-tokens 4] [--cfg-tokens 4]
        [--mode-tokens 4] [--max-length 8] [--batch 6] [--student-steps 2,1] [--teacher-steps 4,1]
        [--conditional] [--pd-checkpoint 2]
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
import yaml
from elf_reference import add_network_flags, elf_commit, parity_cases, randomize, training_yaml
from safetensors.torch import save_file

RECORDED = ("z_t_s", "t_s", "t_t", "sc_cfg_scale", "sc_half", "sub_step_times", "x0", "cond_seq_mask_e")


def load_elf_distillation(checkout: Path) -> SimpleNamespace:
    """ELF's model class, distillation step and checkpoint writer, imported from the checkout."""
    src = checkout / "src"
    if not (src / "distill_train_step.py").is_file():
        raise SystemExit(f"{checkout} is not an ELF checkout of the distillation branch (no src/distill_train_step.py)")
    sys.path.insert(0, str(src))
    try:
        import distill_train_step as step_module
        from configs.config import apply_config_overrides, load_config_from_yaml
        from modules.model import ELF
        from utils.checkpoint_utils import save_checkpoint
        from utils.train_utils import TrainState
    except ImportError as err:
        raise SystemExit(f"cannot import ELF's code ({err}); ELF needs einops: pip install einops") from err
    return SimpleNamespace(ELF=ELF, step=step_module, TrainState=TrainState, save_checkpoint=save_checkpoint,
                           load_config=load_config_from_yaml, override=apply_config_overrides)


def distill_yaml(args: argparse.Namespace) -> dict[str, Any]:
    """ELF's distill_curriculum_ELF-B.yml at these sizes: the teacher's settings, then its PD knobs."""
    out = training_yaml(args)
    out.update(pad_token="eos", decoder_prob=args.decoder_prob, pd_teacher_steps=args.teacher_steps[0],
               pd_step_size=1.0 / args.student_steps[0], pd_student_schedule="logit_normal",
               pd_teacher_schedule="logit_normal", teacher_path="reference/teacher",
               initialize_student_from_teacher=True, teacher_use_ema=True, student_init_from_checkpoint=None,
               grad_accum_steps=1, use_bf16=False)
    return out


class Calls:
    """Records what ELF's step hands its teacher's PD target (and gets back) and its student, while
    in a ``with`` block."""

    def __init__(self, elf: SimpleNamespace, student: torch.nn.Module):
        self.elf, self.student_module = elf, student
        self.target: dict[str, Any] = {}
        self.student: dict[str, Any] = {}

    def __enter__(self) -> Calls:
        real = self.real = self.elf.step.teacher_pd_target

        def teacher_pd_target(**kwargs):
            out = real(**kwargs)
            self.target = {**{k: kwargs[k] for k in RECORDED}, "target": out}
            return out

        self.elf.step.teacher_pd_target = teacher_pd_target
        self.hook = self.student_module.register_forward_hook(self._student, with_kwargs=True)
        return self

    def __exit__(self, *exc: object) -> None:
        self.elf.step.teacher_pd_target = self.real
        self.hook.remove()

    def _student(self, module, args, kwargs, output) -> None:
        self.student = {"x": args[0].detach().clone(), "t": args[1].detach().clone(),
                        "gate": kwargs["decoder_step_active"].detach().clone()}


def run_case(elf: SimpleNamespace, config_path: Path, teacher: torch.nn.Module, student: torch.nn.Module,
             x0: torch.Tensor, batch: dict[str, torch.Tensor], seed: int, steps: int, sub_steps: int
             ) -> dict[str, torch.Tensor]:
    """One call of ELF's ``distill_train_step`` on ``batch`` (the encoder replaced by ``x0``) with a
    copy of ``student`` (the step's optimiser update is not kept), everything it computed recorded."""
    config = elf.override(elf.load_config(str(config_path)),
                          [f"pd_step_size={1.0 / steps}", f"pd_teacher_steps={sub_steps}"])
    config.batch_size = x0.shape[0]
    mine = copy.deepcopy(student)
    elf.step.encode_text = lambda **kwargs: x0.clone()
    state = elf.TrainState(model=mine, optimizer=torch.optim.SGD(mine.parameters(), lr=0.0),
                           ema_params1=elf.TrainState.init_ema(mine))
    torch.manual_seed(seed)
    with Calls(elf, mine) as calls:
        _, metrics = elf.step.distill_train_step(state, encoder=None, teacher=teacher, batch=batch, config=config)
    rec = calls.target
    out = {"x0": x0, "cond_seq_mask": batch["cond_seq_mask"], "input_ids": batch["input_ids"],
           "decoder_mask": calls.student["gate"], "t_s": rec["t_s"], "t_t": rec["t_t"], "w": rec["sc_cfg_scale"],
           "z_t_s": rec["z_t_s"], "sc_half": rec["sc_half"], "target": rec["target"],
           "student_input": calls.student["x"], "loss": metrics["loss"], "ce_loss": metrics["ce_loss"],
           "l2_loss": metrics["l2_loss"]}
    if rec["sub_step_times"] is not None:
        out["sub_step_times"] = rec["sub_step_times"]
    return {k: v.detach().float().contiguous() if v.is_floating_point() else v.contiguous() for k, v in out.items()}


def every_branch(case: dict[str, torch.Tensor]) -> bool:
    """Whether a case holds decode rows, distillation rows and self-conditioned distillation rows."""
    decode = case["decoder_mask"] > 0
    answer = (1 - case["cond_seq_mask"])[..., None]
    self_conditioned = (case["sc_half"] * answer).abs().amax((1, 2)) > 0
    return bool(decode.any() and (~decode).any() and self_conditioned.any())


def make_batch(args: argparse.Namespace, generator: torch.Generator) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clean states x0 and ELF's batch tensors: a prompt of 2 or 3 tokens per row with
    ``--conditional``, EOS padding read as content (pad_token eos: every position is supervised)."""
    b, s, c = args.batch, args.max_length, args.enc_dim
    cond = torch.zeros((b, s))
    if args.conditional:
        for row in range(b):
            cond[row, :2 + row % 2] = 1
    batch = {"input_ids": torch.randint(0, args.vocab, (b, s), generator=generator),
             "encoder_attention_mask": torch.ones((b, s, s)), "cond_seq_mask": cond,
             "attention_mask": torch.ones((b, s))}
    return torch.randn((b, s, c), generator=generator), batch


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_network_flags(p, "an ELF checkout of the distillation branch", max_length=8, batch=6)
    steps = lambda text: [int(v) for v in text.split(",")]  # noqa: E731
    p.add_argument("--student-steps", type=steps, default=[2, 1], help="N of each case (span 1/N), comma-separated")
    p.add_argument("--teacher-steps", type=steps, default=[4, 1], help="ELF's pd_teacher_steps of each case")
    p.add_argument("--decoder-prob", type=float, default=0.3)
    p.add_argument("--conditional", action="store_true", help="prompts (cond positions) in the batches")
    p.add_argument("--pd-checkpoint", type=int, default=0, metavar="STEPS",
                   help="also write ELF's checkpoint of the student after STEPS distillation steps, with its YAML")
    args = p.parse_args(argv)
    if len(args.student_steps) != len(args.teacher_steps):
        p.error("--student-steps and --teacher-steps need one value per case")
    args.self_cond_prob = 0.5
    elf = load_elf_distillation(args.elf.resolve())
    torch.manual_seed(args.seed)
    teacher = elf.ELF(text_encoder_dim=args.enc_dim, max_length=args.max_length, hidden_size=args.width,
                      depth=args.depth, num_heads=args.heads, bottleneck_dim=args.bottleneck,
                      num_time_tokens=args.time_tokens, num_self_cond_cfg_tokens=args.cfg_tokens,
                      num_model_mode_tokens=args.mode_tokens, vocab_size=args.vocab)
    generator = torch.Generator().manual_seed(args.seed)
    randomize(teacher, generator)
    teacher.eval().requires_grad_(False)
    student = copy.deepcopy(teacher).requires_grad_(True)
    with torch.no_grad():  # a student partway through a round: near its teacher, not equal to it
        for value in student.parameters():
            value.add_(0.05 * torch.randn(value.shape, generator=generator))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "train.yml").write_text(yaml.safe_dump(training_yaml(args), sort_keys=False))
    config_path = args.out / "distill.yml"
    config_path.write_text(yaml.safe_dump(distill_yaml(args), sort_keys=False))
    tensors = {f"teacher.{k}": v.contiguous() for k, v in teacher.state_dict().items()}
    tensors.update({f"student.{k}": v.detach().contiguous() for k, v in student.state_dict().items()})
    sizes = {k: str(getattr(args, k)) for k in ("depth", "width", "heads", "enc_dim", "vocab", "bottleneck",
                                                "time_tokens", "cfg_tokens", "mode_tokens", "max_length", "batch")}
    meta = {"cases": str(len(args.student_steps)), "seed": str(args.seed), "elf_commit": elf_commit(args.elf),
            "conditional": str(args.conditional), **sizes}
    for i, (n, k) in enumerate(zip(args.student_steps, args.teacher_steps, strict=True)):
        for seed in range(args.seed + 100 + i, args.seed + 100 + i + 20_000, 1000):  # the first with every branch
            x0, batch = make_batch(args, torch.Generator().manual_seed(seed))
            case = run_case(elf, config_path, teacher, student, x0, batch, seed, n, k)
            if every_branch(case):
                break
        else:
            raise SystemExit(f"case {i}: no seed gave decode, distillation and self-conditioned rows; use a larger "
                             "--batch")
        tensors.update({f"{i}.{name}": value for name, value in case.items()})
        meta.update({f"{i}.pd_step_size": str(1.0 / n), f"{i}.pd_teacher_steps": str(k), f"{i}.seed": str(seed)})
    save_file(tensors, str(args.out / "parity.safetensors"), metadata=meta)
    print(f"wrote {args.out / 'parity.safetensors'} ({len(args.student_steps)} cases)")
    if args.pd_checkpoint:
        write_pd_checkpoint(elf, args, config_path, teacher, student)
    return 0


def write_pd_checkpoint(elf: SimpleNamespace, args: argparse.Namespace, config_path: Path, teacher: torch.nn.Module,
                        student: torch.nn.Module) -> None:
    """``pd/``: ELF's checkpoint of the student after ``--pd-checkpoint`` steps of its
    distillation (AdamW, its EMA updated each step) and the ``config.yml`` ELF's train.py writes
    beside it (the config's own settings, as ``yaml.dump`` of its attributes)."""
    config = elf.load_config(str(config_path))
    # ELF's script names each round's folder so; the YAML records it, the files go to --out/pd
    config.batch_size, config.output_dir = args.batch, f"outputs/elf_pd/round1_{args.student_steps[0]}step"
    model = copy.deepcopy(student)
    state = elf.TrainState(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=1e-3),
                           ema_params1=elf.TrainState.init_ema(model))
    for step in range(args.pd_checkpoint):
        x0, batch = make_batch(args, torch.Generator().manual_seed(args.seed + 200 + step))
        elf.step.encode_text = lambda **kwargs: x0.clone()  # noqa: B023 - called within this iteration
        state, _ = elf.step.distill_train_step(state, encoder=None, teacher=teacher, batch=batch, config=config)
    folder = args.out / "pd"
    elf.save_checkpoint(state, str(folder), state.step)
    (folder / "config.yml").write_text(yaml.dump(vars(config), default_flow_style=False, sort_keys=False))
    model.load_state_dict({**model.state_dict(), **state.ema_params1})
    cases = parity_cases(model.eval(), SimpleNamespace(**{**vars(args), "cases": 2}),
                         torch.Generator().manual_seed(args.seed + 300))
    save_file(cases, str(folder / "parity_ema.safetensors"), metadata={"weights": "ema", "elf_commit": elf_commit(
        args.elf)})
    print(f"wrote {folder}/checkpoint_{state.step}, config.yml and parity_ema.safetensors")


if __name__ == "__main__":
    raise SystemExit(main())
