"""Fused optimizer steps: `_fused_adam_` and `_fused_adamw_` (float or tensor learning rate), what
torch.optim.Adam / AdamW(fused=True) call, Hugging Face Trainer's default optimizer
("adamw_torch_fused") among them; `_fused_sgd_` and `_fused_adagrad_` (SGD / Adagrad(fused=True)).
One program updates the whole parameter list in place.

The math is PyTorch's fused CPU kernel's, step for step (aten/src/ATen/native/cpu/FusedAdamKernel.cpp),
in the parameters' op-math dtype (float32 for half precision), so that tpu follows a CPU run:
  grad /= grad_scale (written back to grads), negated when maximize;
  weight decay: Adam adds weight_decay * param to the gradient, AdamW scales the parameter by
  1 - lr * weight_decay (neither when weight_decay is 0);
  exp_avg = lerp(exp_avg, grad, 1 - beta1) (PyTorch's two-sided lerp);
  exp_avg_sq = exp_avg_sq * beta2 + (1 - beta2) * grad * grad;
  denom = sqrt(exp_avg_sq, or its running max with amsgrad) / sqrt(1 - beta2^step) + eps;
  param -= (lr / (1 - beta1^step)) * exp_avg / denom;
and nothing changes where found_inf is 1 (the GradScaler's skipped step).
The optimizer's float hyperparameters travel as operands (Lowering.float_operands): a learning-rate
schedule changes no program."""
from __future__ import annotations

import torch

from .builder import Value
from .elementwise import compute_dtype
from .registry import register


def _scalar(b, v, dtype):
    """A hyperparameter as a 0-dim Value of `dtype`: an operand (eager), a python number (a compiled
    graph's constant) or a 0-dim / 1-element tensor (the tensor_lr overload)."""
    if isinstance(v, Value):
        return b.convert(b.reshape(v, ()), dtype)
    return b.constant(float(v), dtype)


def _full(b, v, dtype, shape):
    """A hyperparameter (as _scalar takes it) broadcast to a parameter's shape."""
    return b.broadcast_to(_scalar(b, v, dtype), shape)


def _gradient(b, p, g_in, grad_scale, maximize):
    """(op-math dtype, the gradient, the parameter, the gradient to write back) for one parameter, as
    the fused CPU kernels begin: grad / grad_scale (written back), negated when maximize."""
    cd = compute_dtype(p.dtype)
    g, pv = b.convert(g_in, cd), b.convert(p, cd)
    g_out = g_in
    if grad_scale is not None:
        g = b.divide(g, _full(b, grad_scale, cd, p.shape))
        g_out = b.convert(g, g_in.dtype)
    if maximize:
        g = b.negate(g)
    return cd, g, pv, g_out


def _l2(b, g, pv, weight_decay, cd):
    """g + weight_decay * param, where weight_decay is not 0 (a runtime operand: chosen in the program)."""
    wd = _scalar(b, weight_decay, cd)
    decay = b.broadcast_to(b.compare(wd, _scalar(b, 0.0, cd), "NE"), g.shape)
    return b.select(decay, b.add(g, b.multiply(pv, b.broadcast_to(wd, g.shape))), g)


