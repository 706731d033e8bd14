"""ELF's checkpoints in elfreg: ``elfreg import-elf`` against files written by ELF's own code
(tests/interop/fixtures/elf, made by tools/elf_reference.py): the network's outputs case by case
for both weights, a check that fails when a reference moves, ELF's sampling loop (its Euler step
and its SDE step, given its noise) followed call by call, for models with and without SC-CFG
tokens and self-conditioning, an imported checkpoint that samples and trains from, and what ELF's
distillation branch writes for a progressively distilled student."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file, save_file

from elfreg.cli import main
from elfreg.config import Config, FlowConfig
from elfreg.interop.elf_import import (
    elf_sizes,
    find_elf_checkpoint,
    import_elf,
    load_elf_payload,
    rope_halves,
)
from elfreg.interop.elf_parity import check_parity
from elfreg.interop.elf_trace import check_traces, read_traces, replay_trace
from elfreg.sampling.network import StudentNetwork

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "elf"
# uncond, cond: ELF's defaults at two sizes; nocfg: no SC-CFG tokens (ELF guides self-conditioning
# by a second call); nosc: no SC-CFG tokens and self_cond_prob 0 (no self-conditioning at all)
SETS = ["uncond", "cond", "nocfg", "nosc"]
FLOW = FlowConfig(sigma=2.0, c_min=0.05)  # ELF's denoiser_noise_scale and t_eps in the fixtures' YAMLs


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


def test_imports_take_elfs_task_settings_and_sampling_configs(tmp_path):
    """ELF keeps a long prompt's first max_input_length tokens and reads gen_length = max_length −
    max_input_length answer tokens; it samples conditional models with Euler at prompt CFG 2, and
    unconditional ones with its SDE step (64 steps, γ 1.0, SC-CFG 3)."""
    cond = Config.load(_import("cond", tmp_path)[0] / "config.yaml")
    assert (cond.text.canvas_len, cond.text.prompt_cap, cond.text.prompt_truncation, cond.text.answer_cap) == (
        10, 5, "right", 5)
    assert (cond.sample.sampler, cond.sample.nfe, cond.sample.prompt_cfg) == ("full-span", 65, 2.0)
    uncond = Config.load(_import("uncond", tmp_path)[0] / "config.yaml")
    assert uncond.text.answer_cap == 0
    assert (uncond.sample.sampler, uncond.sample.nfe, uncond.sample.sde_gamma, uncond.sample.sc_cfg) == (
        "sde", 65, 1.0, 3.0)


def test_the_rope_reordering_is_a_permutation_that_pairs_as_elf_does():
    order = rope_halves(8)
    assert order.tolist() == [0, 2, 4, 6, 1, 3, 5, 7]
    # ELF rotates (2i, 2i+1) by frequency i; after the reordering those sit at (i, i + 4)
    assert [(int(order[i]), int(order[i + 4])) for i in range(4)] == [(0, 1), (2, 3), (4, 5), (6, 7)]


# (set, trace prefixes of sampler.safetensors, ELF's denoiser calls per trace): prompt CFG 2 and
# ELF's self-conditioning guidance by calls each double them
ODE_TRACES = [("uncond", {"(unprefixed)": 5}), ("cond", {"(unprefixed)": 5, "cfg2": 10}),
              ("nocfg", {"(unprefixed)": 10}), ("nosc", {"(unprefixed)": 5, "cfg2": 10})]


@pytest.mark.parametrize("name, calls", ODE_TRACES)
def test_full_span_follows_elfs_sampling_loop_step_by_step(name, calls, tmp_path):
    """Same initial noise, same grid: at every call elfreg's network input [y ; q] (y alone without
    self-conditioning) is ELF's, and the decoded tokens are ELF's; ELF's calls of a step (prompt
    CFG, self-conditioning guided by calls) are elfreg's row groups of one forward."""
    _, student = _import(name, tmp_path, "params")
    results = check_traces(student, FLOW, FIXTURES / name / "sampler.safetensors")
    assert {r.name: r.calls for r in results} == calls
    assert all(r.ok for r in results), [r.line() for r in results]


