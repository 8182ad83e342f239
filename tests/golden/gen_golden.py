#!/usr/bin/env python3
"""Generates tests/golden/golden_values.h: reference values computed once with
PyTorch (Debian's python3-torch) for the nn / optim unit tests.

    /usr/bin/python3 tests/golden/gen_golden.py > tests/golden/golden_values.h

The tests themselves never need torch. Inputs and weights are not stored:
both sides generate them from the same integer hash (see `vals` here and
golden_vals() in tests/unit/test_nn_golden_common.h), so only results are
committed. References are computed in float64 from the float32 inputs.
Each tensor is stored as its element count, sum of |x|, max |x| and up to
256 evenly strided samples.
"""
import math
import sys

import numpy as np
import torch
import torch.nn.functional as F

torch.set_default_dtype(torch.float64)
M64 = (1 << 64) - 1
MAX_SAMPLES = 256


def fnv1a(s):
    h = 0x811C9DC5
    for ch in s.encode():
        h ^= ch
        h = (h * 0x01000193) & 0xFFFFFFFF
    return h


def vals(n, key, scale):
    """n float32 values in [-scale, scale): splitmix64 of (fnv1a(key) << 32) + i + 1."""
    salt = np.uint64(fnv1a(key)) << np.uint64(32)
    z = salt + np.arange(1, n + 1, dtype=np.uint64)
    with np.errstate(over="ignore"):
        z = z * np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    u = (z >> np.uint64(40)).astype(np.float32) * np.float32(1.0 / 16777216.0)
    return (u * np.float32(2.0) - np.float32(1.0)) * np.float32(scale)


def ints(n, key, mod):
    """n integers in [0, mod): the same hash, top bits modulo mod."""
    salt = np.uint64(fnv1a(key)) << np.uint64(32)
    z = salt + np.arange(1, n + 1, dtype=np.uint64)
    with np.errstate(over="ignore"):
        z = z * np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    return ((z >> np.uint64(33)) % np.uint64(mod)).astype(np.int64)


def param_scale(shape):
    """1/sqrt(fan_in) for weights (rounded to float32 as the C side), 0.5 for vectors."""
    if len(shape) >= 2:
        fan_in = int(np.prod(shape[1:]))
        return float(np.float32(1.0 / math.sqrt(fan_in)))
    return 0.5


def gen_param(case, name, shape):
    n = int(np.prod(shape)) if shape else 1
    return torch.tensor(vals(n, case + "/" + name, param_scale(shape)).astype(np.float64)).reshape(shape)


def gen_input(case, shape, scale=1.0, name="x"):
    n = int(np.prod(shape))
    return torch.tensor(vals(n, case + "/" + name, scale).astype(np.float64)).reshape(shape)


OUT = []   # (key, tensor)


def emit(key, t):
    OUT.append((key, t.detach().to(torch.float64).reshape(-1).numpy().copy()))


# ---- layers: y = f(x), loss = sum(y * r) so every gradient is exercised ----

def layer_case(case, x_shape, fn, params, x_scale=1.0, extra=None):
    x = gen_input(case, x_shape, x_scale).requires_grad_(True)
    ps = {name: gen_param(case, name, shape).requires_grad_(True) for name, shape in params}
    y = fn(x, ps)
    r = gen_input(case, tuple(y.shape), 1.0, "r")
    (y * r).sum().backward()
    emit(case + "/y", y)
    emit(case + "/grad/x", x.grad)
    for name, _ in params:
        emit(case + "/grad/" + name, ps[name].grad)
    if extra:
        extra(ps)


def linear(x, w, b):
    return x @ w.T + (b if b is not None else 0)


layer_case("linear", (2, 3, 6), lambda x, p: linear(x, p["weight"], p["bias"]),
           [("weight", (4, 6)), ("bias", (4,))])
layer_case("linear_nobias", (4, 5), lambda x, p: linear(x, p["weight"], None), [("weight", (3, 5))])
layer_case("conv", (2, 3, 7, 7), lambda x, p: F.conv2d(x, p["weight"], p["bias"]),
           [("weight", (4, 3, 3, 3)), ("bias", (4,))])
layer_case("conv_s2p1", (2, 2, 8, 8), lambda x, p: F.conv2d(x, p["weight"], p["bias"], stride=2, padding=1),
           [("weight", (6, 2, 3, 3)), ("bias", (6,))])
layer_case("conv_g2d2", (1, 4, 9, 9),
           lambda x, p: F.conv2d(x, p["weight"], None, dilation=2, groups=2), [("weight", (6, 2, 3, 3))])
