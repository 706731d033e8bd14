import pytest
import torch

from elfreg.text.canvas import CanvasBuilder
from elfreg.text.frozen import FrozenEncoder, FrozenTeacher, freeze, load_causal_lm, standardize_tokens
from elfreg.text.load import load_frozen_text
from elfreg.text.tokenizer import load_tokenizer

from conftest import make_char_tokenizer, make_tiny_lm


@pytest.fixture(scope="module")
def tok(tiny_assets):
    return load_tokenizer(str(tiny_assets["encoder"]))


def test_freeze_switches_off_dropout_and_gradients_in_place():
    net = torch.nn.Sequential(torch.nn.Linear(4, 64), torch.nn.Dropout(0.5), torch.nn.Linear(64, 2))
    assert freeze(net) is net
    assert not any(m.training for m in net.modules())
    assert not any(p.requires_grad for p in net.parameters())
    x = torch.randn(3, 4)
    torch.testing.assert_close(net(x), net(x), rtol=0, atol=0)  # no dropout mask drawn
    assert not net(x).requires_grad


def test_canvas_layout_masks_and_eos_padding(tok):
    builder = CanvasBuilder(tok, canvas_len=16, prompt_cap=6)
    c = builder.build(["ab", "abcd"], ["xyz", "q"])
    eos = tok.eos_token_id
    assert c.tokens.shape == (2, 16)
    assert c.prompt_lens.tolist() == [2, 4]
    assert c.prompt_mask.sum(1).tolist() == [2, 4]
    assert c.content_mask.sum(1).tolist() == [3, 1]
    assert torch.all(c.tokens[0, 5:] == eos) and torch.all(c.tokens[1, 5:] == eos)
    assert c.answer_mask.sum(1).tolist() == [14, 12]  # EOS padding is supervised
    assert c.last_content.tolist() == [4, 4]
    assert not (c.content_mask & c.special_mask).any()


def test_overflow_policy_is_applied_and_counted(tok):
    builder = CanvasBuilder(tok, canvas_len=10, prompt_cap=4)
    c = builder.build(["abcdefg", "ab"], ["12", "123456789"])
    assert tok.decode(c.tokens[0, :4]) == "defg"  # prompt keeps its last tokens
    assert c.tokens[1, 2:].tolist() == tok("12345678")["input_ids"]  # answer cut, no EOS
    assert builder.stats.as_dict() == {"examples": 2, "prompts_truncated": 1, "answers_truncated": 1}
    inference = builder.build(["ab"])
    assert torch.all(inference.tokens[0, 2:] == tok.eos_token_id) and not inference.content_mask.any()
    assert c.lengths.tolist() == [6, 10] and inference.lengths.tolist() == [2]
    elf = CanvasBuilder(tok, canvas_len=10, prompt_cap=4, prompt_truncation="right")  # ELF's: the start kept
    assert tok.decode(elf.build(["abcdefg"], ["12"]).tokens[0, :4]) == "abcd"
    with pytest.raises(ValueError, match="prompt_truncation"):
        CanvasBuilder(tok, canvas_len=10, prompt_cap=4, prompt_truncation="middle")


def test_encoder_states_are_standardised_and_prompt_states_independent_of_answer(tiny_assets, tok):
    enc = FrozenEncoder(load_causal_lm(str(tiny_assets["encoder"])), layer=2, bf16=False)
    assert len(enc.reader.base.layers) == 2  # blocks above the read layer are dropped
    builder = CanvasBuilder(tok, canvas_len=16, prompt_cap=8)
    full = builder.build(["what 1"], ["answer 2"])
    alone = builder.build(["what 1"])
    x_full, x_alone = enc.encode(full.tokens), enc.encode(alone.tokens)
    assert torch.allclose(x_full.mean(-1), torch.zeros(1, 16), atol=1e-5)
    assert torch.allclose(x_full.var(-1, unbiased=False), torch.ones(1, 16), atol=1e-2)
    p = int(full.prompt_lens[0])
    assert torch.allclose(x_full[:, :p], x_alone[:, :p], atol=1e-5)
    assert not any(p.requires_grad for p in enc.reader.base.parameters())


def test_encoder_reads_hf_hidden_state_of_its_layer(tiny_assets, tok):
    lm = load_causal_lm(str(tiny_assets["encoder"]))
    ids = torch.tensor([tok("hello 12")["input_ids"]])
    with torch.no_grad():
        ref = lm(input_ids=ids, output_hidden_states=True).hidden_states[2]
    enc = FrozenEncoder(lm, layer=2, bf16=False)
    assert torch.allclose(enc.encode(ids), standardize_tokens(ref), atol=1e-5)