@pytest.mark.parametrize("name", SETS)
def test_sde_follows_elfs_sde_loop_given_its_noise(name, tmp_path):
    """ELF's SDE step (γ 1.5, and γ 1.0, with prompt CFG 2 for the conditional models), two seeds of
    grid and noise per model, at three sizes: elfreg's SDE sampler, handed the noise ELF drew,
    gives ELF's network inputs and times at every call, its final state and its tokens."""
    _, student = _import(name, tmp_path, "params")
    path = FIXTURES / name / "sampler_sde.safetensors"
    traces = read_traces(path)
    assert [(t["sde_noise"].shape[0], s["gamma"], s["method"]) for t, s in traces.values()] == [
        (4, "1.5", "sde"), (4, "1.0", "sde")]
    assert not torch.equal(traces["0."][0]["t_steps"], traces["1."][0]["t_steps"])  # two seeds
    results = check_traces(student, FLOW, path)
    assert [r.name for r in results] == ["0", "1"]
    assert all(r.ok for r in results), [r.line() for r in results]


def test_without_elfs_input_path_or_its_guidance_the_traces_fail(tmp_path):
    """The two ways a model without SC-CFG tokens or self-conditioning could sample silently wrong."""
    _, nosc = _import("nosc", tmp_path, "params")
    assert not nosc.self_conditioning
    trace, settings = read_traces(FIXTURES / "nosc" / "sampler.safetensors")[""]
    unguided = {**settings, "self_cond_cfg_scale": "1.0"}  # ELF ignores w without self-conditioning
    assert replay_trace(nosc, FLOW, trace, unguided).ok
    nosc.self_conditioning = True  # q through self_cond_proj, as elfreg did before
    assert not replay_trace(nosc, FLOW, trace, unguided).ok
    _, nocfg = _import("nocfg", tmp_path, "params")
    net = StudentNetwork(nocfg)
    assert net.guides_self_conditioning
    nocfg.cfg.cfg_tokens = 4  # claims w as an input: one call per step, unguided
    with pytest.raises(ValueError, match="ELF made 11 calls, elfreg 6"):
        check_traces(nocfg, FLOW, FIXTURES / "nocfg" / "sampler.safetensors")


def test_a_moved_sde_trace_and_the_wrong_step_fail(tmp_path):
    _, student = _import("uncond", tmp_path, "params")
    trace, settings = read_traces(FIXTURES / "uncond" / "sampler_sde.safetensors")["0."]
    moved = {**trace, "call2.x": trace["call2.x"].clone()}
    moved["call2.x"].view(-1)[5] += 1e-2
    result = replay_trace(student, FLOW, moved, settings)
    assert not result.ok and 0.5e-2 < result.differences["inputs"] < 1.5e-2
    assert result.differences["final_state"] <= result.limit  # only the moved reference differs
    as_euler = replay_trace(student, FLOW, trace, {**settings, "gamma": "0"})  # the Euler step instead
    assert not as_euler.ok and as_euler.differences["inputs"] > 100 * as_euler.limit
    fewer = {**trace, "sde_noise": trace["sde_noise"][:2]}
    with pytest.raises(ValueError, match="more noise than ELF drew"):
        replay_trace(student, FLOW, fewer, settings)


