#!/usr/bin/env python3
"""Loads a consolidated cxla ResNet checkpoint into torchvision's model with
strict=True and checks that its logits agree with cxla's on the same input.
Needs python3-torch, python3-torchvision and python3-h5py (Debian); the
build and the tests never do.

    train --model resnet50 --data fake --image-size 64 --steps 2 --parallel fsdp --ckpt-dir ck
    /usr/bin/python3 examples/resnet_torch_check.py ck/ckpt-step-2_consolidated.h5 \\
        [--resnet-logits build/examples/resnet_logits]

The model (resnet18 or resnet50), its input channels and classes come from
the weights' shapes. cxla's logits come from resnet_logits, which loads the
same file into cxla's model and runs the same fixed input (make_input) in
evaluation mode; both sides use the BatchNorm running statistics.
Exit status 0 when the logits agree within --rtol of their largest
magnitude, 1 otherwise.
"""
import argparse
import os
import shutil
import subprocess
import tempfile

import h5py
import numpy as np
import torch
import torchvision


def make_input(shape):
    """resnet_logits' input: (u * 2 - 1), u the top 24 bits of splitmix64(i * gamma) / 2^24, float32."""
    n = int(np.prod(shape))
    with np.errstate(over="ignore"):
        z = np.arange(n, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    u = (z >> np.uint64(40)).astype(np.float32) * np.float32(1.0 / 16777216.0)
    return (u * np.float32(2.0) - np.float32(1.0)).reshape(shape)


def fail(msg):
    raise SystemExit("resnet_torch_check.py: " + msg)


def default_logits():
    """The repo's build (build/examples/, next to this script's examples/) first, then PATH."""
    built = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "build", "examples", "resnet_logits")
    if os.access(built, os.X_OK):
        return os.path.normpath(built)
    return shutil.which("resnet_logits")


def load_state(path):
    """The checkpoint's "model" group as tensors; one line (not a traceback) for a missing or bad file."""
    if not os.path.isfile(path):
        fail("%s: no such file" % path)
    if not h5py.is_hdf5(path):
        fail("%s: not an HDF5 file (want a consolidated checkpoint: train ... --ckpt-dir D, D/ckpt-step-N_consolidated.h5)"
             % path)
    try:
        with h5py.File(path, "r") as f:
            if "model" not in f:
                fail("%s: no 'model' group: not a consolidated cxla checkpoint" % path)
            return {k: torch.tensor(np.array(f["model"][k][()])) for k in f["model"].keys()}
    except (OSError, KeyError, TypeError) as e:
        fail("%s: cannot read the checkpoint: %s" % (path, e))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("h5")
    ap.add_argument("--resnet-logits", default=None,
                    help="cxla's logits program (default: the repo's build/examples/resnet_logits, then PATH)")
    ap.add_argument("--image-size", type=int, default=64)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--rtol", type=float, default=1e-4)
    a = ap.parse_args()
    logits_prog = a.resnet_logits or default_logits()
    if not logits_prog:
        fail("no resnet_logits in build/examples/ or on PATH: build the repo, or give --resnet-logits")
    sd = load_state(a.h5)
    if "fc.weight" not in sd or "conv1.weight" not in sd:
        fail("%s: no fc.weight / conv1.weight in its model: not a ResNet checkpoint" % a.h5)
    name = "resnet50" if "layer1.0.conv3.weight" in sd else "resnet18"
    classes, in_ch = sd["fc.weight"].shape[0], sd["conv1.weight"].shape[1]
    m = getattr(torchvision.models, name)(num_classes=classes)
    if in_ch != 3:
        m.conv1 = torch.nn.Conv2d(in_ch, 64, kernel_size=7, stride=2, padding=3, bias=False)
    m.load_state_dict(sd, strict=True)
    m.eval()
    x = make_input((a.batch, in_ch, a.image_size, a.image_size))
    with torch.no_grad():
        want = m(torch.from_numpy(x)).double().numpy()
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "logits.f32")
        try:
            run = subprocess.run([logits_prog, "--model", name, "--ckpt", a.h5, "--out", out, "--in-channels", str(in_ch),
                                  "--num-classes", str(classes), "--image-size", str(a.image_size), "--batch",
                                  str(a.batch)])
        except OSError as e:
            fail("cannot run %s: %s" % (logits_prog, e))
        if run.returncode != 0:
            fail("%s exited %d (its message above)" % (logits_prog, run.returncode))
        got = np.fromfile(out, dtype="<f4").astype(np.float64).reshape(want.shape)
    scale = np.abs(want).max()
    diff = np.abs(got - want).max()
    n_params = sum(p.numel() for p in m.parameters())
    n_bufs = sum(1 for k in sd if k.endswith(("running_mean", "running_var", "num_batches_tracked")))
    print("torch %s, torchvision %s: %s loaded strictly (%d tensors: %d parameters in %d tensors, %d BN buffers)"
          % (torch.__version__, torchvision.__version__, name, len(sd), n_params, len(sd) - n_bufs, n_bufs))
    print("logits (%d, %d) on a %dx%d input: max |torch| %.4f, max |cxla - torch| %.3g (%.2g relative); "
          "argmax agree on %d/%d" % (want.shape[0], want.shape[1], a.image_size, a.image_size, scale, diff,
                                      diff / scale, int((got.argmax(1) == want.argmax(1)).sum()), want.shape[0]))
    print("torch logits[0][:4]: %s\ncxla  logits[0][:4]: %s" % (np.array2string(want[0][:4], precision=5),
                                                                 np.array2string(got[0][:4], precision=5)))
    if not diff <= a.rtol * scale:
        fail("logits differ by %.3g, more than %g of %.3g" % (diff, a.rtol, scale))
    print("ok")


if __name__ == "__main__":
    main()
