from dataclasses import replace

import pytest
import torch

from elfreg.config import ModelConfig, SampleConfig
from elfreg.model.student import Student
from elfreg.sampling import Trajectory, generate
from elfreg.sampling.generation import answer_token_ids
from elfreg.text.load import load_frozen_text

PROMPTS = ["add 1 2", "what is 13+29?", "x"]


@pytest.fixture(scope="module")
def frozen(tiny_assets):
    from conftest import tiny_config

    cfg = tiny_config(tiny_assets, tiny_assets["encoder"].parent)
    return load_frozen_text(cfg.text, with_teacher=False)


def _random_student(frozen, extra_token="reg", seed=0):
    torch.manual_seed(seed)
    cfg = ModelConfig(width=32, depth=2, heads=2, repa_block=1, projector_hidden=16, time_freq_dim=16, repa=False,
                      extra_token=extra_token)
    student = Student(cfg, frozen.encoder.width, frozen.encoder.vocab_size,
                      teacher_dim=48 if extra_token == "reg" else None)
    # non-zero output heads, so clean predictions (and decoded answers) depend on the noise; the
    # decoder head's biases start at zero, where EOS seldom wins: a small EOS bias gives answers
    # of varied lengths, as a trained model's
    torch.nn.init.normal_(student.final_layer.linear.weight, std=0.3)
    if extra_token == "reg":
        torch.nn.init.normal_(student.reg_head.linear.weight, std=0.3)
    with torch.no_grad():
        student.vocab_head.bias[frozen.tokenizer.eos_token_id] = 0.5
    return student.eval()


@pytest.fixture(scope="module")
def student(frozen):
    return _random_student(frozen)


SAMPLE_FIELDS = {"sampler", "nfe", "rho", "sc_cfg", "prompt_cfg", "renoise_eta", "renoise_power", "sde_gamma",
                 "adaptive_patience", "adaptive_interval", "trim", "trim_interval", "trim_patience", "trim_margin"}


def _gen(student, frozen, prompts, record_trajectory=False, record_every=1, **kw):
    kw = {"nfe": 8, "progress": False, **kw}
    sample = SampleConfig(**{k: kw.pop(k) for k in list(kw) if k in SAMPLE_FIELDS})
    return generate(student, prompts, sample, frozen_text=frozen, record_every=record_every if record_trajectory else 0,
                    **kw)


@pytest.mark.parametrize("sampler", ["early-stop", "full-span", "renoise", "adaptive", "sde"])
def test_batch_invariance_across_prompt_lengths(student, frozen, sampler):
    batched = _gen(student, frozen, PROMPTS, sampler=sampler, samples=2, seed=11, batch_size=6,
                   adaptive_interval=1, adaptive_patience=1)
    for r in batched:
        alone = _gen(student, frozen, [PROMPTS[r.prompt_index]], sampler=sampler, samples=1,
                     seed=11 + r.sample_index, adaptive_interval=1, adaptive_patience=1)[0]
        assert (alone.tokens, alone.nfe, alone.seed) == (r.tokens, r.nfe, r.seed)


def test_an_answer_cap_reads_the_first_tokens_of_the_answer_region_as_elfs_gen_length(student, frozen):
    full = _gen(student, frozen, PROMPTS, samples=2, seed=3)
    capped = _gen(student, replace(frozen, canvas=replace(frozen.canvas, answer_cap=3)), PROMPTS, samples=2, seed=3)
    assert any(len(r.tokens) > 3 for r in full)  # the cap cuts some answers
    for whole, cut in zip(full, capped, strict=True):
        assert cut.tokens == whole.tokens[:3]
        assert cut.ended == (len(whole.tokens) < 3 and whole.ended)


def test_canvas_trimming_on_a_student_is_batch_invariant_and_pays_for_its_checks(student, frozen):
    trim = {"trim": True, "trim_interval": 1, "trim_patience": 1, "trim_margin": 0, "nfe": 12}
    batched = _gen(student, frozen, PROMPTS, samples=2, seed=11, batch_size=6, **trim)
    length = frozen.canvas.canvas_len
    assert any(r.canvas_len < length for r in batched), [r.canvas_len for r in batched]
    for r in batched:
        assert r.canvas_len == length or r.canvas_len % 8 == 0
        assert r.nfe == r.denoiser_calls + r.decoder_calls and r.denoiser_calls == 11 and r.decoder_calls >= 3
        alone = _gen(student, frozen, [PROMPTS[r.prompt_index]], samples=1, seed=11 + r.sample_index, **trim)[0]
        assert (alone.tokens, alone.nfe, alone.canvas_len) == (r.tokens, r.nfe, r.canvas_len)


