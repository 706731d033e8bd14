import math

import pytest
import torch
from sampling_stubs import FixedNetwork, make_problem

from elfreg.config import ConfigError, FlowConfig, SampleConfig
from elfreg.sampling import full_span_grid, grid_generator, master_grid, run_sampler
from elfreg.sampling.grids import power_schedule

SIGMA = 2.0


def _run(sampler, nfe=64, seeds=(0, 1), rho=8, d_r=4, **opts):
    states, mask, target, x_hat, codebook, reg_hat = make_problem(batch=len(seeds), d_r=d_r)
    net = FixedNetwork(x_hat, codebook, reg_hat)
    sample = SampleConfig(sampler=sampler, nfe=nfe, rho=rho, **opts)
    out = run_sampler(net, states, mask, list(seeds), sample, FlowConfig(sigma=SIGMA))
    return out, net, states, mask, target, x_hat, reg_hat


def _initial_noise(seed, length=10, dim=6, d_r=4):
    g = torch.Generator().manual_seed(seed)
    text = torch.randn((length, dim), generator=g)
    reg = torch.randn((d_r,), generator=g)
    return SIGMA * text, SIGMA * reg, g


def test_early_stop_n64_rho8_calls_and_decodes_the_prediction_at_index_62():
    out, net, states, mask, target, x_hat, reg_hat = _run("early-stop", nfe=64, seeds=(5, 6))
    assert out.denoiser_calls.tolist() == [63, 63] and out.decoder_calls.tolist() == [1, 1]
    assert out.nfe.tolist() == [64, 64]
    assert len(net.denoise_log) == 63 and len(net.decode_log) == 1
    for row, seed in enumerate((5, 6)):
        grid = master_grid(64, 8, grid_generator(seed))
        assert grid.numel() == 512
        seen = torch.stack([call["t"][row] for call in net.denoise_log]).double()
        assert torch.allclose(seen, grid[:63].float().double())  # evaluated at t_0 … t_62
        assert out.exit_time[row].item() == grid[62].item()
    # the decoder gets d_62 itself: the clean prediction x̂ (answer) and the clean prompt
    dec = net.decode_log[0]
    assert torch.equal(dec["x"][~mask], x_hat.expand(2, -1, -1)[~mask])
    assert torch.equal(dec["x"][mask], states[mask])
    assert torch.equal(dec["reg"], reg_hat.expand(2, -1))  # last REG prediction
    assert torch.equal(out.token_ids[~mask], target.expand(2, -1)[~mask])
    assert torch.all(out.token_ids[mask] == -1)


def test_euler_states_follow_eq12_and_self_conditioning_is_the_previous_prediction():
    out, net, states, mask, _, x_hat, reg_hat = _run("early-stop", nfe=6, seeds=(3,))
    y0, r0, _ = _initial_noise(3)
    grid = master_grid(6, 8, grid_generator(3))[:6].float()
    first = net.denoise_log[0]
    assert torch.equal(first["z"][0][~mask[0]], y0[~mask[0]])  # answer starts at σ·N(0, I)
    assert torch.equal(first["reg"][0], r0)  # REG starts from noise
    # q_0 is 0 at answer positions and the clean prompt at prompt positions (ELF's restore_cond)
    assert torch.all(first["q"][~mask] == 0) and torch.all(first["reg_q"] == 0)
    assert torch.equal(first["q"][mask], states[mask])
    for j, call in enumerate(net.denoise_log):
        assert torch.equal(call["z"][mask], states[mask])  # prompt stays clean
        assert torch.all(call["w"] == 3.0)  # SC-CFG scale enters the network
        if j:
            assert torch.equal(call["q"][0][~mask[0]], x_hat[~mask[0]])
            assert torch.equal(call["reg_q"][0], reg_hat)
            prev, t0, t1 = net.denoise_log[j - 1], grid[j - 1], grid[j]
            expect = prev["z"] + (t1 - t0) * (x_hat - prev["z"]) / max(1 - t0.item(), 0.05)
            assert torch.allclose(call["z"][0][~mask[0]], expect[0][~mask[0]], atol=1e-6)


@pytest.mark.parametrize("nfe", [2, 5, 21])
def test_full_span_lands_exactly_on_a_fixed_prediction_when_the_last_step_is_unclamped(nfe):
    out, net, _, mask, target, x_hat, reg_hat = _run("full-span", nfe=nfe, seeds=(0,))
    assert out.denoiser_calls.item() == nfe - 1 and out.decoder_calls.item() == 1 and out.nfe.item() == nfe
    assert out.exit_time.item() == 1.0
    dec = net.decode_log[0]
    assert torch.allclose(dec["x"][0][~mask[0]], x_hat[~mask[0]], atol=1e-5)
    assert torch.allclose(dec["reg"][0], reg_hat, atol=1e-5)
    assert torch.equal(out.token_ids[0][~mask[0]], target[~mask[0]])


