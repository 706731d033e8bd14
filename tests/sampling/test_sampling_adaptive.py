import itertools

import torch
from sampling_stubs import ChangingNetwork, FixedNetwork, make_problem

from elfreg.config import SampleConfig
from elfreg.sampling import grid_generator, master_grid, run_sampler


def _adaptive(nfe, interval, patience, unstable=(), batch=2, answer_key=None, **opts):
    states, mask, target, x_hat, codebook, reg_hat = make_problem(batch=batch)
    net = ChangingNetwork(x_hat, codebook, reg_hat, unstable=set(unstable))
    options = SampleConfig(sampler="adaptive", nfe=nfe, adaptive_interval=interval,
                              adaptive_patience=patience, **opts)
    return run_sampler(net, states, mask, list(range(batch)), options, answer_key=answer_key), net, mask, target


def test_stable_answer_stops_after_patience_unchanged_checks():
    out, net, mask, target = _adaptive(64, interval=4, patience=2)
    # checks after steps 4, 8, 12: the 2nd and 3rd equal their predecessor → stop with 12 + 3 calls
    assert out.denoiser_calls.tolist() == [12, 12] and out.decoder_calls.tolist() == [3, 3]
    assert out.nfe.tolist() == [15, 15] and out.early_exit.all() and out.steps.tolist() == [12, 12]
    for row in range(2):
        assert out.exit_time[row].item() == master_grid(64, 8, grid_generator(row))[11].item()
    assert torch.equal(out.token_ids[~mask], target.expand(2, -1)[~mask])


def test_rows_of_one_batch_exit_independently_and_pay_only_for_themselves():
    out, net, mask, _ = _adaptive(16, interval=4, patience=2, unstable={1})
    assert out.nfe.tolist() == [15, 16]
    # row 1: checks after steps 4 and 8 (different answers), then the exit is unaffordable:
    # steps 9…13, final decode → 13 denoiser + 3 decoder calls
    assert out.denoiser_calls.tolist() == [12, 13] and out.decoder_calls.tolist() == [3, 3]
    assert out.early_exit.tolist() == [True, False]
    assert all(call["z"].shape[0] == 1 for call in net.denoise_log[12:])  # the stopped row is not run


def test_never_exceeds_the_budget():
    for nfe, interval, patience in itertools.product([2, 3, 5, 8, 13, 20], [1, 2, 3, 5], [1, 2, 3]):
        out, *_ = _adaptive(nfe, interval, patience, unstable={1, 2}, batch=4)
        assert torch.all(out.nfe <= nfe), (nfe, interval, patience, out.nfe)
        assert torch.all(out.decoder_calls >= 1) and torch.all(out.denoiser_calls >= 1)
        assert torch.all(out.token_ids[:, -1] >= 0)  # every row got an answer


def test_patience_larger_than_budget_is_exactly_early_stop():
    nfe = 12
    states, mask, _, x_hat, codebook, reg_hat = make_problem(batch=3)
    a_net, e_net = FixedNetwork(x_hat, codebook, reg_hat), FixedNetwork(x_hat, codebook, reg_hat)
    adaptive = SampleConfig(sampler="adaptive", nfe=nfe, adaptive_patience=nfe + 1, adaptive_interval=1)
    a = run_sampler(a_net, states, mask, [4, 5, 6], adaptive)
    e = run_sampler(e_net, states, mask, [4, 5, 6], SampleConfig(sampler="early-stop", nfe=nfe))
    assert a.denoiser_calls.tolist() == [nfe - 1] * 3 and a.decoder_calls.tolist() == [1] * 3
    assert torch.equal(a.token_ids, e.token_ids) and torch.equal(a.exit_time, e.exit_time)
    assert len(a_net.denoise_log) == len(e_net.denoise_log)
    for ca, ce in zip(a_net.denoise_log, e_net.denoise_log, strict=True):
        assert torch.equal(ca["z"], ce["z"]) and torch.equal(ca["t"], ce["t"])
    assert torch.equal(a_net.decode_log[0]["x"], e_net.decode_log[0]["x"])


def test_unaffordable_exit_means_no_checks():
    out, *_ = _adaptive(10, interval=4, patience=2)  # the earliest exit would cost 15 > 10
    assert out.decoder_calls.tolist() == [1, 1] and out.denoiser_calls.tolist() == [9, 9]
    assert not out.early_exit.any()


def test_answer_key_is_pluggable():
    # every decode differs, but the key ignores the difference → stops like a stable answer
    out, *_ = _adaptive(64, interval=2, patience=1, unstable={0, 1}, answer_key=lambda row, ids: "same")
    assert out.nfe.tolist() == [6, 6] and out.early_exit.all()
    out, *_ = _adaptive(64, interval=2, patience=1, unstable={0, 1})
    # never stable: a check after every 2nd step until the budget runs out; the last check decoded
    # the last prediction, so the final answer reuses it (42 + 21 = 63 calls ≤ 64)
    assert out.denoiser_calls.tolist() == [42, 42] and out.decoder_calls.tolist() == [21, 21]
    assert not out.early_exit.any()
