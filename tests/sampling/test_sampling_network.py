from dataclasses import replace

import pytest
import torch

from elfreg.config import ModelConfig
from elfreg.model.student import Student
from elfreg.sampling.generation import answer_token_ids
from elfreg.sampling.network import CountingNetwork, StudentNetwork

CFG = ModelConfig(width=32, depth=2, heads=2, repa_block=1, projector_hidden=16, time_freq_dim=16)


@pytest.fixture
def student():
    torch.manual_seed(3)
    s = Student(replace(CFG, repa=False), 8, 5, 6)
    for p in s.parameters():
        torch.nn.init.normal_(p, std=0.5)
    with torch.no_grad():  # make EOS (id 0) likely enough that answers end at various lengths
        s.vocab_head.weight[0] += 0.3 * s.vocab_head.weight[1:].mean(0)
    return s.eval()


def _inputs(b=6, length=40):
    torch.manual_seed(1)
    mask = torch.arange(length)[None] < torch.tensor([1, 3, 5, 7, 9, 39])[:b, None]
    return torch.randn(b, length, 8), mask, torch.randn(b, 6), torch.full((b,), 2.0)


@pytest.mark.parametrize("chunk_positions", [1, 3, 50, 10**6])
def test_decode_stopping_at_eos_gives_the_same_answers(student, chunk_positions):
    x, mask, reg, w = _inputs()
    full = StudentNetwork(student).decode(x, mask, reg, w)
    early = StudentNetwork(student, eos_id=0, logits_per_chunk=5 * chunk_positions).decode(x, mask, reg, w)
    assert torch.all(full[mask] == -1) and torch.all(early[mask] == -1)
    assert torch.all(full[~mask] >= 0)
    lengths = []
    for b in range(x.shape[0]):
        answer = answer_token_ids(full[b], 0)
        assert answer_token_ids(early[b], 0) == answer
        tail = early[b][int(mask[b].sum()) + len(answer):]
        assert torch.all(tail == 0)  # after the first EOS: EOS
        lengths.append(len(answer))
    room = (~mask).sum(1).tolist()
    assert any(0 < n < r - 1 for n, r in zip(lengths, room, strict=True))  # answers end mid-canvas


def test_decode_hidden_is_what_the_head_reads(student):
    x, mask, reg, w = _inputs()
    net = StudentNetwork(student)
    hidden = net.decode_hidden(x, mask, reg, w)
    assert hidden.shape == (*mask.shape, CFG.width)
    ids = net.decode(x, mask, reg, w)
    assert torch.equal(student.decode_logits(hidden[~mask]).argmax(-1), ids[~mask])


def test_decode_stops_running_the_vocabulary_head_after_eos(student, monkeypatch):
    x, mask, reg, w = _inputs()
    seen = []
    real = student.decode_logits
    monkeypatch.setattr(student, "decode_logits", lambda h: (seen.append(h.shape[0]), real(h))[1])
    StudentNetwork(student, eos_id=0, logits_per_chunk=5 * 6).decode(x, mask, reg, w)
    early_positions = sum(seen)
    seen.clear()
    StudentNetwork(student).decode(x, mask, reg, w)
    assert sum(seen) == int((~mask).sum()) and early_positions < sum(seen)


@pytest.mark.parametrize("window", [1, 4, 32])
def test_decode_window_stops_early_without_a_memory_bound(student, monkeypatch, window):
    """With the default (memory-sized) chunk, the EOS stop still reads at most ``eos_window``
    positions past each row's first EOS, and gives the full decode's answers."""
    x, mask, reg, w = _inputs()
    full = StudentNetwork(student).decode(x, mask, reg, w)
    seen = []
    real = student.decode_logits
    monkeypatch.setattr(student, "decode_logits", lambda h: (seen.append(h.shape[0]), real(h))[1])
    early = StudentNetwork(student, eos_id=0, eos_window=window).decode(x, mask, reg, w)
    room = (~mask).sum(1)
    read = 0
    for b in range(x.shape[0]):
        answer = answer_token_ids(full[b], 0)
        assert answer_token_ids(early[b], 0) == answer
        # windows of `window` positions until the one holding the first EOS (or the region's end)
        first_eos = len(answer) + 1
        read += min(int(room[b]), -(-first_eos // window) * window)
    assert sum(seen) == read
    if window < int(room.max()):
        assert read < int(room.sum())


def test_decode_window_must_be_positive(student):
    with pytest.raises(ValueError, match="eos_window"):
        StudentNetwork(student, eos_id=0, eos_window=0)


def test_decode_mode_ignores_time_and_denoise_returns_float(student):
    x, mask, reg, w = _inputs()
    net = StudentNetwork(student)
    a = net.decode(x, mask, reg, w)
    assert torch.equal(a, net.decode(x, mask, reg, w))
    d, rd = net.denoise(x, torch.zeros_like(x), torch.rand(6), w, mask, reg, torch.zeros_like(reg))
    assert d.dtype == torch.float32 and rd.shape == (6, 6)
    assert torch.equal(d[mask], x[mask])


def test_counting_charges_rows_to_their_samples(student):
    x, mask, reg, w = _inputs(b=3)
    net = CountingNetwork(StudentNetwork(student), 3)
    net.denoise(x, x, torch.rand(3), w, mask, reg, reg)
    rows = torch.tensor([0, 2, 0, 2])
    net.denoise(x[[0, 2, 0, 2]], x[[0, 2, 0, 2]], torch.rand(4), w[rows], mask[rows], reg[rows], reg[rows], rows=rows)
    net.decode(x[[1]], mask[[1]], reg[[1]], w[[1]], rows=torch.tensor([1]))
    assert net.denoiser_calls.tolist() == [3, 1, 3] and net.decoder_calls.tolist() == [0, 1, 0]
    assert net.nfe.tolist() == [3, 2, 3]
    with pytest.raises(ValueError):
        net.denoise(x[rows], x[rows], torch.rand(4), w[rows], mask[rows], reg[rows], reg[rows])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_top_token_is_argmax_with_ties_and_nans(dtype):
    from elfreg.sampling.network import top_token

    g = torch.Generator().manual_seed(0)
    tied = torch.randint(-3, 4, (64, 500), generator=g).to(dtype)  # many tied maxima per row
    wide = torch.randn(8, 151_936, generator=g).to(dtype)
    nans = torch.randn(4, 50, generator=g).to(dtype)
    nans[1, 7] = nans[2, 3] = nans[2, 9] = float("nan")
    for logits in (tied, wide, nans):
        assert torch.equal(top_token(logits), logits.argmax(-1))