def test_full_span_n64_on_a_uniform_grid_matches_the_analytic_euler_solution():
    # With a fixed x̂, y_{j+1} − x̂ = (1 − h/max(1 − t_j, 0.05))·(y_j − x̂) on the uniform grid.
    out, net, _, mask, _, x_hat, reg_hat = _run("full-span", nfe=64, seeds=(7,), full_span_grid="uniform")
    assert out.denoiser_calls.item() == 63 and out.decoder_calls.item() == 1
    t = full_span_grid(64)
    assert torch.allclose(torch.stack([c["t"][0] for c in net.denoise_log]).double(), t[:-1].float().double())
    factor = math.prod(1 - (t[j + 1] - t[j]).item() / max(1 - t[j].item(), 0.05) for j in range(63))
    y0, r0, _ = _initial_noise(7)
    expect = x_hat + factor * (y0 - x_hat)
    got = net.decode_log[0]["x"][0]
    assert abs(factor) > 1e-3  # the clamp keeps the last steps from landing exactly here
    assert torch.allclose(got[~mask[0]], expect[~mask[0]], atol=1e-4)
    assert torch.allclose(net.decode_log[0]["reg"][0], reg_hat + factor * (r0 - reg_hat), atol=1e-4)


def test_full_span_runs_on_elfs_logit_normal_grid_drawn_from_each_samples_seed():
    """ELF's get_sampling_steps: 0, N − 2 sorted sigmoid(N(−1.5, 0.8)) points, 1: the early-stop
    master grid at ρ = 1, so each seed has its own grid (and its grid, not the batch, decides it)."""
    out, net, *_ = _run("full-span", nfe=16, seeds=(3, 4))
    assert SampleConfig().full_span_grid == "logit-normal"
    seen = torch.stack([c["t"] for c in net.denoise_log]).double()  # (calls, rows)
    for row, seed in enumerate((3, 4)):
        grid = master_grid(16, 1, grid_generator(seed))
        assert grid[0] == 0 and grid[-1] == 1 and torch.all(grid[1:] >= grid[:-1])
        assert torch.allclose(seen[:, row], grid[:-1].float().double())
        assert out.exit_time[row].item() == 1.0
    assert not torch.allclose(seen[:, 0], seen[:, 1])  # per-sample grids
    assert seen[1:, 0].median() < 0.4  # the points crowd where training drew most of its t (median 0.18)
    _, alone_net, *_ = _run("full-span", nfe=16, seeds=(4,))
    assert torch.equal(torch.stack([c["t"][0] for c in alone_net.denoise_log]), seen[:, 1].float())
    with pytest.raises(ConfigError, match="sample.full_span_grid"):
        SampleConfig(full_span_grid="cosine").validate()


def test_renoise_ends_at_early_stop_t_star_and_follows_the_renoise_rule():
    nfe, seed, eta = 12, 4, 1.2
    out, net, states, mask, target, x_hat, reg_hat = _run("renoise", nfe=nfe, seeds=(seed,), renoise_eta=eta)
    t_star = master_grid(nfe, 8, grid_generator(seed))[nfe - 2].item()
    times = power_schedule(nfe, t_star, 0.5)
    assert out.denoiser_calls.item() == nfe - 1 and out.decoder_calls.item() == 1
    assert out.exit_time.item() == pytest.approx(t_star, abs=1e-15)
    seen = torch.stack([c["t"][0] for c in net.denoise_log]).double()
    assert torch.allclose(seen, times.float().double())
    _, _, g = _initial_noise(seed)  # fresh noise follows the initial draws of the same generator
    xi, xr = torch.randn((10, 6), generator=g), torch.randn((4,), generator=g)
    t1 = times[1].float()
    z1, call1 = t1 * x_hat + (1 - t1) * eta * SIGMA * xi, net.denoise_log[1]
    assert torch.allclose(call1["z"][0][~mask[0]], z1[~mask[0]], atol=1e-6)
    assert torch.allclose(call1["reg"][0], t1 * reg_hat + (1 - t1) * eta * SIGMA * xr, atol=1e-6)
    assert torch.equal(call1["z"][mask], states[mask])
    assert torch.equal(call1["q"][0][~mask[0]], x_hat[~mask[0]])  # previous clean prediction
    assert torch.equal(net.decode_log[0]["x"][0][~mask[0]], x_hat[~mask[0]])
    assert torch.equal(out.token_ids[0][~mask[0]], target[~mask[0]])