def _adam(adamw: bool):
    def lower(ctx, params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, lr, beta1, beta2,
              weight_decay, eps, amsgrad, maximize, grad_scale=None, found_inf=None):
        b = ctx.b
        outs = {k: [] for k in ("p", "g", "m", "v", "mx")}
        for i, p in enumerate(params):
            g_in, m_in, v_in = grads[i], exp_avgs[i], exp_avg_sqs[i]
            cd, g, pv, g_out = _gradient(b, p, g_in, grad_scale, maximize)
            shape = p.shape

            def s(v):
                return _scalar(b, v, cd)

            def full(x):
                return b.broadcast_to(x, shape)
            one, half = s(1.0), s(0.5)
            lr_, b1, b2, wd, ep = s(lr), s(beta1), s(beta2), s(weight_decay), s(eps)
            if adamw:
                decay = b.compare(wd, s(0.0), "NE")
                pv = b.select(full(decay), b.multiply(pv, full(b.subtract(one, b.multiply(lr_, wd)))), pv)
            else:
                g = _l2(b, g, pv, weight_decay, cd)
            m = b.convert(m_in, cd)
            w = b.subtract(one, b1)  # lerp weight
            near = b.add(m, b.multiply(full(w), b.subtract(g, m)))
            far = b.subtract(g, b.multiply(b.subtract(g, m), full(b.subtract(one, w))))
            m = b.select(full(b.compare(b.abs(w), half, "LT")), near, far)
            v = b.add(b.multiply(b.convert(v_in, cd), full(b2)), b.multiply(b.multiply(full(b.subtract(one, b2)), g), g))
            step = s(state_steps[i])
            bc1 = b.subtract(one, b.power(b1, step))
            bc2_sqrt = b.sqrt(b.subtract(one, b.power(b2, step)))
            if amsgrad:
                mx = b.maximum(b.convert(max_exp_avg_sqs[i], cd), v)
                outs["mx"].append((mx, max_exp_avg_sqs[i]))
                root = b.sqrt(mx)
            else:
                root = b.sqrt(v)
            denom = b.add(b.divide(root, full(bc2_sqrt)), full(ep))
            pv = b.subtract(pv, b.divide(b.multiply(full(b.divide(lr_, bc1)), m), denom))
            outs["p"].append((pv, p))
            outs["g"].append((g_out, g_in))
            outs["m"].append((m, m_in))
            outs["v"].append((v, v_in))
        return _written(b, [outs[k] for k in ("p", "g", "m", "v", "mx")], found_inf)
    return lower


def _written(b, groups, found_inf):
    """The op's results, its written lists in schema order (each a list of (new value, the tensor it
    replaces)), in their tensors' dtypes; where found_inf is 1 each keeps its old value."""
    skip = None
    if found_inf is not None:
        skip = b.compare(_scalar(b, found_inf, torch.float32), b.constant(1.0, torch.float32), "EQ")
    result = []
    for group in groups:
        for new, old in group:
            new = b.convert(new, old.dtype)
            if skip is not None:
                new = b.select(b.broadcast_to(skip, old.shape), old, new)
            result.append(new)
    return result


def _sgd(ctx, params, grads, momentum_buffer_list, weight_decay, momentum, lr, dampening, nesterov, maximize,
         is_first_step, grad_scale=None, found_inf=None):
    """torch.optim.SGD(fused=True), PyTorch's fused CPU kernel's steps in the op-math dtype:
    grad /= grad_scale (written back), negated when maximize, plus weight_decay * param when
    weight_decay is not 0; with momentum (a buffer list), buf = grad on the first step, else
    momentum * buf + (1 - dampening) * grad, and the step is grad + momentum * buf (nesterov) or buf;
    param -= lr * step. Nothing changes where found_inf is 1."""
    b = ctx.b
    outs = {k: [] for k in ("p", "g", "buf")}
    for i, p in enumerate(params):
        g_in = grads[i]
        cd, g, pv, g_out = _gradient(b, p, g_in, grad_scale, maximize)
        g = _l2(b, g, pv, weight_decay, cd)
        if momentum_buffer_list:
            m_in = momentum_buffer_list[i]
            mom = _full(b, momentum, cd, p.shape)
            keep = _full(b, b.subtract(_scalar(b, 1.0, cd), _scalar(b, dampening, cd)), cd, p.shape)
            buf = g if is_first_step else b.add(b.multiply(b.convert(m_in, cd), mom), b.multiply(keep, g))
            outs["buf"].append((buf, m_in))
            g = b.add(g, b.multiply(mom, buf)) if nesterov else buf
        outs["p"].append((b.subtract(pv, b.multiply(_full(b, lr, cd, p.shape), g)), p))
        outs["g"].append((g_out, g_in))
    return _written(b, [outs[k] for k in ("p", "g", "buf")], found_inf)


