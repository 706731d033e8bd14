import pytest
import torch

from elfreg.sampling import full_span_grid, grid_generator, master_grid, nominal_snr, power_schedule
from elfreg.sampling.grids import early_stop_prefix, grid_seed, last_prediction_time


def test_master_grid_shape_endpoints_and_order():
    g = master_grid(64, 8, torch.Generator().manual_seed(3))
    assert g.shape == (512,) and g.dtype == torch.float64
    assert g[0] == 0 and g[-1] == 1
    assert torch.all(g[1:] >= g[:-1])
    assert torch.all((g[1:-1] > 0) & (g[1:-1] < 1))
    assert torch.equal(g, master_grid(64, 8, torch.Generator().manual_seed(3)))
    assert not torch.equal(g, master_grid(64, 8, torch.Generator().manual_seed(4)))


def test_master_grid_interior_is_logit_normal():
    g = master_grid(500, 8, torch.Generator().manual_seed(0))[1:-1]
    logits = torch.logit(g)
    assert abs(logits.mean().item() + 1.5) < 0.03
    assert abs(logits.std().item() - 0.8) < 0.03


def test_t62_and_nominal_snr_over_1000_seeds_match_the_paper():
    # Paper (4 seeds): mean t_62 = 0.0825 (range 0.0755–0.0858), mean SNR ≈ 2.03e-3.
    t62 = torch.stack([master_grid(64, 8, grid_generator(s))[62] for s in range(1000)])
    assert 0.075 <= t62.mean().item() <= 0.087, t62.mean().item()
    snr = nominal_snr(t62, sigma=2.0).mean().item()
    assert 1.5e-3 <= snr <= 2.5e-3, snr
    prefix = early_stop_prefix(master_grid(64, 8, grid_generator(0)), 64)
    assert prefix.shape == (64,) and last_prediction_time(master_grid(64, 8, grid_generator(0)), 64) == prefix[62]


def test_grid_seed_decorrelates_neighbouring_seeds():
    seeds = [grid_seed(s) for s in range(100)]
    assert len(set(seeds)) == 100 and all(0 <= s < 2**63 for s in seeds)
    assert all(grid_seed(s) != s for s in range(100))


def test_full_span_grid_is_uniform_and_ends_at_one():
    g = full_span_grid(64)
    assert g.shape == (64,) and g[0] == 0 and g[-1] == 1
    assert torch.allclose(g[1:] - g[:-1], torch.full((63,), 1 / 63, dtype=torch.float64))
    with pytest.raises(ValueError):
        full_span_grid(1)


def test_power_schedule_ends_at_t_star_and_crowds_the_exit():
    t = power_schedule(64, 0.08, 0.5)
    assert t.shape == (63,) and t[0] == 0 and t[-1].item() == pytest.approx(0.08, abs=1e-15)
    gaps = t[1:] - t[:-1]
    assert torch.all(gaps[1:] < gaps[:-1])  # p < 1: the steps shrink towards t★
    assert torch.allclose(power_schedule(10, 0.5, 1.0), torch.linspace(0, 0.5, 9, dtype=torch.float64))
    assert torch.equal(power_schedule(2, 0.3, 0.5), torch.zeros(1, dtype=torch.float64))