def test_renoise_with_eta_zero_is_deterministic():
    nfe = 10
    runs = [_run("renoise", nfe=nfe, seeds=(s,), renoise_eta=0.0)[1] for s in (0, 0, 1)]
    # With η = 0 every input after the first is t_{i+1}·x̂ exactly, whatever the noise seed.
    for net in runs:
        x_hat, reg_hat = net.x_hat, net.reg_hat
        for call in net.denoise_log[1:]:
            t, mask = call["t"][0], call["prompt_mask"][0]
            assert torch.equal(call["z"][0][~mask], (t * x_hat)[~mask])
            assert torch.equal(call["reg"][0], t * reg_hat)
    assert all(torch.equal(a["z"], b["z"]) for a, b in zip(runs[0].denoise_log, runs[1].denoise_log, strict=True))
    assert not torch.equal(runs[0].denoise_log[0]["z"], runs[2].denoise_log[0]["z"])  # y_0 differs by seed
    noisy = [_run("renoise", nfe=nfe, seeds=(0,), renoise_eta=1.2)[1] for _ in range(2)]
    assert torch.equal(noisy[0].denoise_log[3]["z"], noisy[1].denoise_log[3]["z"])  # same seed, same draws
    assert not torch.equal(noisy[0].denoise_log[3]["z"], runs[0].denoise_log[3]["z"])


def test_prompt_cfg_costs_two_calls_per_step_and_guides_the_prediction():
    states, mask, _, x_hat, codebook, reg_hat = make_problem(batch=2)
    net = FixedNetwork(x_hat, codebook, reg_hat, prompt_gain=1.0)
    out = run_sampler(net, states, mask, [0, 1], SampleConfig(sampler="early-stop", nfe=8, prompt_cfg=2.5))
    assert out.denoiser_calls.tolist() == [14, 14] and out.decoder_calls.tolist() == [1, 1]
    assert out.nfe.tolist() == [15, 15]
    call = net.denoise_log[0]
    assert call["z"].shape[0] == 4  # conditional and prompt-dropped rows in one forward
    assert torch.equal(call["z"][:2][mask], states[mask]) and torch.all(call["z"][2:][mask] == 0)
    # the prompt-dropped rows lose the prompt from the self-conditioning input too (ELF's sampler)
    for later in (call, net.denoise_log[3]):
        assert torch.equal(later["q"][:2][mask], states[mask]) and torch.all(later["q"][2:][mask] == 0)
    m = mask[..., None].float()
    prompt_mean = (states * m).sum(1, keepdim=True) / m.sum(1, keepdim=True)
    expect = x_hat + 2.5 * prompt_mean  # uncond x̂ + 2.5·(cond − uncond)
    got = net.decode_log[0]["x"]
    assert torch.allclose(got[~mask], expect.expand(2, -1, -1)[~mask], atol=1e-5)
    assert torch.equal(got[mask], states[mask])


def test_counting_is_per_sample_and_students_without_reg_work():
    out, net, *_ = _run("early-stop", nfe=9, seeds=(0, 1, 2), d_r=None)
    assert out.nfe.tolist() == [9, 9, 9]
    assert all(call["reg"] is None for call in net.denoise_log) and net.decode_log[0]["reg"] is None
    assert all(call["z"].shape[0] == 3 for call in net.denoise_log)  # one batched forward per step


def test_settings_are_validated_with_the_key_named():
    states, mask, _, x_hat, codebook, reg_hat = make_problem(batch=1)
    net = FixedNetwork(x_hat, codebook, reg_hat)
    for bad, key in ((dict(sampler="ddim"), "sample.sampler"), (dict(nfe=1), "sample.nfe"),
                     (dict(adaptive_patience=0), "sample.adaptive_patience"), (dict(rho=0), "sample.rho")):
        with pytest.raises(ConfigError, match=key):
            run_sampler(net, states, mask, [0], SampleConfig(**bad))
        with pytest.raises(ConfigError, match=key):
            SampleConfig().replace(**bad)
    assert not net.denoise_log  # nothing ran


