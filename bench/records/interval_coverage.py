"""How often the paired comparisons' 95 % intervals hold the true difference, by simulation:
the seeds × images model (study/paired.crossed) against the interval over seeds only, for 2, 3
and 5 seeds of 1,000 test images.

    python bench/records/interval_coverage.py              # the committed run, 400 draws a row
    python bench/records/interval_coverage.py --draws=50   # a quick look

A draw: 1,000 images from a population in which image i has a difficulty z_i ~ N(0, 1.5²) on the
logit scale; method B gets it right with probability σ(z_i), method A with σ(z_i + 0.2 + δ_s),
where δ_s ~ N(0, τ²) is seed s's effect on A (τ = 0: the seeds differ only by chance). Each
seed's outcomes of A and B on the same images go through `paired.compare`, with the outcomes
(the seeds × images model) and without (seeds only), as the report does. The true difference is
the mean over the image and seed populations (by Monte Carlo on 10⁶ draws). Writes
bench/results/interval_coverage.json and .md.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "bench"))

from harness import command_line, machine, publish, table  # noqa: E402

from study import paired  # noqa: E402

OUT = os.path.join(ROOT, "bench", "results")
IMAGES = 1000
SPREAD, GAIN = 1.5, 0.2  # image difficulty's sd and A's gain over B, logit scale
SEEDS = (2, 3, 5)
TAUS = (0.0, 0.1, 0.2, 0.4)


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def true_difference(tau: float, rng: np.random.Generator) -> float:
    """A − B in points over the image and seed populations."""
    z = rng.normal(0.0, SPREAD, 1_000_000)
    delta = rng.normal(0.0, tau, z.size) if tau else 0.0
    return 100.0 * float(np.mean(sigmoid(z + GAIN + delta)) - np.mean(sigmoid(z)))


def draw(seeds: int, tau: float, rng: np.random.Generator) -> tuple[dict, dict]:
    """A's and B's outcomes by seed on one draw of the images, as '0'/'1' strings."""
    z = rng.normal(0.0, SPREAD, IMAGES)
    delta = rng.normal(0.0, tau, seeds)
    a = rng.random((seeds, IMAGES)) < sigmoid(z[None, :] + GAIN + delta[:, None])
    b = rng.random((seeds, IMAGES)) < sigmoid(z[None, :])

    def strings(matrix):
        return {s: "".join("1" if x else "0" for x in row) for s, row in enumerate(matrix)}

    return strings(a), strings(b)


def coverage(seeds: int, tau: float, draws: int, rng: np.random.Generator) -> dict:
    truth = true_difference(tau, rng)
    found = {paired.CROSSED: [], paired.SEEDS_ONLY: []}
    for _ in range(draws):
        a, b = draw(seeds, tau, rng)
        accuracy = [{s: o.count("1") / IMAGES for s, o in x.items()} for x in (a, b)]
        for model, outcomes in ((paired.CROSSED, (a, b)), (paired.SEEDS_ONLY, None)):
            result = paired.compare(
                *accuracy, resolution=0.1, outcomes=outcomes, min_crossed_seeds=2
            )
            assert result.model == model
            low, high = result.interval
            found[model].append((low <= truth <= high, high - low))
    names = {"crossed": paired.CROSSED, "seeds_only": paired.SEEDS_ONLY}
    return {
        "seeds": seeds,
        "tau": tau,
        "true_difference": truth,
        **{
            key: {
                "coverage": float(np.mean([held for held, _ in found[model]])),
                "mean_width": float(np.mean([width for _, width in found[model]])),
            }
            for key, model in names.items()
        },
    }


def markdown(report: dict) -> str:
    heading = (
        f"Coverage of the 95 % interval of A − B over {report['draws']} simulated draws a row "
        f"({IMAGES} images, seed effect sd τ on the logit scale; see the script): the share of "
        "draws whose interval holds the true difference, and its mean width in points"
    )
    columns = ["seeds", "τ", "seeds × images", "width", "seeds only", "width"]
    rows = [
        [
            row["seeds"],
            f"{row['tau']:g}",
            f"{row['crossed']['coverage']:.3f}",
            f"{row['crossed']['mean_width']:.1f}",
            f"{row['seeds_only']['coverage']:.3f}",
            f"{row['seeds_only']['mean_width']:.1f}",
        ]
        for row in report["rows"]
    ]
    return table(heading, columns, rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--draws", type=int, default=400)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    rows = []
    for seeds in SEEDS:
        for tau in TAUS:
            rows.append(coverage(seeds, tau, args.draws, rng))
            print(rows[-1], flush=True)
    report = {
        "draws": args.draws,
        "images": IMAGES,
        "seed": args.seed,
        "rows": rows,
        "machine": machine(),
        "command": command_line(),
    }
    publish(
        markdown(report),
        report,
        os.path.join(OUT, "interval_coverage.json"),
        os.path.join(OUT, "interval_coverage.md"),
    )


if __name__ == "__main__":
    main()
