"""ELF's checkpoints in elfreg: ``elfreg import-elf`` against files written by ELF's own code
(tests/interop/fixtures/elf, made by tools/elf_reference.py): the network's outputs case by case
for both weights, a check that fails when a reference moves, ELF's sampling loop followed step
by step, and an imported checkpoint that samples and trains from."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from elfreg.cli import main
from elfreg.config import FlowConfig, SampleConfig
from elfreg.interop.elf_import import (
    elf_sizes,
    find_elf_checkpoint,
    import_elf,
    load_elf_payload,
    rope_halves,
)
from elfreg.interop.elf_parity import check_parity
from elfreg.sampling.network import CountingNetwork, StudentNetwork
from elfreg.sampling.samplers import BatchContext, SamplerState, decode_rows, euler_move, follow_path

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "elf"
SETS = ["uncond", "cond"]


def _import(name: str, tmp_path: Path, weights: str = "ema", *overrides: str):
    folder = FIXTURES / name
    return import_elf(folder, folder / "train.yml", tmp_path / f"{name}-{weights}", weights, list(overrides))


@pytest.mark.parametrize("name", SETS)
@pytest.mark.parametrize("weights", ["params", "ema"])
def test_every_parity_case_of_elfs_forward_matches(name, weights, tmp_path, capsys):
    folder = FIXTURES / name
    rc = main(["import-elf", "--checkpoint", str(folder), "--elf-config", str(folder / "train.yml"),
               "--out", str(tmp_path / "imported"), "--weights", weights,
               "--check", str(folder / f"parity_{weights}.safetensors")])
    out = capsys.readouterr().out.splitlines()
    assert rc == 0, out
    cases = [line for line in out if line.startswith("case ")]
    assert cases and all(line.endswith(": ok") for line in cases)
    assert any("decoder_logits" in line for line in cases)  # the decoder head was checked too
    meta = json.loads((tmp_path / "imported" / "meta.json").read_text())
    assert meta["imported_from"]["weights"] == weights and len(meta["imported_from"]["sha256"]) == 64


@pytest.mark.parametrize("name", SETS)
def test_the_check_fails_on_the_other_weights_and_on_a_moved_reference(name, tmp_path):
    folder = FIXTURES / name
    _, student = _import(name, tmp_path, "params")
    assert all(r.ok for r in check_parity(student, folder / "parity_params.safetensors"))
    assert not all(r.ok for r in check_parity(student, folder / "parity_ema.safetensors"))
    tensors = load_file(str(folder / "parity_params.safetensors"))
    tensors["0.output"] = tensors["0.output"].clone()
    tensors["0.output"].view(-1)[3] += 1e-2
    moved = tmp_path / "moved.safetensors"
    save_file(tensors, str(moved))
    results = check_parity(student, moved)
    assert not results[0].ok and all(r.ok for r in results[1:])
    assert 0.5e-2 < results[0].differences["output"] < 1.5e-2
    out = tmp_path / "cli"
    assert main(["import-elf", "--checkpoint", str(folder), "--elf-config", str(folder / "train.yml"),
                 "--out", str(out), "--weights", "params", "--check", str(moved)]) == 1


def test_sizes_come_from_the_tensors_not_the_yamls_model_name(tmp_path):
    folder = FIXTURES / "cond"
    payload = load_elf_payload(find_elf_checkpoint(folder))
    sizes = elf_sizes(payload["params"])
    assert "ELF-B" in (folder / "train.yml").read_text()  # a preset name that does not fit the tensors
    assert (sizes.depth, sizes.width, sizes.heads) == (3, 24, 3)
    assert (sizes.time_tokens, sizes.cfg_tokens, sizes.mode_tokens, sizes.bottleneck) == (2, 3, 1, 6)
    out, student = _import("cond", tmp_path)
    assert student.cfg.depth == 3 and student.n_prefix == 6
    assert out.joinpath("model.safetensors").is_file()
    with pytest.raises(FileExistsError):
        _import("cond", tmp_path)  # the same --out again: refused, nothing overwritten


def test_the_rope_reordering_is_a_permutation_that_pairs_as_elf_does():
    order = rope_halves(8)
    assert order.tolist() == [0, 2, 4, 6, 1, 3, 5, 7]
    # ELF rotates (2i, 2i+1) by frequency i; after the reordering those sit at (i, i + 4)
    assert [(int(order[i]), int(order[i + 4])) for i in range(4)] == [(0, 1), (2, 3), (4, 5), (6, 7)]


def _trace(name: str) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    path = FIXTURES / name / "sampler.safetensors"
    with safe_open(str(path), "pt") as f:
        meta = f.metadata() or {}
    return load_file(str(path)), meta


class _Recording:
    """A network that logs every denoiser call's inputs (what ELF's model received)."""

    def __init__(self, net):
        self.net, self.reg_dim, self.calls = net, None, []

    def denoise(self, z, q, t, w, prompt_mask, reg, reg_q):
        self.calls.append((z.clone(), q.clone(), t.clone()))
        return self.net.denoise(z, q, t, w, prompt_mask, reg, reg_q)

    def decode(self, x, prompt_mask, reg, w):
        return self.net.decode(x, prompt_mask, reg, w)


@pytest.mark.parametrize("name, prefix", [("uncond", ""), ("cond", ""), ("cond", "cfg2.")])
def test_full_span_follows_elfs_sampling_loop_step_by_step(name, prefix, tmp_path):
    """Same initial noise, same grid: at every call elfreg's network input [y ; q] is ELF's, and
    the decoded tokens are ELF's (with prompt CFG 2: ELF's two calls per step are elfreg's two row
    groups of one call)."""
    trace, meta = _trace(name)
    get = lambda key: trace[prefix + key] if prefix + key in trace else trace[key]  # noqa: E731
    _, student = _import(name, tmp_path, "params")
    z0, grid, cond, cond_mask = get("z0"), get("t_steps").double(), get("cond_seq"), get("cond_seq_mask") > 0
    b, length, _ = z0.shape
    cfg_scale = float(meta.get(prefix + "cfg_scale", meta.get("cfg_scale", 1.0)))
    w = float(meta.get("self_cond_cfg_scale", 1.0))
    sample = SampleConfig(sampler="full-span", nfe=grid.numel(), sc_cfg=w, prompt_cfg=cfg_scale)
    recording = _Recording(StudentNetwork(student))
    ctx = BatchContext(CountingNetwork(recording, b), sample, FlowConfig(sigma=2.0, c_min=0.05), cond.float(),
                       cond_mask, None, torch.full((b,), w), None)
    start = torch.where(cond_mask[..., None], cond, z0)
    path = SamplerState(start.clone(), None, torch.where(cond_mask[..., None], cond, torch.zeros_like(z0)), None,
                       torch.zeros(b, dtype=torch.long))
    follow_path(ctx, path, grid.expand(b, -1), euler_move)
    ids = decode_rows(ctx, path.y, None, None, None)

    elf_calls = sorted({int(k[len(prefix):].split(".")[0][4:]) for k in trace if k.startswith(prefix + "call")})
    per_step = 2 if cfg_scale != 1.0 else 1
    assert len(elf_calls) == per_step * (grid.numel() - 1) + 1  # ... and the decode call
    assert len(recording.calls) == grid.numel() - 1
    scale = max(1.0, float(get("final_latent").abs().max()))
    for step, (z, q, t) in enumerate(recording.calls):
        for part in range(per_step):  # ELF: the conditional call, then (with CFG) the prompt-dropped one
            k = per_step * step + part
            x = trace[f"{prefix}call{k}.x"]
            rows = slice(part * b, (part + 1) * b)
            mine = torch.cat([z[rows], q[rows]], dim=-1)
            assert torch.allclose(mine, x, atol=1e-4 * scale), (step, part, (mine - x).abs().max())
            assert torch.allclose(t[rows].float(), trace[f"{prefix}call{k}.t"].float())
    assert torch.allclose(path.y, get("final_latent"), atol=1e-4 * scale)
    answer = ~cond_mask
    assert torch.equal(ids[answer], get("decoded_ids")[answer])


def _tokenizer(folder: Path, size: int):
    """A character tokenizer of exactly ``size`` tokens (EOS first), saved in ``folder``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(["<eos>", *"abcdefghijklmnopqrstuvwxyz0123456789 .,"][:size])}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<eos>"))
    core.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    core.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<eos>", pad_token="<eos>")
    tok.save_pretrained(folder)
    assert len(tok) == size
    return tok