def test_import_elf_checks_traces_and_parity_files_in_one_command(tmp_path, capsys):
    folder = FIXTURES / "cond"
    args = ["import-elf", "--checkpoint", str(folder), "--elf-config", str(folder / "train.yml"), "--weights",
            "params", "--check", str(folder / "parity_params.safetensors")]
    for f in ("sampler.safetensors", "sampler_sde.safetensors"):
        args += ["--check", str(folder / f)]
    assert main([*args, "--out", str(tmp_path / "ok")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert sum(line.startswith("trace ") and line.endswith(": ok") for line in lines) == 4
    assert "parity with" in lines[-1] and "2 of 2 traces" in lines[-1]
    assert main([*args[:-2], "--check", str(FIXTURES / "uncond" / "sampler_sde.safetensors"),
                 "--out", str(tmp_path / "other")]) == 2  # another model's trace: shapes refused


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


PD = Path(__file__).resolve().parent / "fixtures" / "elf_distill" / "uncond" / "pd"


def test_a_progressively_distilled_checkpoint_imports_with_its_few_step_sampling(tmp_path, capsys):
    """What ELF's distillation branch writes (its checkpoint payload and config.yml, fixtures made by
    tools/elf_distill_reference.py): the EMA computes ELF's outputs, and the import samples as ELF
    samples its distilled student at the YAML's 1/pd_step_size = 2 steps (SDE γ 1.5, SC-CFG 2.5,
    3 NFE)."""
    out = tmp_path / "pd"
    assert main(["import-elf", "--checkpoint", str(PD), "--elf-config", str(PD / "config.yml"), "--out", str(out),
                 "--check", str(PD / "parity_ema.safetensors")]) == 0
    assert "2 of 2 cases within tolerance" in capsys.readouterr().out
    sample = Config.load(out / "config.yaml").sample
    assert (sample.sampler, sample.nfe, sample.sde_gamma, sample.sc_cfg) == ("sde", 3, 1.5, 2.5)
    source = json.loads((out / "meta.json").read_text())["imported_from"]
    assert source["format"] == "ELF (distillation)" and source["epoch"] == 0
    assert source["distilled"] == {"student_steps": 2, "teacher_steps": 4, "teacher": "reference/teacher"}
    # a 16-step student samples with ELF's setting for 16-32 steps; a YAML without PD keys as before
    elf = yaml.safe_load((PD / "config.yml").read_text())
    (tmp_path / "sixteen.yml").write_text(yaml.safe_dump({**elf, "pd_step_size": 0.0625}))
    many = Config.load(import_elf(PD, tmp_path / "sixteen.yml", tmp_path / "sixteen")[0] / "config.yaml").sample
    assert (many.nfe, many.sde_gamma, many.sc_cfg) == (17, 2.0, 2.0)
    (tmp_path / "odd.yml").write_text(yaml.safe_dump({**elf, "pd_step_size": 2.0}))
    assert main(["import-elf", "--checkpoint", str(PD), "--elf-config", str(tmp_path / "odd.yml"),
                 "--out", str(tmp_path / "odd")]) == 2
    assert "pd_step_size must be in (0, 1]" in capsys.readouterr().err


def test_state_dict_names_of_a_compiled_network_import_as_its_own(tmp_path):
    """ELF's distillation code strips torch.compile's _orig_mod. prefix when it reads a checkpoint."""
    payload = torch.load(find_elf_checkpoint(PD), weights_only=True)
    compiled = {**payload, **{k: {f"_orig_mod.{n}": v for n, v in payload[k].items()} for k in ("params",
                                                                                              "ema_params1")}}
    torch.save(compiled, tmp_path / "checkpoint_2")
    _, plain = import_elf(PD, PD / "config.yml", tmp_path / "plain")
    _, renamed = import_elf(tmp_path / "checkpoint_2", PD / "config.yml", tmp_path / "renamed")
    assert all(torch.equal(a, b) for a, b in zip(plain.state_dict().values(), renamed.state_dict().values(),
                                                 strict=True))


def test_the_distilled_import_samples_one_step_with_elfs_preset(tmp_path):
    """``--sampling elf-pd-few --nfe 2``: one SDE step (ELF's last step is Euler) and the decode."""
    from transformers import T5Config, T5EncoderModel

    sizes = elf_sizes(load_elf_payload(find_elf_checkpoint(PD))["params"])
    t5 = tmp_path / "t5"
    tok = _tokenizer(t5, sizes.vocab)
    torch.manual_seed(0)
    T5EncoderModel(T5Config(vocab_size=len(tok), d_model=sizes.enc_dim, d_kv=4, d_ff=16, num_layers=1, num_heads=2,
                            decoder_start_token_id=0)).save_pretrained(t5)
    out, _ = import_elf(PD, PD / "config.yml", tmp_path / "pd", "ema", [f"text.encoder={t5}"])
    assert main(["sample", "--checkpoint", str(out), "--prompt", "", "--samples", "2", "--sampling", "elf-pd-few",
                 "--nfe", "2", "--no-progress", "--out", str(tmp_path / "answers")]) == 0
    rows = [json.loads(line) for line in (tmp_path / "answers" / "samples.jsonl").read_text().splitlines()]
    assert [(r["sampler"], r["denoiser_calls"], r["decoder_calls"]) for r in rows] == [("sde", 1, 1)] * 2
