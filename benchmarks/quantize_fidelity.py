"""What 8-bit weights and matmuls do to a whole run's frames and latents: the recipe run
once per quantize format, each in a fresh process, compared with the same recipe run
unquantized (same seed): PSNR and SSIM of the frames (uint8, every frame), and the
final latents' max |diff| / max |reference| and cosine.

    python benchmarks/quantize_fidelity.py [--recipe recipes/wan-tiny.yaml]
        [--formats int8 fp8 ...] [--out benchmarks/results/quantize-fidelity.json]
        [KEY=VALUE ...]      (recipe overrides for every run)

SSIM is the standard single-scale form (Wang et al. 2004: 8x8 uniform windows,
K1=0.01, K2=0.03, on each colour channel, averaged); PSNR over all frames at once.
"""

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

from results_io import save  # noqa: E402

FORMATS = ["int8", "fp8", "int8-weights", "fp8-weights"]


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)
    return float("inf") if mse == 0 else float(10 * np.log10(255.0 ** 2 / mse))


def ssim(a: np.ndarray, b: np.ndarray, window: int = 8) -> float:
    """Mean SSIM of two (frames, height, width, channels) uint8 videos."""
    from numpy.lib.stride_tricks import sliding_window_view

    c1, c2 = (0.01 * 255) ** 2, (0.03 * 255) ** 2
    x, y = a.astype(np.float64), b.astype(np.float64)
    size = min(window, x.shape[1], x.shape[2])

    def mean(v):
        return sliding_window_view(v, (size, size), axis=(1, 2)).mean(axis=(-2, -1))

    mx, my = mean(x), mean(y)
    vx, vy, cov = mean(x * x) - mx ** 2, mean(y * y) - my ** 2, mean(x * y) - mx * my
    value = ((2 * mx * my + c1) * (2 * cov + c2)) / ((mx ** 2 + my ** 2 + c1) * (vx + vy + c2))
    return float(value.mean())


def run(recipe: str, out: Path, overrides: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """One `porter run` in a fresh process: its frames and final latents."""
    from safetensors.torch import load_file  # latents may be bfloat16: numpy has none

    subprocess.run([sys.executable, "-m", "porter.cli", "run", recipe, f"output.dir={out}",
                    "output.frames=npy", "output.latents=true", "output.video=false",
                    "--no-progress", *overrides], cwd=ROOT, check=True, capture_output=True)
    latents = load_file(out / "latents.safetensors")["latents"].float().numpy()
    return np.load(out / "frames.npy"), latents


def compare(frames, latents, ref_frames, ref_latents) -> dict:
    got, want = latents.astype(np.float64).ravel(), ref_latents.astype(np.float64).ravel()
    return {"psnr_db": psnr(frames, ref_frames), "ssim": ssim(frames, ref_frames),
            "latents_max_rel": float(np.abs(got - want).max() / np.abs(want).max()),
            "latents_cosine": float(got @ want / (np.linalg.norm(got) * np.linalg.norm(want)))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--recipe", default="recipes/wan-tiny.yaml")
    parser.add_argument("--formats", nargs="+", default=FORMATS, choices=FORMATS)
    parser.add_argument("--out", type=Path,
                        default=ROOT / "benchmarks" / "results" / "quantize-fidelity.json")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE")
    args = parser.parse_args()
    results = json.loads(args.out.read_text()) if args.out.exists() else []
    with tempfile.TemporaryDirectory() as tmp:
        reference = run(args.recipe, Path(tmp) / "reference", args.overrides)
        for name in args.formats:
            got = run(args.recipe, Path(tmp) / name, [*args.overrides,
                                                     f"quantize.format={name}"])
            row = {"recipe": args.recipe, "overrides": args.overrides, "format": name,
                   **compare(*got, *reference)}
            results.append(row)
            save(args.out, results)
            print(f"{name:<13} PSNR {row['psnr_db']:6.2f} dB  SSIM {row['ssim']:.4f}  "
                  f"latents {row['latents_max_rel']:.2e} (cosine {row['latents_cosine']:.6f})",
                  flush=True)


if __name__ == "__main__":
    main()
