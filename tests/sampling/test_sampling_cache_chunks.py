"""Cache-sized chunks of samples through the blocks: the rule, and that chunked calls compute the
whole batch's values bit for bit in fp32 and bf16."""

import pytest
import torch

from elfreg.config import ModelConfig
from elfreg.model.student import Student
from elfreg.sampling import cache_chunks
from elfreg.sampling.cache_chunks import MIN_ROWS, cpu_cache_bytes, last_level_cache_bytes, samples_per_chunk
from elfreg.sampling.network import StudentNetwork

CFG = ModelConfig(width=32, depth=2, heads=2, repa_block=1, projector_hidden=16, time_freq_dim=16)
LENGTH = 128  # + 4 prefix tokens: 132 rows a sample, so MIN_ROWS allows chunks of 4 samples


def _student(extra_token: str = "reg") -> Student:
    torch.manual_seed(3)
    s = Student(CFG, 8, 50, 6, extra_token=extra_token, repa=True)
    for p in s.parameters():
        torch.nn.init.normal_(p, std=0.3)
    return s.eval()


def _inputs(b: int = 9):
    g = torch.Generator().manual_seed(4)
    mask = torch.arange(LENGTH)[None] < torch.randint(2, 40, (b, 1), generator=g)
    return (torch.randn(b, LENGTH, 8, generator=g), torch.randn(b, LENGTH, 8, generator=g),
            torch.rand(b, generator=g), torch.full((b,), 1.5), mask, torch.randn(b, 6, generator=g))


@pytest.mark.parametrize("bf16", [False, True])
@pytest.mark.parametrize("extra_token", ["reg", "learned"])
def test_chunks_of_samples_compute_the_whole_batch_bit_for_bit(bf16, extra_token):
    student = _student(extra_token)
    z, q, t, w, mask, reg = _inputs()
    reg = reg if extra_token == "reg" else None
    decode = torch.tensor([True, False] * 4 + [True])
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        whole = student(z, q, t, w, mask, decode=decode, reg=reg)
        for n in (1, 2, 4, 8):
            part = student(z, q, t, w, mask, decode=decode, reg=reg, samples_per_chunk=n)
            assert torch.equal(part.x_hat, whole.x_hat) and torch.equal(part.hidden, whole.hidden)
            if reg is not None:
                assert torch.equal(part.reg_hat, whole.reg_hat)


def test_chunks_are_refused_where_the_forward_needs_the_whole_body():
    student = _student()
    z, q, t, w, mask, reg = _inputs()
    with pytest.raises(ValueError, match="samples_per_chunk"):
        student(z, q, t, w, mask, reg=reg, want_repa=True, samples_per_chunk=2)


def test_the_rule_fills_a_quarter_of_the_cache_in_even_chunks():
    mib = 1 << 20
    # ELF-REG-B in bf16: 260 rows × 2 × 2048 × 2 bytes = 2.08 MiB a sample; a quarter of 32 MiB holds 3
    assert samples_per_chunk(32, 260, 2048, 2, 32 * mib) == 3
    assert samples_per_chunk(8, 260, 2048, 2, 32 * mib) == 3  # 3 + 3 + 2
    assert samples_per_chunk(3, 260, 2048, 2, 32 * mib) is None  # the batch fits
    # in fp32 one sample would fit; a chunk still gets MIN_ROWS rows (two samples)
    assert samples_per_chunk(8, 260, 2048, 4, 32 * mib) == 2 == -(-MIN_ROWS // 260)
    # room for 8 of 9 samples: 5 + 4, not 8 + 1
    per_sample = 1000 * 2 * 100 * 4
    assert samples_per_chunk(9, 1000, 100, 4, 8 * per_sample * 4) == 5
    assert samples_per_chunk(1, 260, 2048, 2, 1) is None
    assert samples_per_chunk(32, 260, 2048, 2, None) is None


def test_the_cache_size_is_read_from_sysfs_and_can_be_overridden(tmp_path, monkeypatch):
    for name, kind, size in [("index0", "Data", "48K"), ("index1", "Instruction", "64M"),
                             ("index2", "Unified", "2048K"), ("index3", "Unified", "32M")]:
        (tmp_path / name).mkdir()
        (tmp_path / name / "type").write_text(kind + "\n")
        (tmp_path / name / "size").write_text(size + "\n")
    assert last_level_cache_bytes(tmp_path) == 32 << 20  # the instruction cache is not counted
    assert last_level_cache_bytes(tmp_path / "absent") is None
    assert cpu_cache_bytes(torch.device("cuda")) is None
    monkeypatch.setenv("ELFREG_CPU_CACHE_BYTES", "1234")
    assert cpu_cache_bytes(torch.device("cpu")) == 1234
    monkeypatch.setenv("ELFREG_CPU_CACHE_BYTES", "0")
    assert cpu_cache_bytes(torch.device("cpu")) is None
    monkeypatch.setenv("ELFREG_CPU_CACHE_BYTES", "32M")
    with pytest.raises(ValueError, match="ELFREG_CPU_CACHE_BYTES"):
        cpu_cache_bytes(torch.device("cpu"))


@pytest.mark.parametrize("bf16", [False, True])
def test_the_network_chunks_a_large_batch_and_predicts_the_same(bf16, monkeypatch):
    student = _student()
    z, q, t, w, mask, reg = _inputs()
    monkeypatch.setenv("ELFREG_CPU_CACHE_BYTES", "1")  # a tiny cache: chunks of MIN_ROWS rows
    net, whole = StudentNetwork(student, bf16=bf16), StudentNetwork(student, bf16=bf16, cache_chunks=False)
    assert net.chunk_samples(z) == 3 and whole.chunk_samples(z) is None  # 4 fit, so 3 + 3 + 3
    assert StudentNetwork(student, compile=True).chunk_samples(z) is None
    bodies, body = [], Student._body

    def counted(self, h, cos, sin):
        bodies.append(h.shape[0])
        return body(self, h, cos, sin)

    monkeypatch.setattr(Student, "_body", counted)
    chunked = net.denoise(z, q, t, w, mask, reg, reg), net.decode(z, mask, reg, w)
    assert bodies == [3, 3, 3] * 2
    reference = whole.denoise(z, q, t, w, mask, reg, reg), whole.decode(z, mask, reg, w)
    assert bodies == [3, 3, 3] * 2  # the whole batch does not go through the chunked path
    for a, b in zip(chunked[0], reference[0], strict=True):
        assert torch.equal(a, b)
    assert torch.equal(chunked[1], reference[1])


def test_the_rule_is_the_modules_own(monkeypatch):
    # the network's element size follows its compute dtype: bf16 activations are 2 bytes
    seen = []
    monkeypatch.setattr(cache_chunks, "last_level_cache_bytes", lambda: 1 << 30)
    monkeypatch.delenv("ELFREG_CPU_CACHE_BYTES", raising=False)
    real = samples_per_chunk

    def spy(*args):
        seen.append(args)
        return real(*args)

    monkeypatch.setattr("elfreg.sampling.network.samples_per_chunk", spy)
    z = _inputs()[0]
    StudentNetwork(_student(), bf16=True).chunk_samples(z)
    StudentNetwork(_student(), bf16=False).chunk_samples(z)
    hidden = _student().blocks[0].mlp.down.in_features
    assert seen == [(9, LENGTH + 4, hidden, 2, 1 << 30), (9, LENGTH + 4, hidden, 4, 1 << 30)]