def _adagrad(ctx, params, grads, state_sums, state_steps, lr, lr_decay, weight_decay, eps, maximize,
             grad_scale=None, found_inf=None):
    """torch.optim.Adagrad(fused=True), PyTorch's fused CPU kernel's steps in the op-math dtype:
    grad /= grad_scale (written back), negated when maximize, plus weight_decay * param when
    weight_decay is not 0; clr = lr / (1 + (step - 1) * lr_decay); state_sum += grad * grad;
    param -= clr * grad / (sqrt(state_sum) + eps). Nothing changes where found_inf is 1."""
    b = ctx.b
    outs = {k: [] for k in ("p", "g", "sum")}
    for i, p in enumerate(params):
        g_in, sum_in = grads[i], state_sums[i]
        cd, g, pv, g_out = _gradient(b, p, g_in, grad_scale, maximize)
        g = _l2(b, g, pv, weight_decay, cd)
        one = _scalar(b, 1.0, cd)
        decayed = b.multiply(b.subtract(_scalar(b, state_steps[i], cd), one), _scalar(b, lr_decay, cd))
        clr = b.divide(_scalar(b, lr, cd), b.add(one, decayed))
        total = b.add(b.convert(sum_in, cd), b.multiply(g, g))
        std = b.add(b.sqrt(total), _full(b, eps, cd, p.shape))
        outs["p"].append((b.subtract(pv, b.multiply(_full(b, clr, cd, p.shape), b.divide(g, std))), p))
        outs["g"].append((g_out, g_in))
        outs["sum"].append((total, sum_in))
    groups = [outs[k] for k in ("p", "g", "sum")]
    if len(ctx.out) > 3 * len(params):  # the float-lr overload marks state_steps written: they are kept
        groups.append([(step, step) for step in state_steps])
    return _written(b, groups, found_inf)


def _meta(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, *rest, **kw):
    """The ops write their lists in place and return nothing; PyTorch has no meta kernel for the
    tensor_lr overloads. The lists must match in length, as CPU's kernel checks."""
    n = len(params)
    for name, lst in (("grads", grads), ("exp_avgs", exp_avgs), ("exp_avg_sqs", exp_avg_sqs),
                      ("state_steps", state_steps)):
        if len(lst) != n:
            raise RuntimeError(f"_fused_adam: expected {name} to have {n} tensors (one per parameter), got {len(lst)}")
    return None


register("_fused_adam_", "_fused_adam_.tensor_lr", float_operands=True, meta=_meta)(_adam(adamw=False))
register("_fused_adamw_", "_fused_adamw_.tensor_lr", float_operands=True, meta=_meta)(_adam(adamw=True))


def _sgd_meta(params, grads, momentum_buffer_list, *rest, **kw):
    """Written in place, nothing returned; the lists' lengths as CPU's kernel checks them (no momentum
    buffers, or one per parameter)."""
    n = len(params)
    if len(grads) != n:
        raise RuntimeError(f"_fused_sgd: expected grads to have {n} tensors (one per parameter), got {len(grads)}")
    if momentum_buffer_list and len(momentum_buffer_list) != n:
        raise RuntimeError(f"_fused_sgd: expected momentum_buffer_list to have {n} tensors (one per parameter), "
                           f"got {len(momentum_buffer_list)}")
    return None


def _adagrad_meta(params, grads, state_sums, state_steps, *rest, **kw):
    n = len(params)
    for name, lst in (("grads", grads), ("state_sums", state_sums), ("state_steps", state_steps)):
        if len(lst) != n:
            raise RuntimeError(f"_fused_adagrad: expected {name} to have {n} tensors (one per parameter), "
                               f"got {len(lst)}")
    return None


register("_fused_sgd_", "_fused_sgd_.tensor_lr", float_operands=True, meta=_sgd_meta)(_sgd)
register("_fused_adagrad_", "_fused_adagrad_.tensor_lr", float_operands=True, meta=_adagrad_meta)(_adagrad)
