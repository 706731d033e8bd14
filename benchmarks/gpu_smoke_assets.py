"""Assets of ``benchmarks/gpu_smoke.sh``: randomly initialised frozen models with the shapes of
Qwen3-0.6B-Base (encoder) and Qwen3-1.7B-Base (teacher), a character tokenizer, synthetic
examples that fill the paper's canvas (prompt ≈ 200, answer ≈ 700 tokens), and the run config:
ELF-REG-B shapes (configs/elf-reg-b-gsm8k.yaml) with these in place of the hub models. Nothing
is downloaded. ``--tiny`` shrinks everything so the plumbing can be checked on a CPU.

    python benchmarks/gpu_smoke_assets.py OUT_DIR [--tiny]
"""

from __future__ import annotations

import argparse
import json
import random
import string
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

from elfreg.config import Config
from elfreg.train.cost import QWEN3

CHARS = list(string.ascii_letters + string.digits + " .,?+-=#\n")


def tokenizer(folder: Path) -> int:
    vocab = {tok: i for i, tok in enumerate(["<eos>", *CHARS])}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<eos>"))
    core.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    core.decoder = decoders.Fuse()
    PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<eos>", pad_token="<eos>").save_pretrained(folder)
    return len(vocab)


def frozen_model(folder: Path, name: str, layers: int, tiny: bool, seed: int) -> None:
    """A random Qwen3 of the named shape with only the ``layers`` blocks a run reads."""
    shape = dict(QWEN3[name])
    shape.pop("total_layers")
    if tiny:
        shape.update(width=64, heads=4, kv_heads=2, head_dim=16, intermediate=128, vocab=512)
    torch.manual_seed(seed)
    cfg = Qwen3Config(vocab_size=shape["vocab"], hidden_size=shape["width"], intermediate_size=shape["intermediate"],
                      num_hidden_layers=layers, num_attention_heads=shape["heads"],
                      num_key_value_heads=shape["kv_heads"], head_dim=shape["head_dim"],
                      max_position_embeddings=4096, tie_word_embeddings=False, torch_dtype="bfloat16")
    Qwen3ForCausalLM(cfg).to(torch.bfloat16).save_pretrained(folder)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--tiny", action="store_true", help="tiny shapes, for a CPU check of the plumbing")
    args = ap.parse_args()
    out = args.out
    cfg = Config.load(Path(__file__).resolve().parents[1] / "configs" / "elf-reg-b-gsm8k.yaml")
    enc_layers, teacher_layers = cfg.text.encoder_layer, max(cfg.text.repa_layer, cfg.text.reg_layer)
    if args.tiny:
        enc_layers, teacher_layers = 2, 3
    tokenizer(out / "encoder")
    frozen_model(out / "encoder", "Qwen/Qwen3-0.6B-Base", enc_layers, args.tiny, 0)
    frozen_model(out / "teacher", "Qwen/Qwen3-1.7B-Base", teacher_layers, args.tiny, 1)
    rng = random.Random(0)
    prompt_len, answer_len = (20, 60) if args.tiny else (200, 700)
    with open(out / "data.jsonl", "w") as f:
        for _ in range(512):
            words = lambda n: "".join(rng.choice(CHARS[:-1]) for _ in range(n))  # noqa: E731
            f.write(json.dumps({"prompt": words(prompt_len), "answer": words(answer_len)}) + "\n")
    overrides = {"text": {"encoder": str(out / "encoder"), "teacher": str(out / "teacher")},
                 "data": {"source": "jsonl", "path": str(out / "data.jsonl"), "prompt_field": "prompt",
                          "answer_field": "answer"}}
    if args.tiny:
        overrides["text"].update(encoder_layer=2, repa_layer=2, reg_layer=3, canvas_len=96, prompt_cap=32)
        # not the paper's named size: a smaller student
        overrides["model"] = {"size": None, "width": 64, "depth": 2, "heads": 2, "repa_block": 1,
                              "projector_hidden": 64}
    data = cfg.to_dict()
    data["data"] = {}  # the synthetic file alone, not the paper's recipe
    data["train"]["epochs"] = 0  # train.steps (set by the smoke script) is the budget, not the recipe's epochs
    for section, values in overrides.items():
        data[section].update(values)
    Config.from_dict(data).save(out / "config.yaml")
    print(out / "config.yaml")


if __name__ == "__main__":
    main()