def test_teacher_targets_shift_and_reg_position(tiny_assets, tok):
    builder = CanvasBuilder(tok, canvas_len=16, prompt_cap=8)
    c = builder.build(["ab", "abc"], ["cd", "d"])
    t0 = FrozenTeacher(load_causal_lm(str(tiny_assets["teacher"])), 2, 3, shift=0, bf16=False)
    t1 = FrozenTeacher(load_causal_lm(str(tiny_assets["teacher"])), 2, 3, shift=1, bf16=False)
    a, b = t0.targets(c), t1.targets(c)
    assert torch.allclose(b.repa[:, 1:], a.repa[:, :-1])
    last = c.last_content
    assert torch.allclose(a.reg_repa, a.repa[torch.arange(2), last])
    t0.calibrate([c, c])
    assert torch.allclose(t0.targets(c).reg.mean(0), torch.zeros(t0.width), atol=1e-4)


def test_the_teacher_skips_the_padding_after_the_longest_content_and_no_target_changes(tiny_assets, tok):
    """The teacher runs only up to the last content token of the batch; every target it is read
    at (content positions, the REG position, with either shift) equals a forward of the whole
    canvas, and the padding positions after it are zeros."""
    builder = CanvasBuilder(tok, canvas_len=24, prompt_cap=8)
    c = builder.build(["ab", "abc"], ["cd", "defg"])
    lm = load_causal_lm(str(tiny_assets["teacher"]))
    seen = []
    lm.model.register_forward_pre_hook(lambda _m, args, kwargs: seen.append(kwargs["input_ids"].shape[1]),
                                       with_kwargs=True)
    with torch.no_grad():
        whole = lm(c.tokens, output_hidden_states=True).hidden_states
    for shift in (0, 1):
        t = FrozenTeacher(load_causal_lm(str(tiny_assets["teacher"])), 2, 3, shift=shift, bf16=False)
        t.reader.base.register_forward_pre_hook(lambda _m, args, kwargs: seen.append(kwargs["input_ids"].shape[1]),
                                                with_kwargs=True)
        got = t.targets(c)
        used = int(c.last_content.max()) + 1
        assert seen[-1] == used < 24
        want = whole[2] if shift == 0 else torch.cat([whole[2][:, :1], whole[2][:, :-1]], dim=1)
        at = c.content_mask
        assert torch.allclose(got.repa[at], want[at], atol=1e-5)
        rows, last = torch.arange(2), c.last_content
        assert torch.allclose(got.reg, whole[3][rows, last], atol=1e-5)  # standardised by mean 0, std 1
        assert torch.allclose(got.reg_repa, whole[2][rows, last], atol=1e-5)
        assert torch.all(got.repa[:, used + shift:] == 0)


def test_vocabulary_mismatch_fails_clearly(tmp_path, tiny_assets):
    from elfreg.config import TextConfig

    tok = make_char_tokenizer(tmp_path / "other")
    make_tiny_lm(tmp_path / "other", len(tok) + 5, width=32, layers=3, seed=3)
    cfg = TextConfig(encoder=str(tiny_assets["encoder"]), encoder_layer=2, teacher=str(tmp_path / "other"),
                     repa_layer=2, reg_layer=3, canvas_len=16, prompt_cap=4)
    with pytest.raises(ValueError, match="vocabularies differ"):
        load_frozen_text(cfg, with_teacher=True)
    with pytest.raises(ValueError, match="out of range"):
        FrozenEncoder(load_causal_lm(str(tiny_assets["encoder"])), layer=9)


def test_frozen_models_default_to_the_training_precision_of_the_device(tiny_cfg, monkeypatch):
    # sampling must see the features training saw: on a CPU `precision: auto` is fp32 on every CPU,
    # unless ELFREG_PRECISION says otherwise
    for forced, bf16 in (("", False), ("bf16", True), ("fp32", False)):
        monkeypatch.setenv("ELFREG_PRECISION", forced)
        frozen = load_frozen_text(tiny_cfg().text, with_teacher=True)
        assert frozen.encoder.reader.bf16 is bf16 and frozen.teacher.reader.bf16 is bf16
    assert load_frozen_text(tiny_cfg().text, with_teacher=False, bf16=True).encoder.reader.bf16 is True


def test_an_fp32_run_reads_a_bf16_checkpoint_in_fp32(tmp_path, tiny_assets, tiny_cfg):
    # real checkpoints store bf16 and load in it; fp32 precision must not read features in bf16
    import dataclasses
    import shutil

    from transformers import AutoModelForCausalLM

    stored = tmp_path / "bf16"
    shutil.copytree(tiny_assets["encoder"], stored)
    AutoModelForCausalLM.from_pretrained(str(tiny_assets["encoder"])).to(torch.bfloat16).save_pretrained(stored)
    assert next(load_causal_lm(str(stored)).parameters()).dtype == torch.bfloat16
    text = dataclasses.replace(tiny_cfg().text, encoder=str(stored), teacher=str(stored))
    fp32 = load_frozen_text(text, with_teacher=True, bf16=False)
    assert {p.dtype for p in fp32.encoder.reader.base.parameters()} == {torch.float32}
    assert {p.dtype for p in fp32.teacher.reader.base.parameters()} == {torch.float32}
    assert fp32.encoder.encode(torch.tensor([[1, 2, 3]])).dtype == torch.float32
    kept = load_frozen_text(text, with_teacher=False, bf16=True)
    assert {p.dtype for p in kept.encoder.reader.base.parameters()} == {torch.bfloat16}


