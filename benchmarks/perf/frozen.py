"""The frozen models' part of a training step, measured: a randomly initialised Qwen3 encoder and
teacher of the shapes a run reads, through elfreg's own readers
(:class:`~elfreg.text.frozen.FrozenEncoder`, :class:`~elfreg.text.frozen.FrozenTeacher`), on the
same synthetic batch as the student's step. Timed in the same rounds as the student steps
(:func:`perf.train.train_section`), they turn the student-side ELF-REG/ELF ratio into the end to
end one the paper reports (1.29×), without a feature cache: every step reads both models.

Only the blocks up to the deepest read layer are built (the readers never run the others), and
the weights are bf16, the dtype the real checkpoints load in.
"""

from __future__ import annotations

import torch

from elfreg.text.frozen import FrozenEncoder, FrozenTeacher
from elfreg.train.cost import QWEN3, LMShape

from .common import timed
from .train import Shape, synthetic_batch

# The layers the runs read: ELF-REG-B (configs/elf-reg-b-gsm8k.yaml) and the toy demo.
B_READS = {"encoder_layer": 20, "repa_layer": 20, "reg_layer": 24}
TOY_READS = {"encoder_layer": 2, "repa_layer": 1, "reg_layer": 2}


def frozen_shapes(shape: Shape) -> tuple[LMShape, LMShape, dict[str, int]]:
    """(encoder, teacher, read layers) of ``shape``: the paper's Qwen3-0.6B / 1.7B for the B
    shape, the toy LMs' shapes (src/elfreg/toy/assets.py) otherwise; ``layers`` = deepest read."""
    if shape.name == "elf-reg-b":
        enc, tea = QWEN3["Qwen/Qwen3-0.6B-Base"], QWEN3["Qwen/Qwen3-1.7B-Base"]
        reads = B_READS
        return (LMShape(enc["width"], reads["encoder_layer"], enc["heads"], enc["kv_heads"], enc["head_dim"],
                        enc["intermediate"], enc["vocab"]),
                LMShape(tea["width"], reads["reg_layer"], tea["heads"], tea["kv_heads"], tea["head_dim"],
                        tea["intermediate"], tea["vocab"]), reads)
    reads = TOY_READS
    return (LMShape(shape.enc_dim, reads["encoder_layer"], 4, 2, shape.enc_dim // 4, 3 * shape.enc_dim, shape.vocab),
            LMShape(shape.teacher_dim, reads["reg_layer"], 6, 2, 32, (8 * shape.teacher_dim) // 3, shape.vocab),
            reads)


def random_lm(spec: LMShape, device: torch.device) -> torch.nn.Module:
    """A random ``Qwen3ForCausalLM`` of ``spec`` with exactly ``spec.layers`` blocks, bf16 weights."""
    from transformers import AutoModelForCausalLM, Qwen3Config

    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=spec.vocab, hidden_size=spec.width, intermediate_size=spec.intermediate,
                      num_hidden_layers=spec.layers, num_attention_heads=spec.heads,
                      num_key_value_heads=spec.kv_heads, head_dim=spec.head_dim, tie_word_embeddings=True)
    # built in bf16 directly: an fp32 Qwen3-1.7B would hold 6 GB on the way
    return AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).to(device).eval()


class _Read:
    """One frozen read as a case of :func:`perf.train.interleaved_steps`."""

    def __init__(self, fn, device: torch.device):
        self.fn, self.device = fn, device

    def step(self) -> dict[str, float]:
        return {"step": timed(self.fn, self.device)}


def frozen_cases(shape: Shape, precision: str, device: torch.device) -> dict[str, _Read]:
    """``encoder_read`` (the encoder to its read layer on the batch's canvas) and
    ``teacher_read`` (the teacher's REPA and REG targets), as the training step runs them."""
    enc_spec, tea_spec, reads = frozen_shapes(shape)
    bf16 = precision == "bf16"
    encoder = FrozenEncoder(random_lm(enc_spec, device), reads["encoder_layer"], bf16)
    teacher = FrozenTeacher(random_lm(tea_spec, device), reads["repa_layer"], reads["reg_layer"], bf16=bf16)
    canvas = synthetic_batch(shape, device).canvas
    return {"encoder_read": _Read(lambda: encoder.encode_canvas(canvas), device),
            "teacher_read": _Read(lambda: teacher.targets(canvas), device)}
