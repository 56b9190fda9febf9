"""The two ops torch.amp.GradScaler runs every step, on the device (no host sync, no CPU fallback):
`_amp_foreach_non_finite_check_and_unscale_` and `_amp_update_scale_`, with CUDA's kernels'
semantics (ATen's AmpKernels): gradients are multiplied by inv_scale in float32 and found_inf is set
to 1 when any gradient value was inf or NaN before scaling (it is never reset here); the scale backs
off on an overflow, and grows after `growth_interval` clean steps when the grown scale is finite."""
from __future__ import annotations

import torch

from .registry import register


def _scalar(b, v):
    """A one-element tensor Value as a 0-dim one."""
    return b.reshape(v, ())


@register("_amp_foreach_non_finite_check_and_unscale_")
def unscale(ctx, grads, found_inf, inv_scale):
    b = ctx.b
    inv = b.convert(_scalar(b, inv_scale), torch.float32)
    bad = b.constant(False, torch.bool)
    out = []
    for g in grads:
        g32 = b.convert(g, torch.float32)
        if g.type.numel:
            nonfinite = b.not_(b.unary("is_finite", g32, torch.bool))
            any_bad = b.reduce([nonfinite], [b.constant(False, torch.bool)], list(range(g.rank)),
                               lambda rb, x, y: [rb.or_(x, y)])[0]
            bad = b.or_(bad, any_bad)
        out.append(b.convert(b.multiply(g32, b.broadcast_to(inv, g.shape)), g.dtype))
    flag = b.select(b.broadcast_to(bad, found_inf.shape), b.full_like(found_inf, 1.0), found_inf)
    return [*out, flag]


@register("_amp_update_scale_")
def update_scale(ctx, scale, growth_tracker, found_inf, growth_factor, backoff_factor, growth_interval):
    b = ctx.b
    s = b.convert(_scalar(b, scale), torch.float32)
    tracker = _scalar(b, growth_tracker)
    found = b.compare(b.convert(_scalar(b, found_inf), torch.float32), b.constant(0.0, torch.float32), "NE")
    successful = b.add(tracker, b.constant(1, tracker.dtype))
    grow = b.compare(successful, b.constant(growth_interval, tracker.dtype), "EQ")
    grown = b.multiply(s, b.constant(growth_factor, torch.float32))
    grown = b.select(b.unary("is_finite", grown, torch.bool), grown, s)
    new_scale = b.select(found, b.multiply(s, b.constant(backoff_factor, torch.float32)),
                         b.select(grow, grown, s))
    zero = b.constant(0, tracker.dtype)
    new_tracker = b.select(found, zero, b.select(grow, zero, successful))
    return [b.reshape(b.convert(new_scale, scale.dtype), scale.shape),
            b.reshape(new_tracker, growth_tracker.shape)]
