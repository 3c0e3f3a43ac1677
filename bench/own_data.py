"""The image reader of chapter 15c (dpm.own_data.read_images) against a plain Pillow + numpy loop.

Writes N small grey PNG files (default 10,000 of 32 x 32) into a temporary folder, then reads them
with both, each REPEATS times (the best time counts), and prints images per second and the ratio.
The plain loop opens each file once, converts to 8-bit grey and resizes; the reader also reads every
header first (to decide the size and the channels before decoding), applies EXIF orientation and
crops to a centred square. Usage: python bench/own_data.py [N] [REPEATS]
"""
import sys, tempfile, time
from pathlib import Path
import numpy as np
from PIL import Image
from dpm.own_data import read_images
from dpm.experiments import machine


def write_folder(root: Path, n: int, side: int = 32, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    for i in range(n):
        Image.fromarray(rng.integers(0, 256, (side, side), dtype=np.uint8), 'L').save(root / f'{i:05d}.png')
    return root


def plain_loop(root: Path, size: int) -> np.ndarray:
    "What a user would write: open, 8-bit grey, resize, stack."
    return np.stack([np.asarray(Image.open(p).convert('L').resize((size, size), Image.Resampling.LANCZOS))
                     for p in sorted(root.glob('*.png'))])


def best(f, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter(); f(); times.append(time.perf_counter() - t0)
    return min(times)


if __name__ == '__main__':
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 10_000
    repeats = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    with tempfile.TemporaryDirectory() as tmp:
        root = write_folder(Path(tmp), n)
        ours = read_images(root)                       # warm the file cache; check the result
        assert ours.images.shape == (n, 1, 32, 32)
        t_plain = best(lambda: plain_loop(root, 32), repeats)
        t_ours = best(lambda: read_images(root), repeats)
    m = machine()
    print(f"{n:,} PNG files of 32 x 32 grey pixels, best of {repeats}; {m['processor']}, "
          f"{m['cpus']} CPUs")
    print(f"plain Pillow + numpy loop: {n / t_plain:,.0f} images/s")
    print(f"dpm.own_data.read_images:  {n / t_ours:,.0f} images/s "
          f"({t_plain / t_ours:.2f} x the plain loop)")