def test_a_demo_width_student_answers_the_same_in_small_and_large_cpu_batches(frozen):
    # toy evaluations batch 32 rows on a CPU and 256 elsewhere (elfreg.toy.demo.eval_batch_size);
    # on a CPU in fp32 the batch must not move an answer
    torch.manual_seed(3)
    cfg = ModelConfig(width=128, depth=4, heads=2, repa_block=2, projector_hidden=16, time_freq_dim=64)
    wide = Student(replace(cfg, repa=False), frozen.encoder.width, frozen.encoder.vocab_size, teacher_dim=48).eval()
    torch.nn.init.normal_(wide.final_layer.linear.weight, std=0.3)
    torch.nn.init.normal_(wide.reg_head.linear.weight, std=0.3)
    prompts = [f"what is {a}+{b}?" for a in range(8) for b in range(8)]
    small, large = (_gen(wide, frozen, prompts, samples=4, nfe=4, batch_size=b, precision="fp32") for b in (32, 256))
    assert [r.tokens for r in small] == [r.tokens for r in large]
    assert len({tuple(r.tokens) for r in small}) > 1  # the answers depend on the prompt and the noise


def test_results_layout_nfe_and_seeds(student, frozen):
    results = _gen(student, frozen, PROMPTS, samples=3, seed=5, batch_size=4)
    assert [(r.prompt_index, r.sample_index, r.seed) for r in results] == [
        (i, j, 5 + j) for i in range(3) for j in range(3)]
    assert all(r.nfe == 8 and r.denoiser_calls == 7 and r.decoder_calls == 1 for r in results)
    assert all(isinstance(r.text, str) and frozen.tokenizer.eos_token_id not in r.tokens for r in results)
    assert all(r.text == frozen.tokenizer.decode(r.tokens, skip_special_tokens=True) for r in results)


def test_same_seed_same_output_different_seeds_differ(student, frozen):
    a = _gen(student, frozen, PROMPTS, samples=4, seed=0)
    b = _gen(student, frozen, PROMPTS, samples=4, seed=0)
    assert [r.tokens for r in a] == [r.tokens for r in b]
    for i in range(len(PROMPTS)):
        answers = {tuple(r.tokens) for r in a if r.prompt_index == i}
        assert len(answers) > 1, f"prompt {i}: all seeds gave the same answer"


def test_samplers_share_the_initial_noise_and_first_prediction(student, frozen):
    outs = {s: _gen(student, frozen, PROMPTS[:1], sampler=s, samples=3, seed=2, record_trajectory=True)
            for s in ("early-stop", "full-span", "renoise", "adaptive")}
    ref = outs["early-stop"]
    for name, res in outs.items():
        for a, b in zip(ref, res, strict=True):
            assert a.trajectory.times[0] == b.trajectory.times[0] == 0
            assert torch.equal(a.trajectory.states[0], b.trajectory.states[0]), name  # same y_0
            assert torch.equal(a.trajectory.reg_states[0], b.trajectory.reg_states[0]), name
            assert torch.equal(a.trajectory.predictions[0], b.trajectory.predictions[0]), name  # same d_0
    assert {r.exit_time for r in outs["full-span"]} == {1.0}
    assert [r.exit_time for r in ref] == [r.exit_time for r in outs["renoise"]]  # same t★
    assert [r.tokens for r in ref] != [r.tokens for r in outs["full-span"]]


def test_adaptive_with_huge_patience_equals_early_stop_on_a_student(student, frozen):
    es = _gen(student, frozen, PROMPTS, samples=2, seed=3, nfe=10)
    ad = _gen(student, frozen, PROMPTS, samples=2, seed=3, nfe=10, sampler="adaptive", adaptive_patience=11,
              adaptive_interval=1)
    assert [(r.tokens, r.nfe) for r in ad] == [(r.tokens, r.nfe) for r in es]
    # a key that treats every answer alike stops as early as patience allows
    quick = _gen(student, frozen, PROMPTS, nfe=10, sampler="adaptive", adaptive_patience=1, adaptive_interval=2,
                 answer_key=lambda text: 0)
    assert all(r.nfe == 6 and r.early_exit for r in quick)


