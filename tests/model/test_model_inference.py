"""The bf16 inference copy computes what bf16 autocast computes on the student (up to the order
a CPU's bf16 kernels sum in), and follows the student's weights."""

from dataclasses import replace

import torch

from elfreg.config import ModelConfig
from elfreg.model.inference import Bf16Copy
from elfreg.model.student import Student
from elfreg.sampling.network import StudentNetwork

CFG = ModelConfig(width=32, depth=2, heads=2, repa_block=1, projector_hidden=16, time_freq_dim=16)


def _student(extra_token: str = "reg") -> Student:
    torch.manual_seed(5)
    s = Student(replace(CFG, extra_token=extra_token, repa=True), 8, 50, 6)
    for p in s.parameters():
        torch.nn.init.normal_(p, std=0.3)
    return s


def _inputs(b: int = 3, length: int = 12):
    g = torch.Generator().manual_seed(2)
    mask = torch.arange(length)[None] < torch.tensor([2, 4, 5])[:b, None]
    return (torch.randn(b, length, 8, generator=g), torch.randn(b, length, 8, generator=g),
            torch.rand(b, generator=g), torch.full((b,), 1.5), mask, torch.randn(b, 6, generator=g))


def _autocast_reference(student: Student, z, q, t, w, mask, reg):
    """What the network computed before the copy existed: the fp32 student under autocast, and the
    smallest margin between the two largest logits of its decode."""
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        den = student(z, q, t, w, mask, reg=reg, reg_self_cond=reg)
        ones = torch.ones(z.shape[0], dtype=torch.bool)
        hidden = student(z, torch.zeros_like(z), torch.ones_like(t), w, mask, decode=ones, reg=reg).hidden
        ids = torch.full(mask.shape, -1, dtype=torch.long)
        logits = student.decode_logits(hidden[~mask]).float()
        ids[~mask] = logits.argmax(-1)
    top2 = logits.topk(2, dim=-1).values
    return den.x_hat.float(), den.reg_hat.float(), hidden, ids, float((top2[:, 0] - top2[:, 1]).min())


def _mean_gap(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).abs().mean())


def test_the_bf16_copy_computes_what_autocast_computes():
    student = _student()
    z, q, t, w, mask, reg = _inputs()
    x_ref, r_ref, h_ref, ids_ref, margin = _autocast_reference(student, z, q, t, w, mask, reg)
    net, fp32 = StudentNetwork(student, bf16=True), StudentNetwork(student, bf16=False)
    x_hat, r_hat = net.denoise(z, q, t, w, mask, reg, reg)
    x32, r32 = fp32.denoise(z, q, t, w, mask, reg, reg)
    # The copy runs autocast's matmuls in autocast's dtypes (on an AVX2 CPU the two agree bit for
    # bit); a CPU whose bf16 kernels sum a stored bf16 weight in another order than one cast per
    # call may round some values the other way. Either way the copy sits far closer to autocast
    # than the fp32 student does, whose gap is bf16's rounding itself (and is not zero: the
    # result really is bf16 arithmetic).
    pairs = ((x_hat, x_ref, x32), (r_hat, r_ref, r32),
             (net.decode_hidden(z, mask, reg, w), h_ref, fp32.decode_hidden(z, mask, reg, w)))
    for mine, ref, full in pairs:
        assert 0 < _mean_gap(full, ref) < 0.01 and _mean_gap(mine, ref) <= 0.1 * _mean_gap(full, ref)
    # no two logits of the reference are within rounding of each other, so the tokens agree exactly
    assert margin > 0.01 and torch.equal(net.decode(z, mask, reg, w), ids_ref)


def test_the_copy_holds_bf16_matmul_weights_and_leaves_the_student_alone():
    student = _student("learned")
    copy = Bf16Copy(student).get()
    assert copy.blocks[0].attn.qkv.weight.dtype == torch.bfloat16
    assert copy.blocks[-1].mlp.down.bias.dtype == torch.bfloat16
    # the input path, prefix tokens and heads run outside autocast (ELF's network): fp32
    for p in (copy.self_cond_proj.weight, copy.text_up.weight, copy.vocab_head.weight, copy.dec_proj.bias,
              copy.final_layer.norm.weight, copy.final_layer.linear.weight, copy.prefix.mode_tokens,
              copy.prefix.time_embedder.mlp_in.weight, copy.learned_token, copy.blocks[0].attn_norm.weight):
        assert p.dtype == torch.float32
    assert all(p.dtype == torch.float32 and p.requires_grad for p in student.parameters())
    assert not any(p.requires_grad for p in copy.parameters())


def test_the_copy_follows_changes_to_the_student():
    student = _student()
    z, q, t, w, mask, reg = _inputs()
    net = StudentNetwork(student, bf16=True)
    cache = net._bf16_copy
    first = cache.get()
    assert cache.get() is first  # nothing changed: not rebuilt

    def followed(old: torch.Tensor) -> bool:
        """The copy's prediction is the changed student's under autocast (up to the kernels'
        summation order, see above), far from the one it made before the change."""
        now, reference = net.denoise(z, q, t, w, mask, reg, reg)[0], _autocast_reference(student, z, q, t, w, mask,
                                                                                           reg)[0]
        return _mean_gap(now, reference) <= 0.1 * _mean_gap(old, reference)

    before, _ = net.denoise(z, q, t, w, mask, reg, reg)
    opt = torch.optim.SGD(student.parameters(), lr=0.05)  # an optimiser step writes in place
    student(z, q, t, w, mask, reg=reg).x_hat.square().mean().backward()
    opt.step()
    assert followed(before) and cache.get() is not first

    stepped, _ = net.denoise(z, q, t, w, mask, reg, reg)
    state = {k: v.clone() for k, v in _student().state_dict().items()}
    student.load_state_dict(state)  # load_state_dict copies in place
    assert followed(stepped)
    head = student.final_layer.linear
    head.weight = torch.nn.Parameter(torch.zeros_like(head.weight))  # a replaced tensor
    # x̂ is now the head's fp32 bias alone, in both: equal whatever the kernels
    assert torch.equal(net.denoise(z, q, t, w, mask, reg, reg)[0],
                       _autocast_reference(student, z, q, t, w, mask, reg)[0])


def test_a_compiled_network_gives_the_eager_networks_predictions():
    from torch._dynamo.eval_frame import OptimizedModule

    student = _student()
    z, q, t, w, mask, reg = _inputs()
    eager = StudentNetwork(student, bf16=False)
    compiled = StudentNetwork(student, bf16=False, compile=True)
    module = compiled.calling_module()
    assert isinstance(module, OptimizedModule) and compiled.calling_module() is module
    x_e, r_e = eager.denoise(z, q, t, w, mask, reg, reg)
    x_c, r_c = compiled.denoise(z, q, t, w, mask, reg, reg)
    torch.testing.assert_close(x_c, x_e, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(r_c, r_e, rtol=1e-5, atol=1e-5)
    assert torch.equal(compiled.decode(z, mask, reg, w), eager.decode(z, mask, reg, w))


def test_a_compiled_network_is_refused_in_one_line_where_compile_cannot_run(monkeypatch):
    import pytest

    from elfreg import compiling

    monkeypatch.setattr(compiling, "compile_problem", lambda: "InvalidCxxCompiler: none here")
    net = StudentNetwork(_student(), compile=True)
    refusal = r"^--compile \(compile=True\) needs torch.compile.*none here"
    with pytest.raises(compiling.CompileUnavailable, match=refusal):
        net.calling_module()