def test_every_configurable_sampler_has_exactly_one_spec():
    from typing import get_args, get_type_hints

    from elfreg.config import SAMPLERS
    from elfreg.sampling import SAMPLER_SPECS

    assert tuple(SAMPLER_SPECS) == SAMPLERS == get_args(get_type_hints(SampleConfig)["sampler"])


def test_reg_off_samples_no_reg_state_and_keeps_the_text_noise():
    on, net_on, *_ = _run("early-stop", nfe=8, seeds=(3,))
    off, net_off, states, mask, target, x_hat, _ = _run("early-stop", nfe=8, seeds=(3,), reg=False)
    assert off.nfe.tolist() == on.nfe.tolist() == [8]
    assert all(call["reg"] is None and call["reg_q"] is None for call in net_off.denoise_log)
    assert net_off.decode_log[0]["reg"] is None and net_on.decode_log[0]["reg"] is not None
    assert torch.equal(net_off.denoise_log[0]["z"], net_on.denoise_log[0]["z"])  # same y_0 for the text
    assert torch.equal(off.token_ids[0][~mask[0]], target[~mask[0]])


@pytest.mark.parametrize("mode", ["schedule", "renoise"])
def test_renoise_parts_take_the_grid_and_the_move_apart(mode):
    nfe, seed, eta = 10, 4, 1.2
    out, net, states, mask, _, x_hat, reg_hat = _run("renoise", nfe=nfe, seeds=(seed,), renoise_mode=mode,
                                                     renoise_eta=eta)
    master = master_grid(nfe, 8, grid_generator(seed))
    t_star = master[nfe - 2].item()
    times = power_schedule(nfe, t_star, 0.5) if mode == "schedule" else master[:nfe - 1]
    seen = torch.stack([c["t"][0] for c in net.denoise_log]).double()
    assert out.denoiser_calls.item() == nfe - 1 and out.decoder_calls.item() == 1
    assert torch.allclose(seen, times.float().double())
    assert out.exit_time.item() == pytest.approx(t_star, abs=1e-15)  # both parts exit at early-stop's t★
    first, second = net.denoise_log[0], net.denoise_log[1]
    t0, t1 = times[0].float(), times[1].float()
    if mode == "schedule":  # Euler on the re-noising schedule: no fresh noise
        expect = first["z"][0] + (t1 - t0) * (x_hat - first["z"][0]) / max(1 - t0.item(), 0.05)
    else:  # fresh noise re-injected on the early-stop grid
        _, _, g = _initial_noise(seed)
        expect = t1 * x_hat + (1 - t1) * eta * SIGMA * torch.randn((10, 6), generator=g)
    assert torch.allclose(second["z"][0][~mask[0]], expect[~mask[0]], atol=1e-5)
    assert torch.equal(second["z"][mask], states[mask])


def test_sde_steps_back_with_fresh_noise_then_moves_by_eq12_and_its_last_step_is_euler():
    """ELF's SDE step: α_j = clip(1 − γ·h_j, 0, 1), the call at (α_j·y_j + (1 − α_j)·σ·ξ_j, α_j·t_j),
    Eq. 12 from α_j·t_j to t_{j+1}; one text and one REG draw per step but the last."""
    nfe, seed, gamma = 6, 5, 1.5
    out, net, states, mask, target, x_hat, reg_hat = _run("sde", nfe=nfe, seeds=(seed,), sde_gamma=gamma)
    assert out.denoiser_calls.item() == nfe - 1 and out.decoder_calls.item() == 1 and out.exit_time.item() == 1.0
    grid = master_grid(nfe, 1, grid_generator(seed))  # full-span's (ELF's) grid
    y, r, g = _initial_noise(seed)
    answer = ~mask[0]
    for j, call in enumerate(net.denoise_log):
        t, t_next = grid[j].item(), grid[j + 1].item()
        if j < nfe - 2:
            alpha = min(1.0, max(0.0, 1 - gamma * (t_next - t)))
            xi, xr = torch.randn((10, 6), generator=g), torch.randn((4,), generator=g)
            y, r, t = alpha * y + (1 - alpha) * SIGMA * xi, alpha * r + (1 - alpha) * SIGMA * xr, alpha * t
        assert call["t"][0].item() == pytest.approx(t, abs=1e-7)
        assert torch.allclose(call["z"][0][answer], y[answer], atol=1e-5)
        assert torch.allclose(call["reg"][0], r, atol=1e-5)
        assert torch.equal(call["z"][mask], states[mask])  # the prompt stays clean
        y = y + (t_next - t) * (x_hat - y) / max(1 - t, 0.05)
        r = r + (t_next - t) * (reg_hat - r) / max(1 - t, 0.05)
    assert torch.allclose(net.decode_log[0]["x"][0][answer], y[answer], atol=1e-5)  # the final state
    assert torch.equal(out.token_ids[0][answer], target[answer])