layer_case("maxpool", (2, 3, 6, 6), lambda x, p: F.max_pool2d(x, 2), [])
layer_case("maxpool_k3s2p1", (1, 2, 7, 7), lambda x, p: F.max_pool2d(x, 3, 2, 1), [])
layer_case("avgpool", (2, 3, 6, 6), lambda x, p: F.avg_pool2d(x, 2), [])
layer_case("avgpool_k3s2p1", (1, 2, 7, 7), lambda x, p: F.avg_pool2d(x, 3, 2, 1), [])
layer_case("adaptive", (2, 3, 6, 6), lambda x, p: F.adaptive_avg_pool2d(x, (2, 3)), [])
layer_case("adaptive_odd", (1, 2, 7, 5), lambda x, p: F.adaptive_avg_pool2d(x, (3, 2)), [])
layer_case("flatten", (2, 3, 4), lambda x, p: torch.flatten(x, 1), [])
layer_case("relu", (3, 7), lambda x, p: F.relu(x), [], 3.0)
layer_case("gelu", (3, 7), lambda x, p: F.gelu(x), [], 3.0)
layer_case("gelu_tanh", (3, 7), lambda x, p: F.gelu(x, approximate="tanh"), [], 3.0)
layer_case("silu", (3, 7), lambda x, p: F.silu(x), [], 3.0)
layer_case("tanh", (3, 7), lambda x, p: torch.tanh(x), [], 3.0)
layer_case("sigmoid", (3, 7), lambda x, p: torch.sigmoid(x), [], 3.0)
layer_case("log_softmax", (3, 7), lambda x, p: F.log_softmax(x, 1), [], 3.0)


def bn_train(x, p):
    rm = torch.zeros(3)
    rv = torch.ones(3)
    y = F.batch_norm(x, rm, rv, p["weight"], p["bias"], training=True, momentum=0.1, eps=1e-5)
    emit("batchnorm_train/running_mean", rm)
    emit("batchnorm_train/running_var", rv)
    return y


layer_case("batchnorm_train", (4, 3, 5, 5), bn_train, [("weight", (3,)), ("bias", (3,))])


def bn_eval(x, p):
    rm = gen_input("batchnorm_eval", (3,), 0.5, "running_mean")
    rv = gen_input("batchnorm_eval", (3,), 0.5, "running_var").abs() + 0.5
    return F.batch_norm(x, rm, rv, p["weight"], p["bias"], training=False, eps=1e-5)


layer_case("batchnorm_eval", (4, 3, 5, 5), bn_eval, [("weight", (3,)), ("bias", (3,))])
layer_case("layernorm", (2, 3, 8), lambda x, p: F.layer_norm(x, (8,), p["weight"], p["bias"], 1e-5),
           [("weight", (8,)), ("bias", (8,))])
layer_case("sequential", (4, 6),
           lambda x, p: linear(F.relu(linear(x, p["0.weight"], p["0.bias"])), p["2.weight"], p["2.bias"]),
           [("0.weight", (8, 6)), ("0.bias", (8,)), ("2.weight", (3, 8)), ("2.bias", (3,))])

D, H, T = 16, 4, 5