def make_tiny_t5(folder, vocab: int, seed: int = 0) -> None:
    """A tiny random T5 encoder saved with the character tokenizer (ELF reads T5 encoders)."""
    from transformers import T5Config, T5EncoderModel

    torch.manual_seed(seed)
    make_char_tokenizer(folder)
    T5EncoderModel(T5Config(vocab_size=vocab, d_model=24, d_kv=8, d_ff=48, num_layers=2, num_heads=3,
                            decoder_start_token_id=0)).save_pretrained(folder)


def test_a_t5_encoder_is_read_at_its_output_with_elfs_mask_and_global_standardisation(tmp_path, tok):
    from transformers import T5EncoderModel

    from elfreg.text.frozen import load_encoder_lm, t5_attention_mask

    make_tiny_t5(tmp_path / "t5", len(tok))
    model = load_encoder_lm(str(tmp_path / "t5"))
    assert isinstance(model, T5EncoderModel) and not model.training
    enc = FrozenEncoder(model, layer=-1, bf16=False, standardize="global", latent_mean=0.1, latent_std=0.2)
    assert enc.bidirectional and enc.width == 24
    builder = CanvasBuilder(tok, canvas_len=12, prompt_cap=6)
    full, alone = builder.build(["ab", "abcd"], ["xyz", "q"]), builder.build(["ab", "abcd"])
    mask = t5_attention_mask(full)[:, 0]
    # prompt rows see the prompt only; answer and padding rows see prompt + answer, not the padding
    assert mask[0, 0].tolist() == [True, True] + [False] * 10
    assert mask[0, 3].tolist() == [True] * 5 + [False] * 7 and mask[0, 9].tolist() == mask[0, 3].tolist()
    x_full, x_alone = enc.encode_canvas(full), enc.encode_canvas(alone)
    for row, p in enumerate(full.prompt_lens.tolist()):
        torch.testing.assert_close(x_full[row, :p], x_alone[row, :p], rtol=1e-5, atol=1e-5)
    assert not torch.allclose(x_full[0, 2:5], x_alone[0, 2:5], atol=1e-3)  # answers see their tokens
    with torch.no_grad():
        raw = model(input_ids=full.tokens, attention_mask=t5_attention_mask(full)).last_hidden_state
    torch.testing.assert_close(x_full, (raw - 0.1) / 0.2, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="read at its output"):
        FrozenEncoder(model, layer=1)
    # an unconditional canvas (no prompt, no answer yet) reads without NaN
    assert torch.isfinite(enc.encode_canvas(builder.build([""]))).all()
    # an EOS inside the answer is one of its tokens, seen as ELF's is_valid sees it; the padding is not
    eos = tok.eos_token_id
    inner = builder.build_ids([tok("ab")["input_ids"]], [tok("x")["input_ids"] + [eos] + tok("y")["input_ids"]])
    assert t5_attention_mask(inner)[0, 0, 5].tolist() == [True] * 5 + [False] * 7
    assert inner.special_mask[0, 3] and not inner.content_mask[0, 3]  # still no REPA target there


def test_a_causal_encoder_can_be_read_at_its_output(tiny_assets, tok):
    lm = load_causal_lm(str(tiny_assets["encoder"]))
    ids = torch.tensor([tok("hello 12")["input_ids"]])
    with torch.no_grad():
        ref = lm.model(input_ids=ids).last_hidden_state  # after the final norm
    enc = FrozenEncoder(load_causal_lm(str(tiny_assets["encoder"])), layer=-1, bf16=False)
    assert len(enc.reader.base.layers) == 3  # every block is kept
    torch.testing.assert_close(enc.encode(ids), standardize_tokens(ref), rtol=1e-5, atol=1e-5)


def test_without_prompt_moves_the_answer_to_the_start_and_back_to_canvas_undoes_it(tok):
    from elfreg.text.canvas import back_to_canvas

    c = CanvasBuilder(tok, canvas_len=10, prompt_cap=5).build(["ab", "abcd", ""], ["xyz", "q", "uv"])
    moved = c.without_prompt(tok.eos_token_id)
    eos = tok.eos_token_id
    assert moved.tokens[0].tolist() == c.tokens[0, 2:].tolist() + [eos] * 2
    assert moved.tokens[2].tolist() == c.tokens[2].tolist()  # an empty prompt: nothing moves
    assert not moved.prompt_mask.any() and moved.content_mask.sum(1).tolist() == c.content_mask.sum(1).tolist()
    assert moved.last_content.tolist() == [2, 0, 1]
    values = torch.arange(30.0).reshape(3, 10, 1)
    back = back_to_canvas(values, c.prompt_lens)
    assert back[0, :, 0].tolist() == [0, 0] + list(range(8))
    assert back[1, :, 0].tolist() == [0] * 4 + list(range(10, 16)) and torch.equal(back[2], values[2])