def test_trajectory_recording_is_free_and_faithful(student, frozen, tmp_path):
    plain = _gen(student, frozen, PROMPTS, samples=2, seed=1, nfe=9)
    rec = _gen(student, frozen, PROMPTS, samples=2, seed=1, nfe=9, record_trajectory=True, record_every=3)
    assert [(r.tokens, r.nfe) for r in rec] == [(r.tokens, r.nfe) for r in plain]
    for r in rec:
        tr = r.trajectory
        assert tr.steps.tolist() == [0, 3, 6, 7]  # every 3rd step and the last one (d_{N−2})
        answer_len = 24 - tr.prompt_len
        assert tr.states.shape == (4, answer_len, frozen.encoder.width) == tr.predictions.shape
        assert tr.tokens.shape == (4, answer_len) and tr.reg_states.shape == (4, 48)
        assert tr.times[0] == 0 and tr.times[-1].item() == pytest.approx(r.exit_time, abs=0)
        assert tr.nfe == r.nfe == 9
        # early-stop decodes the last clean prediction: the recorded decode of d_{N−2} is the answer
        assert torch.equal(tr.tokens[-1], tr.final_tokens)
        assert answer_token_ids(tr.final_tokens, frozen.tokenizer.eos_token_id) == r.tokens
    path = tmp_path / "t.safetensors"
    rec[0].trajectory.save(path)
    back = Trajectory.load(path)
    assert back.sampler == "early-stop" and back.seed == 1 and back.prompt_len == rec[0].trajectory.prompt_len
    assert torch.equal(back.states, rec[0].trajectory.states) and torch.equal(back.tokens, rec[0].trajectory.tokens)
    assert back.info["nfe_budget"] == 9


def test_recording_named_steps(student, frozen):
    def run(**kw):
        return generate(student, PROMPTS[:2], SampleConfig(nfe=12), frozen_text=frozen, seed=3, progress=False, **kw)

    plain, every, named, both = run(), run(record_every=1), run(record_steps={2, 6}), \
        run(record_every=4, record_steps={5})
    assert [r.tokens for r in named] == [r.tokens for r in plain] == [r.tokens for r in both]
    for e, r, b in zip(every, named, both, strict=True):
        assert r.trajectory.steps.tolist() == [2, 6, 10]  # the named steps and the last one (d_{N−2})
        assert b.trajectory.steps.tolist() == [0, 4, 5, 8, 10]
        assert torch.equal(r.trajectory.predictions, e.trajectory.predictions[[2, 6, 10]])
        assert torch.equal(r.trajectory.tokens, e.trajectory.tokens[[2, 6, 10]])
    with pytest.raises(ValueError, match="record_steps"):
        run(record_steps={-1})


def test_renoise_and_adaptive_record_too(student, frozen):
    for sampler in ("renoise", "adaptive"):
        rec = _gen(student, frozen, PROMPTS[:2], sampler=sampler, seed=4, record_trajectory=True,
                   adaptive_interval=1, adaptive_patience=1)
        plain = _gen(student, frozen, PROMPTS[:2], sampler=sampler, seed=4, adaptive_interval=1, adaptive_patience=1)
        assert [(r.tokens, r.nfe) for r in rec] == [(r.tokens, r.nfe) for r in plain]
        for r in rec:
            assert r.trajectory.steps.tolist() == list(range(r.steps))


def test_students_without_reg_and_prompt_cfg(frozen):
    plain = _random_student(frozen, extra_token="none")
    res = _gen(plain, frozen, PROMPTS, nfe=6, prompt_cfg=1.5)
    assert all(r.nfe == 2 * 5 + 1 and r.denoiser_calls == 10 for r in res)
    learned = _random_student(frozen, extra_token="learned")
    assert all(r.nfe == 6 for r in _gen(learned, frozen, PROMPTS, nfe=6, sampler="renoise"))


def test_answer_ends_at_the_first_eos():
    ids = torch.tensor([-1, -1, 5, 6, 0, 7, 0])
    assert answer_token_ids(ids, eos_id=0) == [5, 6]
    assert answer_token_ids(torch.tensor([-1, 0, 3]), eos_id=0) == []
    assert answer_token_ids(torch.tensor([-1, 4, 3]), eos_id=0) == [4, 3]


def test_a_student_needs_its_frozen_text(student):
    with pytest.raises(TypeError, match="frozen_text"):
        generate(student, PROMPTS, SampleConfig(nfe=4), progress=False)