def block(x, p):
    def attn(h):
        B = h.shape[0]
        qkv = linear(h, p["attn.qkv.weight"], p["attn.qkv.bias"])
        q, k, v = qkv.split(D, dim=2)
        q, k, v = (t.reshape(B, T, H, D // H).transpose(1, 2) for t in (q, k, v))
        att = q @ k.transpose(-2, -1) / math.sqrt(D // H)
        att = att.masked_fill(~torch.tril(torch.ones(T, T, dtype=torch.bool)), float("-inf"))
        y = F.softmax(att, dim=-1) @ v
        y = y.transpose(1, 2).reshape(B, T, D)
        return linear(y, p["attn.proj.weight"], p["attn.proj.bias"])

    x = x + attn(F.layer_norm(x, (D,), p["ln_1.weight"], p["ln_1.bias"], 1e-5))
    h = F.layer_norm(x, (D,), p["ln_2.weight"], p["ln_2.bias"], 1e-5)
    h = linear(F.gelu(linear(h, p["mlp.0.weight"], p["mlp.0.bias"])), p["mlp.2.weight"], p["mlp.2.bias"])
    return x + h


layer_case("transformer", (2, T, D), block,
           [("ln_1.weight", (D,)), ("ln_1.bias", (D,)), ("attn.qkv.weight", (3 * D, D)),
            ("attn.qkv.bias", (3 * D,)), ("attn.proj.weight", (D, D)), ("attn.proj.bias", (D,)),
            ("ln_2.weight", (D,)), ("ln_2.bias", (D,)), ("mlp.0.weight", (4 * D, D)), ("mlp.0.bias", (4 * D,)),
            ("mlp.2.weight", (D, 4 * D)), ("mlp.2.bias", (D,))])

# Embedding: integer input, gradient of the table only.
w = gen_param("embedding", "weight", (10, 4)).requires_grad_(True)
idx = torch.tensor(ints(10, "embedding/idx", 10)).reshape(2, 5)
y = F.embedding(idx, w)
(y * gen_input("embedding", tuple(y.shape), 1.0, "r")).sum().backward()
emit("embedding/y", y)
emit("embedding/grad/weight", w.grad)

# ---- losses: scalar loss, gradient of the logits ----


def loss_case(case, fn, ignore=None):
    z = gen_input(case, (6, 5), 2.0).requires_grad_(True)
    t = torch.tensor(ints(6, case + "/t", 5))
    if ignore is not None:
        t[1] = ignore
        t[4] = ignore
    loss = fn(z, t)
    loss.backward()
    emit(case + "/loss", loss)
    emit(case + "/grad/x", z.grad)


loss_case("nll_mean", lambda z, t: F.nll_loss(F.log_softmax(z, 1), t))
loss_case("nll_sum", lambda z, t: F.nll_loss(F.log_softmax(z, 1), t, reduction="sum"))
loss_case("nll_ignore", lambda z, t: F.nll_loss(F.log_softmax(z, 1), t, ignore_index=-100), ignore=-100)
loss_case("ce_mean", lambda z, t: F.cross_entropy(z, t))
loss_case("ce_sum", lambda z, t: F.cross_entropy(z, t, reduction="sum"))
loss_case("ce_ignore", lambda z, t: F.cross_entropy(z, t, ignore_index=3), ignore=3)
loss_case("ce_smooth", lambda z, t: F.cross_entropy(z, t, label_smoothing=0.1))
loss_case("ce_smooth_ignore", lambda z, t: F.cross_entropy(z, t, ignore_index=-100, label_smoothing=0.2),
          ignore=-100)
for red in ("mean", "sum"):
    z = gen_input("mse_" + red, (4, 3), 1.0).requires_grad_(True)
    y = gen_input("mse_" + red, (4, 3), 1.0, "target")
    loss = F.mse_loss(z, y, reduction=red)
    loss.backward()
    emit("mse_%s/loss" % red, loss)
    emit("mse_%s/grad/x" % red, z.grad)

# ---- the whole cnn step: loss and every gradient ----

CNN = [("conv1.weight", (32, 1, 3, 3)), ("conv1.bias", (32,)), ("conv2.weight", (64, 32, 3, 3)),
       ("conv2.bias", (64,)), ("fc1.weight", (128, 9216)), ("fc1.bias", (128,)), ("fc2.weight", (10, 128)),
       ("fc2.bias", (10,))]
p = {name: gen_param("cnn", name, shape).requires_grad_(True) for name, shape in CNN}
x = gen_input("cnn", (4, 1, 28, 28), 1.0)
t = torch.tensor(ints(4, "cnn/t", 10))
h = F.relu(F.conv2d(x, p["conv1.weight"], p["conv1.bias"]))
h = F.relu(F.conv2d(h, p["conv2.weight"], p["conv2.bias"]))
h = torch.flatten(F.max_pool2d(h, 2), 1)
h = F.relu(linear(h, p["fc1.weight"], p["fc1.bias"]))
loss = F.nll_loss(F.log_softmax(linear(h, p["fc2.weight"], p["fc2.bias"]), 1), t)
loss.backward()
emit("cnn/loss", loss)
for name, _ in CNN:
    emit("cnn/grad/" + name, p[name].grad)

# ---- optimizers: 10 steps on a fixed least-squares problem ----

OPT_X = gen_input("opt", (8, 4), 1.0, "x")
OPT_Y = gen_input("opt", (8, 5), 1.0, "y")


def opt_case(case, make):
    w = gen_param("opt", "weight", (5, 4)).requires_grad_(True)
    b = gen_param("opt", "bias", (5,)).requires_grad_(True)
    opt = make([w, b])
    for _ in range(10):
        opt.zero_grad(set_to_none=True)
        F.mse_loss(linear(OPT_X, w, b), OPT_Y).backward()
        opt.step()
    emit(case + "/weight", w)
    emit(case + "/bias", b)


opt_case("sgd", lambda ps: torch.optim.SGD(ps, lr=0.1))
opt_case("sgd_momentum", lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, dampening=0.1, weight_decay=0.01))
opt_case("sgd_nesterov", lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.001))
opt_case("adam", lambda ps: torch.optim.Adam(ps, lr=0.01, foreach=False))
opt_case("adam_wd_amsgrad", lambda ps: torch.optim.Adam(ps, lr=0.02, weight_decay=0.1, amsgrad=True, foreach=False))
opt_case("adamw", lambda ps: torch.optim.AdamW(ps, lr=0.01, weight_decay=0.05, foreach=False))
opt_case("adamw_amsgrad", lambda ps: torch.optim.AdamW(ps, lr=0.01, betas=(0.8, 0.99), eps=1e-6,
                                                       weight_decay=0.01, amsgrad=True, foreach=False))

# clip_grad_norm_ after one backward of the same problem
w = gen_param("opt", "weight", (5, 4)).requires_grad_(True)
b = gen_param("opt", "bias", (5,)).requires_grad_(True)
F.mse_loss(linear(OPT_X, w, b), OPT_Y).backward()
norm = torch.nn.utils.clip_grad_norm_([w, b], 0.5)
emit("clip/norm", norm)
emit("clip/grad/weight", w.grad)
emit("clip/grad/bias", b.grad)

# ---- learning-rate schedules: lr at steps 0..11 ----


def sched_case(case, make):
    p = torch.zeros(1, requires_grad=True)
    opt = torch.optim.SGD([p], lr=0.1)
    s = make(opt)
    lrs = []
    for _ in range(12):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        s.step()
    emit(case + "/lr", torch.tensor(lrs))


S = torch.optim.lr_scheduler
sched_case("sched_step", lambda o: S.StepLR(o, step_size=3, gamma=0.5))
sched_case("sched_cosine", lambda o: S.CosineAnnealingLR(o, T_max=10, eta_min=0.001))
sched_case("sched_warmup_cosine", lambda o: S.SequentialLR(
    o, [S.LinearLR(o, start_factor=0.25, total_iters=4), S.CosineAnnealingLR(o, T_max=8, eta_min=0.0)],
    milestones=[4]))

# ---- a tiny GPT (nanoGPT with bias, dropout 0, lm_head tied to wte) ----
# loss and every gradient, then the parameters after two AdamW steps on the
# same batch (the gpt recipe's betas and eps; weight decay on 2-D only)

GPT_L, GPT_H, GPT_C, GPT_T, GPT_V, GPT_B = 2, 2, 32, 16, 256, 2


def gpt_params():
    shapes = [("transformer.wte.weight", (GPT_V, GPT_C)), ("transformer.wpe.weight", (GPT_T, GPT_C))]
    for i in range(GPT_L):
        h = "transformer.h.%d." % i
        shapes += [(h + "ln_1.weight", (GPT_C,)), (h + "ln_1.bias", (GPT_C,)),
                   (h + "attn.c_attn.weight", (3 * GPT_C, GPT_C)), (h + "attn.c_attn.bias", (3 * GPT_C,)),
                   (h + "attn.c_proj.weight", (GPT_C, GPT_C)), (h + "attn.c_proj.bias", (GPT_C,)),
                   (h + "ln_2.weight", (GPT_C,)), (h + "ln_2.bias", (GPT_C,)),
                   (h + "mlp.c_fc.weight", (4 * GPT_C, GPT_C)), (h + "mlp.c_fc.bias", (4 * GPT_C,)),
                   (h + "mlp.c_proj.weight", (GPT_C, 4 * GPT_C)), (h + "mlp.c_proj.bias", (GPT_C,))]
    shapes += [("transformer.ln_f.weight", (GPT_C,)), ("transformer.ln_f.bias", (GPT_C,))]
    return shapes


def gpt_forward(p, idx, tgt):
    B, T = idx.shape
    x = p["transformer.wte.weight"][idx] + p["transformer.wpe.weight"][:T]
    hd = GPT_C // GPT_H
    for i in range(GPT_L):
        h = "transformer.h.%d." % i
        a = F.layer_norm(x, (GPT_C,), p[h + "ln_1.weight"], p[h + "ln_1.bias"], 1e-5)
        q, k, v = linear(a, p[h + "attn.c_attn.weight"], p[h + "attn.c_attn.bias"]).split(GPT_C, dim=2)
        q, k, v = (t.reshape(B, T, GPT_H, hd).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(hd)
        att = att.masked_fill(~torch.tril(torch.ones(T, T, dtype=torch.bool)), float("-inf"))
        y = (F.softmax(att, dim=-1) @ v).transpose(1, 2).reshape(B, T, GPT_C)
        x = x + linear(y, p[h + "attn.c_proj.weight"], p[h + "attn.c_proj.bias"])
        m = F.layer_norm(x, (GPT_C,), p[h + "ln_2.weight"], p[h + "ln_2.bias"], 1e-5)
        m = F.gelu(linear(m, p[h + "mlp.c_fc.weight"], p[h + "mlp.c_fc.bias"]))
        x = x + linear(m, p[h + "mlp.c_proj.weight"], p[h + "mlp.c_proj.bias"])
    x = F.layer_norm(x, (GPT_C,), p["transformer.ln_f.weight"], p["transformer.ln_f.bias"], 1e-5)
    logits = x @ p["transformer.wte.weight"].T
    return logits, F.cross_entropy(logits.reshape(-1, GPT_V), tgt.reshape(-1))


GPT_SHAPES = gpt_params()
gp = {name: gen_param("gpt", name, shape).requires_grad_(True) for name, shape in GPT_SHAPES}
g_idx = torch.tensor(ints(GPT_B * GPT_T, "gpt/idx", GPT_V)).reshape(GPT_B, GPT_T)
g_tgt = torch.tensor(ints(GPT_B * GPT_T, "gpt/targets", GPT_V)).reshape(GPT_B, GPT_T)
g_logits, g_loss = gpt_forward(gp, g_idx, g_tgt)
g_loss.backward()
emit("gpt/loss", g_loss)
emit("gpt/logits", g_logits)
for name, _ in GPT_SHAPES:
    emit("gpt/grad/" + name, gp[name].grad)
g_opt = torch.optim.AdamW([{"params": [gp[n] for n, s in GPT_SHAPES if len(s) >= 2], "weight_decay": 0.1},
                           {"params": [gp[n] for n, s in GPT_SHAPES if len(s) < 2], "weight_decay": 0.0}],
                          lr=1e-3, betas=(0.9, 0.99), eps=1e-8, foreach=False)
g_opt.step()
g_opt.zero_grad(set_to_none=True)
_, g_loss2 = gpt_forward(gp, g_idx, g_tgt)
g_loss2.backward()
g_opt.step()
emit("gpt/loss2", g_loss2)
for name, _ in GPT_SHAPES:
    emit("gpt/step2/" + name, gp[name])

# ---- write the header ----

w = sys.stdout.write
w("/* Generated by tests/golden/gen_golden.py with PyTorch %s. Do not edit. */\n" % torch.__version__)
w("#ifndef CX_GOLDEN_VALUES_H\n#define CX_GOLDEN_VALUES_H\n\n#include <stdint.h>\n\n")
w("typedef struct {\n    const char *key;\n    int64_t numel, stride;\n    int nsamples;\n"
  "    double abs_sum, max_abs;\n    const double *v;   /* v[k] = x[k * stride] */\n} cx_golden;\n\n")
for i, (key, a) in enumerate(OUT):
    n = a.size
    stride = 1 if n <= MAX_SAMPLES else n // MAX_SAMPLES
    samples = a[::stride][:MAX_SAMPLES] if n > MAX_SAMPLES else a
    w("static const double cx_golden_v%d[] = {\n" % i)
    for j in range(0, len(samples), 4):
        w("    " + ", ".join("%.17g" % v for v in samples[j:j + 4]) + ",\n")
    w("};\n")
w("\nstatic const cx_golden cx_golden_table[] = {\n")
for i, (key, a) in enumerate(OUT):
    n = a.size
    stride = 1 if n <= MAX_SAMPLES else n // MAX_SAMPLES
    ns = n if n <= MAX_SAMPLES else MAX_SAMPLES
    w('    { "%s", %d, %d, %d, %.17g, %.17g, cx_golden_v%d },\n'
      % (key, n, stride, ns, float(np.abs(a).sum()), float(np.abs(a).max()), i))
w("};\n\n#define CX_GOLDEN_COUNT ((int)(sizeof cx_golden_table / sizeof cx_golden_table[0]))\n\n#endif\n")
