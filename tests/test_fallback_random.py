"""Random ops that run on the CPU fallback (poisson, binomial, _standard_gamma, _sample_dirichlet:
Gamma, Beta, Dirichlet, StudentT, Poisson, Binomial sampling) draw from a CPU generator seeded from
the tpu generator (csrc/aten/cpu_fallback.cc): torch.tpu's seed and state replay them, and a tpu
Generator passed to them is accepted as it is by the lowered random ops."""
import warnings

import torch
from torch.distributions import Beta, Binomial, Dirichlet, Gamma, Poisson, StudentT

import torch_tpu  # noqa: F401

TPU = "tpu"


def _draw(r):
    return [Gamma(r, r).sample((4,)), Dirichlet(r).sample(), Poisson(r).sample(), Beta(r, r).rsample(),
            Binomial(10, probs=r / 4).sample(), StudentT(r).sample()]


def test_fallback_sampling_follows_the_tpu_generator():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the fallback's one warning per op
        r = torch.full((3,), 2.0, device=TPU)
        torch.manual_seed(0)
        state, cpu_state = torch.tpu.get_rng_state(), torch.get_rng_state()
        first = _draw(r)
        assert torch.equal(torch.get_rng_state(), cpu_state)  # CPU's generator did not move
        assert not torch.equal(torch.tpu.get_rng_state(), state)
        torch.tpu.set_rng_state(state)
        again = _draw(r)
        for a, b in zip(first, again):
            assert a.device.type == TPU and torch.equal(a.cpu(), b.cpu())
        gamma = Gamma(torch.full((1,), 2.0, device=TPU), torch.ones(1, device=TPU)).sample((20000,))
        assert abs(gamma.mean().item() - 2.0) < 0.05  # the distribution is CPU's kernel's


def test_fallback_sampling_takes_a_tpu_generator():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rates = torch.full((1000,), 3.0, device=TPU)
        g = torch.Generator(device=TPU)
        g.manual_seed(5)
        a = torch.poisson(rates, generator=g)
        g.manual_seed(5)
        b = torch.poisson(rates, generator=g)
        assert torch.equal(a.cpu(), b.cpu()) and abs(a.mean().item() - 3.0) < 0.3
