"""Cache-sized chunks of samples through the blocks: the rule, and that chunked calls compute the
whole batch's values bit for bit in fp32 and bf16."""

from dataclasses import replace

import pytest
import torch

from elfreg.config import ModelConfig
from elfreg.model.student import Student
from elfreg.sampling import cache_chunks
from elfreg.sampling.cache_chunks import MIN_ROWS, chunk_sizes, cpu_cache_bytes, even_chunks, last_level_cache_bytes
from elfreg.sampling.network import StudentNetwork

CFG = ModelConfig(width=32, depth=2, heads=2, repa_block=1, projector_hidden=16, time_freq_dim=16)
LENGTH = 128  # + 4 prefix tokens: 132 rows a sample, so MIN_ROWS allows chunks of 4 samples


def _student(extra_token: str = "reg") -> Student:
    torch.manual_seed(3)
    s = Student(replace(CFG, extra_token=extra_token, repa=True), 8, 50, 6)
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
    """The sampling network runs the student's stages with the blocks on chunks of samples: its
    denoise and decode calls give what the student's forward gives on the whole batch."""
    student = _student(extra_token)
    z, q, t, w, mask, reg = _inputs()
    reg = reg if extra_token == "reg" else None
    chunked, whole = StudentNetwork(student, bf16), StudentNetwork(student, bf16, cache_chunks=False)
    expected = whole.denoise(z, q, t, w, mask, reg, reg), whole.decode_hidden(z, mask, reg, w)
    assert whole.sample_chunks(z) is None
    for sizes in ([1] * 9, [2, 2, 2, 2, 1], [4, 5], [8, 1]):
        chunked.sample_chunks = lambda x, sizes=sizes: sizes
        (x_hat, reg_hat), hidden = chunked.denoise(z, q, t, w, mask, reg, reg), chunked.decode_hidden(z, mask, reg, w)
        assert torch.equal(x_hat, expected[0][0]) and torch.equal(hidden, expected[1])
        if reg is not None:
            assert torch.equal(reg_hat, expected[0][1])


def test_the_rule_chunks_batches_well_past_the_cache_into_even_halves_of_it():
    mib = 1 << 20
    # ELF-REG-B in bf16: 260 rows × 2 × 2048 × 2 bytes = 2.08 MiB a sample; batch 32 is 68 MiB,
    # over 1.5 × 32 MiB, and half the cache holds 7 samples
    assert chunk_sizes(32, 260, 2048, 2, 32 * mib) == [7, 7, 6, 6, 6]
    assert chunk_sizes(16, 260, 2048, 2, 32 * mib) is None  # 34 MiB: about one cache, kept whole
    assert chunk_sizes(8, 260, 2048, 2, 32 * mib) is None
    # in fp32 (4.16 MiB a sample) batch 16 is chunked, 3 to a chunk, as evenly as 16 allows
    assert chunk_sizes(16, 260, 2048, 4, 32 * mib) == [3, 3, 3, 3, 2, 2]  # not 3 × 5 + 1
    assert chunk_sizes(8, 260, 2048, 4, 32 * mib) is None
    # a sample too wide for half the cache: a chunk still gets MIN_ROWS rows (two samples)
    assert -(-MIN_ROWS // 260) == 2 and chunk_sizes(8, 260, 8192, 4, 32 * mib) == [2, 2, 2, 2]
    per_sample = 1000 * 2 * 100 * 4
    assert chunk_sizes(10, 1000, 100, 4, 6 * per_sample) == [3, 3, 2, 2]
    assert chunk_sizes(1, 260, 2048, 2, 1) is None
    assert even_chunks(10, 3) == [3, 3, 2, 2] and even_chunks(8, 8) == [8] and even_chunks(7, 2) == [2, 2, 2, 1]
    assert chunk_sizes(32, 260, 2048, 2, None) is None


def test_the_cache_size_is_read_from_sysfs_and_can_be_overridden(tmp_path, monkeypatch):
    for name, kind, size in [("index0", "Data", "48K"), ("index1", "Instruction", "64M"),
                             ("index2", "Unified", "2048K"), ("index3", "Unified", "32M")]:
        (tmp_path / name).mkdir()
        (tmp_path / name / "type").write_text(kind + "\n")
        (tmp_path / name / "size").write_text(size + "\n")
    assert last_level_cache_bytes(tmp_path) == 32 << 20  # the instruction cache is not counted
    assert last_level_cache_bytes(tmp_path / "absent") is None
    assert cpu_cache_bytes(torch.device("cuda")) is None
    monkeypatch.delenv("ELFREG_CPU_CACHE_BYTES", raising=False)
    reads = []
    monkeypatch.setattr(cache_chunks, "last_level_cache_bytes", lambda: reads.append(1) or 777)
    cache_chunks._this_cpu_cache_bytes.cache_clear()
    try:  # this CPU's size, read from sysfs once per process
        assert [cpu_cache_bytes(torch.device("cpu")) for _ in range(3)] == [777] * 3 and reads == [1]
    finally:
        cache_chunks._this_cpu_cache_bytes.cache_clear()
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
    assert net.sample_chunks(z) == [3, 3, 3] and whole.sample_chunks(z) is None  # 4 fit: 3 + 3 + 3
    assert StudentNetwork(student, compile=True).sample_chunks(z) is None
    bodies, body = [], Student.run_blocks

    def counted(self, h, *args, **kwargs):
        bodies.append(h.shape[0])
        return body(self, h, *args, **kwargs)

    monkeypatch.setattr(Student, "run_blocks", counted)
    chunked = net.denoise(z, q, t, w, mask, reg, reg), net.decode(z, mask, reg, w)
    assert bodies == [3, 3, 3] * 2
    reference = whole.denoise(z, q, t, w, mask, reg, reg), whole.decode(z, mask, reg, w)
    assert bodies == [3, 3, 3] * 2 + [9, 9]  # the whole batch goes through the blocks in one piece
    for a, b in zip(chunked[0], reference[0], strict=True):
        assert torch.equal(a, b)
    assert torch.equal(chunked[1], reference[1])


def test_the_network_sizes_chunks_by_its_compute_dtype(monkeypatch):
    # bf16 activations are 2 bytes, fp32 ones 4; the rows include the 13 prefix tokens (4 t, 4 w,
    # 4 mode and the REG token)
    seen = []
    monkeypatch.setattr(cache_chunks, "_this_cpu_cache_bytes", lambda: 1 << 30)
    monkeypatch.delenv("ELFREG_CPU_CACHE_BYTES", raising=False)
    real = chunk_sizes

    def spy(*args):
        seen.append(args)
        return real(*args)

    monkeypatch.setattr("elfreg.sampling.network.chunk_sizes", spy)
    z = _inputs()[0]
    StudentNetwork(_student(), bf16=True).sample_chunks(z)
    StudentNetwork(_student(), bf16=False).sample_chunks(z)
    hidden = _student().blocks[0].mlp.down.in_features
    assert _student().n_prefix == 13
    assert seen == [(9, LENGTH + 13, hidden, 2, 1 << 30), (9, LENGTH + 13, hidden, 4, 1 << 30)]