def test_an_imported_checkpoint_samples_and_trains_from_with_a_local_t5_encoder(tmp_path, capsys):
    from transformers import T5Config, T5EncoderModel

    payload = load_elf_payload(find_elf_checkpoint(FIXTURES / "cond"))
    sizes = elf_sizes(payload["params"])
    t5 = tmp_path / "t5"
    tok = _tokenizer(t5, sizes.vocab)  # ELF sizes its decoder by its tokenizer
    torch.manual_seed(0)
    T5EncoderModel(T5Config(vocab_size=len(tok), d_model=sizes.enc_dim, d_kv=8, d_ff=32, num_layers=2, num_heads=2,
                            decoder_start_token_id=0)).save_pretrained(t5)
    out, _ = _import("cond", tmp_path, "ema", f"text.encoder={t5}")
    assert main(["sample", "--checkpoint", str(out), "--prompt", "ab", "--prompt", "", "--nfe", "6",
                 "--no-progress", "--out", str(tmp_path / "answers")]) == 0
    rows = [json.loads(line) for line in (tmp_path / "answers" / "samples.jsonl").read_text().splitlines()]
    # the checkpoint's sampling defaults are ELF's conditional ones: full-span, prompt CFG 2 (two
    # calls per step)
    assert rows[0]["sampler"] == "full-span" and all(isinstance(r["text"], str) for r in rows)
    assert [(r["denoiser_calls"], r["decoder_calls"]) for r in rows] == [(10, 1), (10, 1)]
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"prompt": "ab", "answer": "cd"}) + "\n" for _ in range(4)))
    assert main(["train", "--config", str(out / "config.yaml"), f"train.init_from={out}", "train.steps=1",
                 "train.batch_size=2", "train.warmup_steps=1", "train.optimizer=adamw", "train.progress=false",
                 f"train.out_dir={tmp_path / 'run'}", "data.source=jsonl", f"data.path={data}"]) == 0
    assert (tmp_path / "run" / "checkpoints" / "latest").is_file()
