"""Makes tests/data/golden_imagefolder/: a few small PNGs and JPEGs (RGB,
grayscale, palette) in two classes, and golden.txt with what PIL decodes
and what torchvision's eval transform (Resize(R) + CenterCrop(S) + ToTensor
+ Normalize with ImageNet's mean and std) gives for them. Run once with
torch's Python (/usr/bin/python3); the outputs are committed and the tests
never need torch.

golden.txt lines:
  decode INDEX W H b0 b1 ...     PIL's RGB bytes, (H, W, 3)
  eval S R INDEX v0 v1 ...       the (3, S, S) values in float32 (%.9g)
INDEX is the sample's position in ImageFolder's order."""
import os
import numpy as np
from PIL import Image
import torchvision
from torchvision import transforms

here = os.path.dirname(os.path.abspath(__file__))
root = os.path.join(here, "golden_imagefolder")
rng = np.random.default_rng(28)


def smooth(h, w, c):
    # noise blurred a little, so resampling sees both edges and gradients
    x = rng.integers(0, 256, size=(h + 2, w + 2, c)).astype(np.float64)
    x = (x[:-2, :-2] + x[1:-1, 1:-1] * 2 + x[2:, 2:]) / 4
    return np.clip(x, 0, 255).astype(np.uint8)


os.makedirs(os.path.join(root, "a"), exist_ok=True)
os.makedirs(os.path.join(root, "b"), exist_ok=True)
Image.fromarray(smooth(23, 37, 3), "RGB").save(os.path.join(root, "a", "0_rgb.png"))
Image.fromarray(smooth(41, 19, 1)[:, :, 0], "L").save(os.path.join(root, "a", "1_gray.PNG"))
pal = Image.fromarray(smooth(30, 30, 3), "RGB").quantize(colors=16)
pal.save(os.path.join(root, "b", "2_pal.png"))
Image.fromarray(smooth(33, 45, 3), "RGB").save(os.path.join(root, "b", "3_rgb.jpg"), quality=90)
Image.fromarray(smooth(20, 26, 1)[:, :, 0], "L").save(os.path.join(root, "b", "4_gray.jpeg"), quality=90)

lines = []
ds = torchvision.datasets.ImageFolder(root)
for i, (path, _) in enumerate(ds.samples):
    im = Image.open(path).convert("RGB")
    b = np.asarray(im).reshape(-1)
    lines.append("decode %d %d %d %s" % (i, im.width, im.height, " ".join(str(v) for v in b)))
norm = transforms.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
for S, R in ((12, 16), (20, 26)):
    t = transforms.Compose([transforms.Resize(R), transforms.CenterCrop(S), transforms.ToTensor(), norm])
    eds = torchvision.datasets.ImageFolder(root, transform=t)
    for i in range(len(eds)):
        v = eds[i][0].numpy().astype(np.float32).reshape(-1)
        lines.append("eval %d %d %d %s" % (S, R, i, " ".join("%.9g" % x for x in v)))
with open(os.path.join(root, "..", "golden_imagefolder.txt"), "w") as f:
    f.write("\n".join(lines) + "\n")
print("classes", ds.classes, "samples", [os.path.relpath(p, root) for p, _ in ds.samples])