def test_sde_at_gamma_zero_is_full_span_and_its_noise_is_per_sample():
    full, full_net, *_ = _run("full-span", nfe=7, seeds=(2, 3))
    flat, flat_net, *_ = _run("sde", nfe=7, seeds=(2, 3), sde_gamma=0.0)
    assert all(torch.equal(a["z"], b["z"]) and torch.equal(a["t"], b["t"])
               for a, b in zip(full_net.denoise_log, flat_net.denoise_log, strict=True))
    churned, churned_net, *_ = _run("sde", nfe=7, seeds=(2, 3), sde_gamma=1.0)
    assert not torch.equal(churned_net.denoise_log[1]["z"], full_net.denoise_log[1]["z"])
    other, other_net, *_ = _run("sde", nfe=7, seeds=(9, 3), sde_gamma=1.0)  # seed 3's row beside another seed
    assert all(torch.equal(a["z"][1], b["z"][1]) for a, b in zip(churned_net.denoise_log, other_net.denoise_log,
                                                                 strict=True))
    assert not torch.equal(churned_net.denoise_log[1]["z"][0], other_net.denoise_log[1]["z"][0])
    with pytest.raises(ConfigError, match="sample.sde_gamma"):
        SampleConfig(sampler="sde", sde_gamma=-0.5).validate()


class _SelfConditionedNetwork(FixedNetwork):
    """x̂ = base + 2·q at answer positions, w not an input (no SC-CFG tokens): guided by calls."""

    guides_self_conditioning = True

    def prediction(self, z, prompt_mask, q=None):
        return torch.where(prompt_mask[..., None], z, super().prediction(z, prompt_mask) + 2 * q)

    def denoise(self, z, q, t, w, prompt_mask, reg, reg_q):
        self.denoise_log.append(self._clone(z=z, q=q, t=t, w=w, prompt_mask=prompt_mask))
        return self.prediction(z, prompt_mask, q), None


@pytest.mark.parametrize("prompt_cfg", [1.0, 2.0])
def test_a_network_without_w_as_input_is_guided_by_a_second_call_as_elfs_sampler_does(prompt_cfg):
    """ELF's _forward_sample_self_cond for a model without SC-CFG tokens: the row with zero
    self-conditioning first, then the row with q, d = d(0) + w·(d(q) − d(0)); one more call per row."""
    states, mask, _, x_hat, codebook, _ = make_problem(batch=2, d_r=None)
    net = _SelfConditionedNetwork(x_hat, codebook)
    w = 3.0
    out = run_sampler(net, states, mask, [0, 1], SampleConfig(sampler="full-span", nfe=4, sc_cfg=w,
                                                              prompt_cfg=prompt_cfg))
    per_step = 2 * (2 if prompt_cfg != 1.0 else 1)
    assert out.denoiser_calls.tolist() == [3 * per_step] * 2 and out.decoder_calls.tolist() == [1, 1]
    # rows of a forward: per prompt branch, zero self-conditioning then q (ELF's call order)
    second, third = net.denoise_log[1], net.denoise_log[2]
    assert second["z"].shape[0] == 2 * per_step
    zero_q = second["q"][:2]
    assert torch.all(zero_q[~mask] == 0) and torch.equal(zero_q[mask], states[mask])  # the prompt kept
    # guided: d = x̂ + 2·w·q; q_0 = 0 gives d_0 = x̂, so the third call's q is x̂ + 2·w·x̂
    answer = ~mask
    assert torch.allclose(second["q"][2:4][answer], x_hat.expand(2, -1, -1)[answer])
    assert torch.allclose(third["q"][2:4][answer], ((1 + 2 * w) * x_hat).expand(2, -1, -1)[answer], atol=1e-4)
    if prompt_cfg != 1.0:  # the dropped branch: no prompt in the state or in either q
        assert torch.all(second["z"][4:6][mask] == 0) and torch.all(second["q"][4:6] == 0)
    unguided = _SelfConditionedNetwork(x_hat, codebook)
    run_sampler(unguided, states, mask, [0, 1], SampleConfig(sampler="full-span", nfe=4, sc_cfg=1.0,
                                                             prompt_cfg=prompt_cfg))
    assert unguided.denoise_log[0]["z"].shape[0] == 2 * (per_step // 2)  # w = 1: ELF makes the one call
