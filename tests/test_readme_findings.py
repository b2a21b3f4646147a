"""The studies' findings (study/README.md, summed up in README's "Findings") quote the committed
reports' paired verdicts: every quoted difference, its 95 % interval and its verdict is the one
the report computed (results/<sweep>/sweep.json), so that no finding is written by hand."""

from __future__ import annotations

import hashlib
import json
import os
import re
import statistics

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NUMBER = r"([+-]\d+\.\d)"
# `A` − `B`, ε = 64: +0.2 [-1.6, +2.0], undecided   (names may be left out after the first
# quote of a pair: "and at ε = 76: ..."); where the interval counts the images, the seeds-only
# one follows it: "+0.1 [-0.5, +0.7] (seeds only [-0.7, +0.9]), undecided"
QUOTE = re.compile(
    r"(?:`([^`]+)` − `([^`]+)`, )?(?:at )?ε = (\d+): "
    + NUMBER
    + r" \["
    + NUMBER
    + ", "
    + NUMBER
    + r"\](?: \(seeds only \["
    + NUMBER
    + ", "
    + NUMBER
    + r"\]\))?, (.+?)(?=[;.]\s|[;.]$|\s\(|\)|,\s|$)"
)


# The pages: the studies' findings are on study/README.md, the deployment figures in BUILD.md.
README = "README.md"
STUDY = os.path.join("study", "README.md")
BUILD = "BUILD.md"


def sections(page: str = STUDY) -> dict[str, str]:
    """A page's sections by heading (the studies' page unless named), each with its text on one
    line."""
    with open(os.path.join(ROOT, page)) as f:
        text = f.read()
    parts = re.split(r"^#+ (.+)$", text, flags=re.M)
    return {
        heading: " ".join(body.split())
        for heading, body in zip(parts[1::2], parts[2::2], strict=True)
    }


def words_of(*path: str) -> str:
    """A file of the checkout (path parts under the root), its words joined by single spaces, as
    a quote reads whatever the line breaks."""
    with open(os.path.join(ROOT, *path)) as f:
        return " ".join(f.read().split())


def verdicts(sweep: str) -> dict[tuple[str, str, float], dict]:
    """Every paired comparison the report states: its listed ones and each variant against the
    most robust at its ε."""
    with open(os.path.join(ROOT, "study", "results", sweep, "sweep.json")) as f:
        report = json.load(f)
    found = {}
    for rows in report["robust_vs_cost"].values():
        for row in rows:
            if row["versus_best"]:
                pair = row["versus_best"]
                found[pair["a"], pair["b"], pair["eps"]] = pair
    # A pair in both tables is one hypothesis of the family, quoted as the paired table has it.
    found.update({(c["a"], c["b"], c["eps"]): c for c in report["paired_comparisons"]})
    return found


def quotes(text: str):
    """(report, a, b, ε, mean, low, high, seeds-only low and high or None, verdict, what
    follows) of each quote, names carried to unnamed ones.
    A quote belongs to the report the section links last before it (its first link if none
    comes before)."""
    links = [(m.start(), m.group(1)) for m in re.finditer(r"results/(\w+)/sweep\.md", text)]
    a = b = None
    for match in QUOTE.finditer(text):
        if match.group(1):
            a, b = match.group(1), match.group(2)
        before = [name for start, name in links if start < match.start()]
        report = before[-1] if before else links[0][1] if links else None
        after = text[match.end() : match.end() + 20]
        yield (
            report,
            a,
            b,
            float(match.group(3)),
            *match.group(4, 5, 6),
            None if match.group(7) is None else match.group(7, 8),
            match.group(9).strip(),
            after,
        )


def shown(values) -> tuple[str, ...]:
    """Numbers as the report writes them: one decimal with its sign; a zero is "+0.0" from
    either side."""
    return tuple(f"{value:+.1f}".replace("-0.0", "+0.0") for value in values)


def test_every_quoted_paired_verdict_is_the_reports():
    checked = raw_checked = alone_checked = 0
    pages = [
        (page, heading, text)
        for page in (STUDY, README)
        for heading, text in sections(page).items()
    ]
    for page, heading, text in pages:
        for sweep, a, b, eps, mean, low, high, alone, says, after in quotes(text):
            assert sweep, f"{page} section {heading!r} quotes verdicts without naming its report"
            assert a is not None, (heading, eps)
            report = verdicts(sweep)
            flipped = (a, b, eps) not in report  # quoted the other way round
            pair = report[b, a, eps] if flipped else report[a, b, eps]
            sign = -1 if flipped else 1
            expected = (sign * pair["mean"], *sorted(sign * v for v in pair["interval"]))
            assert (mean, low, high) == shown(expected), (heading, a, b, eps)
            # Where the interval counts the images, the seeds-only one is quoted beside it, as
            # the report shows it; nowhere else.
            seeds_only = pair.get("seeds_only")
            assert (alone is None) == (seeds_only is None), (heading, a, b, eps)
            if seeds_only:
                expected = sorted(sign * v for v in seeds_only["interval"])
                assert alone == shown(expected), (heading, a, b, eps)
                alone_checked += 1
            assert says == pair["says"], (heading, a, b, eps)
            # "(ahead before the correction)" after a quote: a side ahead by the raw p-value,
            # not after Holm's correction.
            if after.startswith(" (ahead before"):
                assert pair["raw_verdict"] in ("a", "b"), (heading, a, b, eps)
                assert pair["verdict"] != pair["raw_verdict"], (heading, a, b, eps)
                raw_checked += 1
            # Every verdict quoted is Holm-corrected in its report's family.
            assert pair["correction"] == "holm" and pair["family"] >= 1, (heading, a, b, eps)
            checked += 1
    # fashion_mnist's findings (2), fashion_mnist_ig's (6), fashion_mnist_fast's (19),
    # fashion_mnist_tuned's (12) and fashion_mnist_interior's (15), each of the last two's with
    # its seeds-only interval.
    assert checked >= 54 and alone_checked >= 27
    assert raw_checked >= 7


def test_the_implicit_term_comparisons_are_as_the_readme_counts_them():
    """'Of the fourteen listed comparisons one is shown equivalent ... before Holm's correction
    over the report's thirty ..., none after it ... and none finds a side ahead.'"""
    with open(os.path.join(ROOT, "study", "results", "fashion_mnist_ig", "sweep.json")) as f:
        listed = json.load(f)["paired_comparisons"]
    assert len(listed) == 14 and all(c["family"] == 30 for c in listed)
    assert [c["raw_verdict"] for c in listed].count("equivalent") == 1
    assert [c["verdict"] for c in listed].count("equivalent") == 0
    assert not [c for c in listed if {c["verdict"], c["raw_verdict"]} & {"a", "b"}]
    text = sections()["Where Fast-BAT's implicit term pays (Fashion-MNIST)"]
    assert (
        "Of the fourteen listed comparisons one is shown equivalent within ±1 point before "
        "Holm's correction over the report's thirty (these fourteen and each variant against the "
        "most robust), none after it"
    ) in text


DIVERGED = re.compile(r"diverged in (\d+) of (\d+)")


def check_study_table(sweep: str, heading: str, eps_values: list[int], seeds: int) -> int:
    """A table of a study on study/README.md: rows by ε, a column a variant, each cell "clean /
    PGD-50-10 / AutoAttack ± std" (%), the means over the seeds of each cell's files as the report
    gathered them and AutoAttack's sample standard deviation; "‡" after it where a seed's AutoAttack
    number is the masking check's, and "diverged in k of n" where runs diverged (counted from the
    cells; the others' means follow). Returns the number of table cells checked."""
    with open(os.path.join(ROOT, "study", "results", sweep, "sweep.json")) as f:
        cells = json.load(f)["cells"]
    text = sections()[heading]
    header = re.search(r"\| ε \(/255\) \| (.+?) \| \|---", text).group(1)
    variants = [name.strip("` ") for name in header.split(" | ")]
    rows = re.findall(rf"\| (\d+) \| ((?:[^|]+ \| ?){{{len(variants)}}})", text)
    assert [int(eps) for eps, _ in rows] == eps_values, rows
    checked = 0
    for eps, row in rows:
        shown = [cell.strip() for cell in row.strip(" |").split(" | ")]
        assert len(shown) == len(variants)
        for variant, cell in zip(variants, shown, strict=True):
            found = [c for c in cells if c["variant"] == variant and c["eps"] == float(eps)]
            assert len(found) == seeds, (variant, eps)
            diverged = [c for c in found if c["state"] == "diverged"]
            done = [c for c in found if c["state"] == "done"]
            assert len(diverged) + len(done) == seeds, (variant, eps)
            words = DIVERGED.search(cell)
            assert (words is not None) == bool(diverged), (variant, eps, cell)
            if words:
                assert (int(words.group(1)), int(words.group(2))) == (len(diverged), seeds)
            if not done:
                assert cell == words.group(0), (variant, eps, cell)
                checked += 1
                continue
            clean = [c["pgd"]["clean_accuracy"] for c in done]
            pgd = [c["pgd"]["robust_accuracy"][eps] for c in done]
            aa = [c["autoattack"]["robust_accuracy"][eps] for c in done]
            mean = sum(aa) / len(aa)
            expected = (
                f"{100 * sum(clean) / len(clean):.1f} / {100 * sum(pgd) / len(pgd):.1f} / "
                f"{100 * mean:.1f}"
            )
            if len(aa) > 1:
                std = (sum((a - mean) ** 2 for a in aa) / (len(aa) - 1)) ** 0.5
                expected += f" ± {100 * std:.1f}"
            if any(eps in c["autoattack"].get("checked", []) for c in done):
                expected += " ‡"
            if words:
                expected += f" ({words.group(0)})"
            assert cell == expected, (variant, eps)
            checked += 1
    return checked


def test_the_family_sizes_quoted_are_the_reports():
    """How many comparisons study/README.md says Holm's correction covered in each report."""
    words = {8: "8", 20: "20", 24: "24", 30: "thirty"}

    def size(sweep: str) -> int:
        with open(os.path.join(ROOT, "study", "results", sweep, "sweep.json")) as f:
            return json.load(f)["paired_family"]["size"]

    text = " ".join(sections().values())
    for sweep, phrase in (
        ("fashion_mnist", "once Holm's correction covers the report's {} comparisons"),
        ("fashion_mnist_fast", "the verdict after Holm's correction over the report's {} "),
        ("fashion_mnist_fast", "before the correction for the report's {} comparisons"),
        ("fashion_mnist_ig", "before Holm's correction over the report's {} (these fourteen"),
        ("fashion_mnist_tuned", "the verdict after Holm's correction over the report's {} "),
        ("fashion_mnist_interior", "the verdict after Holm's correction over the report's {} "),
    ):
        assert phrase.format(words[size(sweep)]) in text, sweep


def test_the_paired_study_table_is_the_reports_means_over_seeds():
    """study/README.md's table of the paired study, every method and ε over its five seeds."""
    heading = "Which fast method at which ε (Fashion-MNIST, paired seeds)"
    assert check_study_table("fashion_mnist_fast", heading, [16, 48, 76], 5) == 18


def test_the_paired_study_chooses_pgd_2_at_at_every_eps_as_the_readme_says():
    """'PGD-2-AT has the highest means at every ε of the study, and is ahead of every method but
    GradAlign at 48': the most robust variant at each ε, with no cheaper one shown equivalent to
    it; at ε = 16 the cheaper ones are undecided against it; at 48 every other variant but
    GradAlign is behind it; at 76 Fast-AT and N-FGSM are, not GradAlign (a single-step method
    too) nor either Fast-BAT (Holm-corrected)."""
    with open(os.path.join(ROOT, "study", "results", "fashion_mnist_fast", "sweep.json")) as f:
        by_eps = json.load(f)["robust_vs_cost"]
    assert sorted(by_eps) == ["16", "48", "76"]
    behind = {}
    for eps, rows in by_eps.items():
        (best,) = [row for row in rows if row["most_robust"]]
        assert best["key"] == "pgd", eps
        verdicts = {row["key"]: row["versus_best"]["verdict"] for row in rows if row is not best}
        assert all(row["versus_best"]["correction"] == "holm" for row in rows if row is not best)
        cheaper = {row["key"] for row in rows if row["passes"] < best["passes"]}
        assert cheaper == {"fastat", "nfgsm"}
        if eps == "16":
            assert {verdicts[key] for key in cheaper} == {"undecided"}
        behind[eps] = {key for key, verdict in verdicts.items() if verdict == "b"}
    assert behind["48"] == {"fastat", "nfgsm", "fastbat ig=none", "fastbat ig=hessian_free"}
    assert behind["76"] == {"fastat", "nfgsm"}
    text = sections()["Which fast method at which ε (Fashion-MNIST, paired seeds)"]
    assert (
        "**PGD-2-AT has the highest means at every ε of the study, and is ahead of every method "
        "but GradAlign at 48.**"
    ) in text
    assert (
        "At ε = 76 it is ahead of Fast-AT and N-FGSM but, after the correction, of neither "
        "GradAlign nor either Fast-BAT"
    ) in text
    assert "**At ε = 16 the 4-pass methods cannot be told from it.**" in text


def test_the_fab_t_share_quoted_is_the_benchs_over_every_committed_evaluation():
    """BUILD.md and bench/README.md quote bench/results/fab_share.json, and that file counts every
    committed AutoAttack evaluation but a running sweep's (rerun the bench,
    `python bench/records/fab_share.py`, when a sweep finishes)."""
    import glob
    import importlib.util

    with open(os.path.join(ROOT, "bench", "results", "fab_share.json")) as f:
        share = json.load(f)
    summary = share["summary"]
    spec = importlib.util.spec_from_file_location(
        "fab_share", os.path.join(ROOT, "bench", "records", "fab_share.py")
    )
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    selected = {os.path.relpath(path, ROOT) for path in bench.counted()}
    counted = {row["file"] for row in share["evaluations"]}
    assert counted == selected
    # Left out: only the evaluations of a sweep still running, one whose committed report holds
    # a final cell that has not trained.
    committed = glob.glob(os.path.join(ROOT, "study", "results", "*", "*", "eval-autoattack.json"))
    left_out = {os.path.relpath(path, ROOT) for path in committed} - selected
    for sweep_dir in {os.path.dirname(os.path.dirname(path)) for path in left_out}:
        with open(os.path.join(ROOT, sweep_dir, "sweep.json")) as f:
            cells = json.load(f)["cells"]
        assert any(cell.get("train") is None for cell in cells), (
            f"{sweep_dir} finished: rerun the bench"
        )
    evaluations, examples, broke = (
        f"{summary[key]:,}" for key in ("evaluations", "examples", "fab_t_broke")
    )
    worst = summary["most_in_one"]
    build = words_of("BUILD.md")
    assert (
        f"over the {evaluations} committed Fashion-MNIST AutoAttack evaluations ({examples} "
        f"examples) FAB-T broke {broke} more, at most {worst['fab_t_broke']} of "
        f"{worst['examples']} in one evaluation"
    ) in build
    with open(os.path.join(ROOT, "bench", "README.md")) as f:
        assert f"{broke} of {examples} examples." in f.read()


def test_the_paired_study_s_comparisons_of_means_are_its_cells():
    """What the paired-study section says of means the report does not pair: GradAlign's spread
    at ε = 48 the widest, its mean below PGD-2-AT's and both Fast-BATs' at 48 and 76, and how
    far first-order Fast-BAT's mean lies above Fast-AT's at each ε."""
    with open(os.path.join(ROOT, "study", "results", "fashion_mnist_fast", "sweep.json")) as f:
        cells = json.load(f)["cells"]
    text = sections()["Which fast method at which ε (Fashion-MNIST, paired seeds)"]

    def autoattack(variant: str, eps: int) -> list[float]:
        return [
            100 * c["autoattack"]["robust_accuracy"][str(eps)]
            for c in cells
            if c["variant"] == variant and c["eps"] == float(eps)
        ]

    variants = sorted({c["variant"] for c in cells})
    spread = {v: statistics.stdev(autoattack(v, 48)) for v in variants}
    assert max(spread, key=spread.get) == "fastat_ga"
    assert "GradAlign's spread over seeds is the widest" in text
    for eps in (48, 76):
        below = statistics.fmean(autoattack("fastat_ga", eps))
        for other in ("pgd", "fastbat ig=none", "fastbat ig=hessian_free"):
            assert below < statistics.fmean(autoattack(other, eps)), (other, eps)
    assert "and below PGD-2-AT and both Fast-BATs in mean at 48 and 76" in text
    above = [
        statistics.fmean(autoattack("fastbat ig=none", eps))
        - statistics.fmean(autoattack("fastat", eps))
        for eps in (16, 48, 76)
    ]
    assert (
        f"its means lie {above[0]:.1f} points above Fast-AT's at 16, {above[1]:.1f} at 48 and "
        f"{above[2]:.1f} at 76"
    ) in text


def test_the_implicit_term_s_weight_and_the_tuned_lambda_are_as_readme_says():
    """'at that weight its norm is 0.2–0.3 % of the first-order term's' (the paired study's IG
    ratio at every ε), and 'each doubling of 1/λ beyond it, to 10,000/255, raised the mean
    validation robust accuracy at ε = 48 and 76' (the tuned study's tuning.json, every Fast-BAT
    unit, at each implicit weight tried at every 1/λ)."""
    with open(os.path.join(ROOT, "study", "results", "fashion_mnist_fast", "sweep.json")) as f:
        cells = json.load(f)["cells"]
    ratios = [
        c["train"]["ig_norm_ratio"] for c in cells if c["variant"] == "fastbat ig=hessian_free"
    ]
    means = {
        eps: statistics.fmean(
            c["train"]["ig_norm_ratio"]
            for c in cells
            if c["variant"] == "fastbat ig=hessian_free" and c["eps"] == eps
        )
        for eps in (16.0, 48.0, 76.0)
    }
    low, high = min(means.values()), max(means.values())
    assert len(ratios) == 15
    text = sections()["Where Fast-BAT's implicit term pays (Fashion-MNIST)"]
    assert f"its norm is {100 * low:.1f}–{100 * high:.1f} % of the first-order term's" in text

    with open(os.path.join(ROOT, "study", "results", "fashion_mnist_tuned", "tuning.json")) as f:
        picks = json.load(f)["picks"]
    checked = 0
    for unit, entry in picks.items():
        if not unit.startswith("fastbat-"):
            continue
        by_weight: dict = {}
        for candidate in entry["candidates"]:
            flags = candidate["flags"]
            by_weight.setdefault(flags.get("ig_coef"), {})[flags["lambda_inv"]] = candidate["mean"]
        for weight, by_lambda in by_weight.items():
            if sorted(by_lambda) != [2500, 5000, 10000]:
                continue  # c = the exact 1/λ: one 1/λ each
            assert by_lambda[2500] < by_lambda[5000] < by_lambda[10000], (unit, weight)
            checked += 1
    assert checked == 6  # first-order at 48 and 76; c = 0.1 and 1 at each
    assert (
        "each doubling of 1/λ beyond it, to 10,000/255, raised the mean validation robust "
        "accuracy at ε = 48 and 76"
    ) in text


def test_the_paired_study_s_other_figures_are_its_files():
    """The figures study/README.md's paired-study section states outside verdicts and the table:
    compute hours, the guard in Fast-BAT's runs, and PGD-50-10 against AutoAttack on the same 500
    images at ε = 48."""
    with open(os.path.join(ROOT, "study", "results", "fashion_mnist_fast", "sweep.json")) as f:
        report = json.load(f)
    cells = report["cells"]
    text = sections()["Which fast method at which ε (Fashion-MNIST, paired seeds)"]

    hours = [
        sum(c["train"]["train_seconds"] for c in cells) / 3600,
        sum(sum(c["pgd"]["time_s"].values()) for c in cells) / 3600,
        sum(sum(c["autoattack"]["time_s"].values()) for c in cells) / 3600,
    ]
    assert (
        f"they took {sum(hours):.1f} hours of this machine's 2 cores (training {hours[0]:.1f} h, "
        f"PGD-50-10 {hours[1]:.1f} h, AutoAttack {hours[2]:.1f} h)"
    ) in text

    fastbat = [c for c in cells if c["method"] == "fastbat"]
    assert len(fastbat) == 30 and not [c for c in fastbat if c["train"]["overfitting_epochs"]]
    assert "the guard fired in none of the 30 Fast-BAT runs" in text

    def same_points(variant: str) -> tuple[float, float]:
        """Mean PGD-50-10 accuracy on AutoAttack's 500 images (the first batch of 500) and
        AutoAttack's, ε = 48, in %."""
        pgd, aa = [], []
        for c in cells:
            if c["variant"] == variant and c["eps"] == 48.0:
                with open(os.path.join(ROOT, c["pgd"]["source"])) as f:
                    first = json.load(f)["per_batch"][0]
                assert first["examples"] == c["autoattack"]["examples"] == 500
                pgd.append(first["robust_accuracy"]["pgd@48"])
                aa.append(c["autoattack"]["robust_accuracy"]["48"])
        return 100 * sum(pgd) / len(pgd), 100 * sum(aa) / len(aa)

    fastat, nfgsm = same_points("fastat"), same_points("nfgsm")
    assert (
        f"PGD-50-10 accuracy is {nfgsm[0] - nfgsm[1]:.1f} points above its AutoAttack accuracy, "
        f"where Fast-AT's is {fastat[0] - fastat[1]:.1f} points above ({fastat[0]:.1f}% against "
        f"{fastat[1]:.1f}%"
    ) in text


TUNED = "The same questions with every method tuned (Fashion-MNIST)"


def tuned_report() -> dict:
    with open(os.path.join(ROOT, "study", "results", "fashion_mnist_tuned", "sweep.json")) as f:
        return json.load(f)


def test_the_tuned_study_table_is_the_reports_means_over_seeds():
    """study/README.md's table of the tuned study: every method at ε = 48 and 76 over its five
    seeds, the masking-checked cells marked and ELLE-A's diverged runs counted."""
    assert check_study_table("fashion_mnist_tuned", TUNED, [48, 76], 5) == 14


def test_the_tuned_study_s_choices_are_the_reports_as_the_readme_says():
    """'Fast-BAT is the most robust at 48 and 76, and at both the report's choice': no cheaper
    method is shown equivalent to it; first-order Fast-BAT is undecided against it at both, at
    48 equivalent within a point before Holm's correction by both analyses (the seeds × images
    model's variance components no longer clip to 0, as they did before the both-sided masking
    check), and not after it."""
    by_eps = tuned_report()["robust_vs_cost"]
    assert sorted(by_eps) == ["48", "76"]
    against, versus = {}, {}
    for eps, rows in by_eps.items():
        (best,) = [row for row in rows if row["most_robust"]]
        assert best["key"] == "fastbat ig=hessian_free", eps
        cheaper = [row for row in rows if row["passes"] < best["passes"]]
        against[eps] = {row["key"]: row["versus_best"]["verdict"] for row in cheaper}
        versus[eps] = {row["key"]: row["versus_best"] for row in cheaper}
    for eps in ("48", "76"):
        assert against[eps]["fastbat ig=none"] == "undecided"
        assert "equivalent" not in against[eps].values()
    first_order = versus["48"]["fastbat ig=none"]
    assert first_order["raw_verdict"] == first_order["seeds_only"]["raw_verdict"] == "equivalent"
    assert first_order["verdict"] == first_order["seeds_only"]["verdict"] == "undecided"
    squares = first_order["mean_squares"]
    assert min(squares["seed"], squares["image"]) > squares["residual"]  # neither clips
    text = sections()[TUNED]
    assert (
        "Fast-BAT is the most robust at 48 and 76, and at both the report's choice (the cheapest "
        "method that is the most robust or shown equivalent to it): no cheaper method is shown "
        "equivalent to it. First-order Fast-BAT, at 6 passes a step against 8, is undecided "
        "against it at both"
    ) in text
    assert "(equivalent within a point before the correction, by both analyses)" in text
    implicit = sections()["Where Fast-BAT's implicit term pays (Fashion-MNIST)"]
    assert "**Tuned, the implicit term's effect is undecided at ε = 48 and 76**" in implicit
    assert (
        "At 48 both intervals' 90 % counterparts lie within a point: equivalent before Holm's "
        "correction, not after it"
    ) in " ".join(implicit.split())


def test_the_tuned_study_s_picks_are_its_tuning_files():
    """Each method's pick at each ε, as tuning.json has it, in study/README.md's words."""
    with open(os.path.join(ROOT, "study", "results", "fashion_mnist_tuned", "tuning.json")) as f:
        picks = json.load(f)["picks"]
    titles = {
        "fastat": "Fast-AT",
        "nfgsm": "N-FGSM",
        "fastat_ga": "GradAlign",
        "pgd": "PGD-2-AT",
        "fastbat ig=none": "first-order Fast-BAT",
        "fastbat ig=hessian_free": "Fast-BAT",
    }
    by_variant: dict = {}
    for entry in picks.values():
        assert entry["decided_by"] == "the highest mean"
        flags = " ".join(f"{k}={v:g}" for k, v in entry["flags"].items())
        by_variant.setdefault(entry["variant"], {})[entry["eps"]] = f"`{flags}`"
    assert sorted(by_variant) == sorted(titles)
    text = sections()[TUNED]
    for variant, title in titles.items():
        at = by_variant[variant]
        assert f"{title} {at[48.0]} at ε = 48 and {at[76.0]} at 76" in text, variant


def test_the_tuned_study_s_picks_at_their_grids_edges_are_all_named():
    """A pick is at an edge where its value of a tuned option is the largest or the smallest
    among its unit's candidates that agree with it on the other options (the only one where no
    other does): study/README.md names every such pick of tuning.json, and the interior ones."""
    with open(os.path.join(ROOT, "study", "results", "fashion_mnist_tuned", "tuning.json")) as f:
        picks = json.load(f)["picks"]
    found = {}
    for unit, entry in picks.items():
        chosen = entry["flags"]
        for flag, value in chosen.items():
            line = [
                c["flags"][flag]
                for c in entry["candidates"]
                if all(c["flags"][k] == v for k, v in chosen.items() if k != flag)
            ]
            if len(line) == 1:
                found[unit, flag] = "only"
            elif value >= max(line) or value <= min(line):
                found[unit, flag] = "largest" if value >= max(line) else "smallest"
    assert found == {
        ("fastbat-ignone-eps48", "lambda_inv"): "largest",
        ("fastbat-ignone-eps76", "lambda_inv"): "largest",
        ("fastbat-ighessian_free-eps48", "lambda_inv"): "largest",
        ("fastbat-ighessian_free-eps76", "lambda_inv"): "largest",
        ("fastbat-ighessian_free-eps48", "ig_coef"): "smallest",
        ("pgd-eps48", "pgd_step"): "largest",
        ("pgd-eps76", "pgd_step"): "largest",
        ("fastat_ga-eps48", "ga_coef"): "smallest",
        ("nfgsm-eps48", "nfgsm_step"): "smallest",
        ("nfgsm-eps48", "nfgsm_noise"): "only",
        ("nfgsm-eps76", "nfgsm_noise"): "smallest",
        ("nfgsm-eps76", "nfgsm_step"): "largest",
    }
    at_edge = {unit for unit, _ in found}
    interior = sorted(set(picks) - at_edge)
    assert interior == ["fastat-eps48", "fastat-eps76", "fastat_ga-eps76"]
    assert (len(at_edge), len(picks)) == (9, 12)
    text = sections()[TUNED]
    assert (
        "Nine of the twelve picks sit at an edge of their grid (an option's largest or smallest "
        "value among the candidates that agree with the pick on the other options), so that "
        "they might gain from values beyond it: 1/λ at the largest tried, 10,000/255, for "
        "first-order Fast-BAT and Fast-BAT at both ε, and Fast-BAT's c = 0.1 at 48 the "
        "smallest; PGD-2-AT's step at the largest, 0.75ε, at both ε; GradAlign's λ = 2 at 48, "
        "the smallest; N-FGSM's step at 48 the smallest, 0.67ε (tried with k = 2 only), and at "
        "76 its k = 2 the smallest and its step ε the largest. Only Fast-AT's picks and "
        "GradAlign's at 76 are interior."
    ) in text
    values = {
        unit: picks[unit]["flags"]
        for unit in ("fastbat-ighessian_free-eps48", "pgd-eps48", "fastat_ga-eps48", "nfgsm-eps48")
    }
    assert values["fastbat-ighessian_free-eps48"] == {"lambda_inv": 10000, "ig_coef": 0.1}
    assert values["pgd-eps48"] == {"pgd_step": 0.75} == picks["pgd-eps76"]["flags"]
    assert values["fastat_ga-eps48"] == {"ga_coef": 2.0}
    assert values["nfgsm-eps48"] == {"nfgsm_noise": 2, "nfgsm_step": 0.67}
    assert picks["nfgsm-eps76"]["flags"] == {"nfgsm_noise": 2, "nfgsm_step": 1.0}


def test_the_fashion_mnist_sweep_ran_two_seeds_where_readme_says():
    """'Two seeds ran only at ε = 16 and 76 (one for Fast-BAT's other implicit weights)'."""
    with open(os.path.join(ROOT, "study", "results", "fashion_mnist", "sweep.json")) as f:
        cells = json.load(f)["cells"]
    seeds: dict = {}
    for c in cells:
        seeds.setdefault((c["variant"], c["eps"]), set()).add(c["seed"])
    two = {key for key, found in seeds.items() if len(found) == 2}
    assert {eps for _, eps in two} == {16.0, 76.0}
    assert {v for (v, eps), found in seeds.items() if eps in (16.0, 76.0) and len(found) == 1} == {
        "fastbat ig_coef=0",
        "fastbat ig_coef=0.3",
    }
    assert all(len(found) <= 2 for found in seeds.values())
    text = sections()["Every method across ε (Fashion-MNIST sweep)"]
    assert (
        "Two seeds ran only at ε = 16 and 76 (one for Fast-BAT's other implicit weights), and at "
        "76 the leads that look clearest decide nothing"
    ) in text


def test_the_tuned_study_s_other_figures_are_its_files():
    """Compute hours from every run's files, ELLE-A's divergence at ε = 76, what the both-sided
    masking check found and how far the earlier, one-sided check put its cells below it, how
    far validation stood above the test for each pick, and Fast-BAT's validation at the exact
    implicit weight."""
    import glob

    from tests.test_interior_study import TITLES, check_masking_bullet

    root = os.path.join(ROOT, "study", "results", "fashion_mnist_tuned")
    report = tuned_report()
    finals = report["cells"]  # the final cells; tuning runs are under tuning/
    assert len(finals) == 70 and all(c["state"] in ("done", "diverged") for c in finals)
    done = [c for c in finals if c["state"] == "done"]
    text = sections()[TUNED]

    def seconds(path: str) -> float:
        with open(os.path.join(ROOT, path)) as f:
            return sum(json.load(f)["time_s"].values())

    tuning = 0.0
    runs = glob.glob(os.path.join(root, "tuning", "*", "results.json"))
    for path in runs:
        with open(path) as f:
            tuning += sum(epoch["epoch_time"] for epoch in json.load(f)["history"])
    training = 0.0
    for c in finals:
        with open(os.path.join(ROOT, c["run_dir"], "results.json")) as f:
            training += sum(epoch["epoch_time"] for epoch in json.load(f)["history"])
    evaluation = sum(
        sum(c[name]["time_s"].values()) for c in done for name in ("pgd", "autoattack")
    )
    both_sided = sum(
        seconds(entry["strong_source"]) for c in done for entry in c["masking_check"].values()
    )
    earlier_files = sorted(glob.glob(os.path.join(root, "*", "eval-masking.json")))
    earlier = sum(seconds(path) for path in earlier_files)
    total = tuning + training + evaluation + both_sided + earlier
    flat = " ".join(text.split())
    assert (
        f"All {len(runs) + len(finals)} runs ({len(runs)} tuning, {len(finals)} final) ran "
        "revision dfc53a2, which the sweep pinned, from a clean checkout, and the check ran "
        "revision 6b5c79b"
    ) in flat
    revisions = {e["code"]["revision"] for c in done for e in c["masking_check"].values()}
    assert {revision[:7] for revision in revisions} == {"6b5c79b"}
    assert (
        f"they took {total / 3600:.1f} hours of one core (tuning {tuning / 3600:.1f} h, final "
        f"training {training / 3600:.1f} h, evaluation {evaluation / 3600:.1f} h, the masking "
        f"checks {(both_sided + earlier) / 3600:.1f} h: {earlier / 3600:.1f} h for an earlier "
        f"check on ten cells, below, and {both_sided / 3600:.1f} h for the "
        f"both-sided one), about {total / 7200:.0f} hours of this 2-core machine"
    ) in flat

    elle = [c for c in finals if c["variant"] == "elle" and c["eps"] == 76.0]
    divergences, lambdas = [], []
    for c in elle:
        assert c["state"] == "diverged"
        with open(os.path.join(ROOT, c["run_dir"], "results.json")) as f:
            run = json.load(f)
        divergences.append(run["divergence"])
        lambdas.append(run["history"][-1]["elle_lambda"])
    assert {d["epoch"] for d in divergences} == {1}
    steps = [d["steps"] for d in divergences]
    assert (
        f"ELLE-A diverged at ε = 76 in all {len(elle)} seeds, each in its first epoch after "
        f"{min(steps)}–{max(steps)} steps, its adaptive λ's epoch mean at "
        f"{min(lambdas):,.0f}–{max(lambdas):,.0f}"
    ) in text
    assert all(d["last_finite_loss"] > 1e14 for d in divergences)
    assert "the loss climbing past 10^14 before the run stopped on non-finite batches" in text

    # Every trained cell checked alike, on the same points; masked where the gap stayed.
    masked = check_masking_bullet(text, done)
    checks = [c["masking_check"][f"{c['eps']:g}"] for c in done]
    assert {entry["checked_examples"] for entry in checks} == {500}
    assert {os.path.basename(entry["strong_source"]) for entry in checks} == {
        "eval-masking_both.json"
    }
    never = {v for v in TITLES if (v, 48.0) in masked and not any(masked[v, 48.0])}
    never &= {v for v in TITLES if not any(masked.get((v, 76.0), []))}
    assert never == {"fastbat ig=hessian_free", "nfgsm", "elle"}
    assert "none for Fast-BAT, N-FGSM or ELLE-A" in flat
    # The earlier check, where AutoAttack's own Square had fired, on all 1,000 points with 5
    # restarts: how much lower it put its cells than the both-sided check does.
    lower, checked_by = [], set()
    by_name = {c["name"]: c for c in done}
    for path in earlier_files:
        cell = by_name[os.path.basename(os.path.dirname(path))]
        at = f"{cell['eps']:g}"
        with open(path) as f:
            square = json.load(f)
        assert square["square_restarts"] == 5 and square["examples"] == 1000
        with open(path.replace("eval-masking.json", "eval-autoattack.json")) as f:
            outcomes = json.load(f)["outcomes"]
        both = zip(
            outcomes["clean"],
            outcomes[f"autoattack@{at}"],
            square["outcomes"][f"square@{at}"],
            strict=True,
        )
        survived = sum(all(o == "1" for o in point) for point in both) / 1000
        lower.append(100 * (cell["autoattack"]["robust_accuracy"][at] - survived))
        checked_by.add(TITLES[cell["variant"]])
    assert len(earlier_files) == 10 and min(lower) > 0
    assert (
        "on ten cells (PGD-2-AT's, Fast-AT's and GradAlign's); it put them "
        f"{min(lower):.1f}–{max(lower):.1f} points lower than the both-sided check does"
    ) in flat
    assert checked_by == {"PGD-2-AT", "Fast-AT", "GradAlign"}

    def mean_autoattack(variant: str) -> float:
        return statistics.fmean(
            c["autoattack"]["robust_accuracy"]["76"]
            for c in finals
            if c["variant"] == variant and c["eps"] == 76.0
        )

    assert mean_autoattack("pgd") < min(
        mean_autoattack("fastbat ig=none"), mean_autoattack("fastbat ig=hessian_free")
    )
    assert "after the check PGD-2-AT stays below both Fast-BATs at 76 in mean" in text

    gaps = {}
    for c in finals:
        if c["state"] != "done":
            continue
        train = c["train"]
        gaps.setdefault((c["variant"], c["eps"]), []).append(
            (
                train["val_robust_accuracy"][train["selected_epoch"] - 1],
                c["pgd"]["robust_accuracy"][str(int(c["eps"]))],
                c["autoattack"]["robust_accuracy"][str(int(c["eps"]))],
            )
        )
    gap = {
        row: 100
        * (
            statistics.fmean(v for v, _, _ in found)
            - min(
                statistics.fmean(p for _, p, _ in found), statistics.fmean(a for _, _, a in found)
            )
        )
        for row, found in gaps.items()
        if row[0] != "elle"
    }
    wide = {("fastat", 76.0), ("pgd", 76.0)}
    others = [value for row, value in gap.items() if row not in wide]
    assert max(others) < min(gap[row] for row in wide)
    assert (
        f"validation stood {gap['fastat', 76.0]:+.1f} and {gap['pgd', 76.0]:+.1f} points above "
        f"the lower test number for Fast-AT's and PGD-2-AT's picks at ε = 76, "
        f"{min(others):+.1f} to {max(others):+.1f} for every other pick"
    ) in text

    with open(os.path.join(root, "tuning.json")) as f:
        picks = json.load(f)["picks"]
    margins = []
    for eps in (48.0, 76.0):
        (entry,) = [
            e
            for e in picks.values()
            if e["variant"] == "fastbat ig=hessian_free" and e["eps"] == eps
        ]
        chosen = entry["flags"]
        by_weight = {
            c["flags"]["ig_coef"]: 100 * c["mean"]
            for c in entry["candidates"]
            if c["flags"]["lambda_inv"] == chosen["lambda_inv"]
            and c["flags"]["ig_coef"] in (0.1, 1)
        }
        other = 1 if chosen["ig_coef"] == 0.1 else 0.1
        margins.append((chosen["ig_coef"], by_weight[chosen["ig_coef"]] - by_weight[other]))
    assert (
        f"the tuning stage picked c = {margins[0][0]:g} at ε = 48 and c = {margins[1][0]:g} at 76, "
        f"by {margins[0][1]:.1f} and {margins[1][1]:.1f} points of mean validation robust "
        f"accuracy over the other"
    ) in sections()["Where Fast-BAT's implicit term pays (Fashion-MNIST)"]
    exact, paper = [], []
    for entry in picks.values():
        if entry["variant"] != "fastbat ig=hessian_free":
            continue
        for candidate in entry["candidates"]:
            weight, inverse = candidate["flags"]["ig_coef"], candidate["flags"]["lambda_inv"]
            if abs(weight - inverse / 255) < 1e-3:
                exact.append(100 * candidate["mean"])
            else:
                paper.append(100 * candidate["mean"])
    assert len(exact) == 6 and len(paper) == 12
    assert max(exact) < min(paper)
    text = sections()["Where Fast-BAT's implicit term pays (Fashion-MNIST)"]
    assert (
        f"At the exact weight c = 1/λ Fast-BAT did not train: {min(exact):.1f}–{max(exact):.1f} % "
        f"mean validation robust accuracy at every 1/λ and ε, against {min(paper):.1f}–"
        f"{max(paper):.1f} % at c = 0.1 and 1"
    ) in text


def test_the_tuned_study_against_the_paired_one_is_as_readme_says():
    """What the tuned section says tuning changed against the paired study: each method's step
    there and here (from the runs' own method records), the AutoAttack means of PGD-2-AT and
    first-order Fast-BAT in both, Fast-AT's gain at 48, and its guard at 76."""

    def runs(sweep: str, variant: str, eps: int) -> list[dict]:
        with open(os.path.join(ROOT, "study", "results", sweep, "sweep.json")) as f:
            cells = json.load(f)["cells"]
        found = []
        for c in cells:
            if c["variant"] == variant and c["eps"] == float(eps) and c["state"] == "done":
                with open(os.path.join(ROOT, c["run_dir"], "results.json")) as f:
                    found.append((c, json.load(f)))
        return found

    def alpha(sweep: str, variant: str, eps: int) -> str:
        (ratio,) = {
            round(run["method"]["alpha"] / run["method"]["eps"], 4)
            for _, run in runs(sweep, variant, eps)
        }
        return "ε" if ratio == 1 else f"{ratio:g}ε"

    def autoattack(sweep: str, variant: str, eps: int) -> float:
        return 100 * statistics.fmean(
            c["autoattack"]["robust_accuracy"][str(eps)] for c, _ in runs(sweep, variant, eps)
        )

    text = sections()[TUNED]
    paired, tuned = "fashion_mnist_fast", "fashion_mnist_tuned"
    assert alpha(paired, "pgd", 48) == alpha(paired, "pgd", 76)
    assert alpha(tuned, "pgd", 48) == alpha(tuned, "pgd", 76)
    pgd = [autoattack(s, "pgd", e) for s in (tuned, paired) for e in (48, 76)]
    assert (
        f"Tuning raised PGD-2-AT's step too (α = {alpha(tuned, 'pgd', 48)} for "
        f"{alpha(paired, 'pgd', 48)}) and its AutoAttack accuracy moved little ({pgd[0]:.1f} and "
        f"{pgd[1]:.1f} % here, {pgd[2]:.1f} and {pgd[3]:.1f} % there)"
    ) in text
    rose = [
        autoattack(tuned, "fastbat ig=none", e) - autoattack(paired, "fastbat ig=none", e)
        for e in (48, 76)
    ]
    assert (
        f"first-order Fast-BAT's rose by {rose[0]:.0f} points at 48 and {rose[1]:.0f} at 76" in text
    )
    assert alpha(paired, "fastat", 48) == alpha(paired, "fastat", 76)
    gain = autoattack(tuned, "fastat", 48) - autoattack(paired, "fastat", 48)
    assert (
        f"Tuning lowered Fast-AT's α ({alpha(tuned, 'fastat', 48)} at 48, "
        f"{alpha(tuned, 'fastat', 76)} at 76, for {alpha(paired, 'fastat', 48)}) and lifted its "
        f"AutoAttack accuracy by {gain:.0f} points at 48"
    ) in text
    fired = [bool(c["train"]["overfitting_epochs"]) for c, _ in runs(tuned, "fastat", 76)]
    assert len(fired) == 5 and all(fired)
    assert "at 76 its guard still fired in every seed" in text


def test_bench_readme_s_max_pooling_tables_are_the_committed_bench_run():
    """bench/README.md's "Max pooling under XLA" quotes bench/results/max_pool.json: each relative
    error range and each gradient time and ratio, as the bench prints them, from a run at rest."""
    with open(os.path.join(ROOT, "bench", "results", "max_pool.json")) as f:
        found = json.load(f)
    with open(os.path.join(ROOT, "bench", "README.md")) as f:
        text = f.read().split("## Max pooling under XLA", 1)[1].split("\n## ", 1)[0]
    assert (
        found["command"] == "python bench/max_pool.py --json=bench/results/max_pool.json --rounds=5"
    )
    assert not found["times_under_load"]
    for errors in found["second_derivative_relative_error"].values():
        cells = [f"{min(e):.1e} – {max(e):.1e}" for e in (errors["keras_xla"], errors["fbat_xla"])]
        assert f"| {cells[0]} | {cells[1]} |" in text
    for execution, measured in found["step_time"].items():
        for method in ("fastat", "fastbat"):
            keras_s = measured[f"{method} keras"]["step_time_s"]
            row = f"| {execution} | {method} | {1000 * keras_s:.0f} |"
            for pooling in ("fbat", "slices"):
                seconds = measured.get(f"{method} {pooling}", {}).get("step_time_s")
                row += (
                    " |"
                    if seconds is None
                    else f" {1000 * seconds:.0f} ({seconds / keras_s:.2f}×) |"
                )
            assert row in text, row


def test_the_step_time_ratios_quoted_are_the_committed_cost_bench():
    """The step-time ratios bench/README.md, DESIGN.md §3.6 and study/README.md quote are those of
    bench/results/method_cost_fmnist.json, the run at rest the sweep reports' time column uses,
    and its table in bench/README.md is the bench's own."""
    with open(os.path.join(ROOT, "bench", "results", "method_cost_fmnist.json")) as f:
        found = json.load(f)
    ratio = {name: f"{m['ratio_to_fastat']:.2f}" for name, m in found["methods"].items()}
    assert found["command"] == (
        "python bench/step_time.py --model=small_cnn --width=16 --batch_size=128 "
        "--image_size=28 --channels=1 --jit_compile=auto --onednn=on "
        "--methods=standard,fastat,nfgsm,fastat_ga,pgd,free,fastbat,fastbat:ig=none,elle "
        "--warmup=2 --repeats=5 --rounds=5 --json=bench/results/method_cost_fmnist.json"
    )
    with open(os.path.join(ROOT, "bench", "README.md")) as f:
        bench = f.read().split("## The cost of each method", 1)[1].split("\n## ", 1)[0]
    for name, m in found["methods"].items():
        low, high = min(m["round_step_seconds"]), max(m["round_step_seconds"])
        row = (
            f"| {name} | {sum(m['passes'].values())} | {m['step_seconds']:.3f} | "
            f"{low:.3f}–{high:.3f} | {m['images_per_second']:.0f} | {ratio[name]} |"
        )
        assert row in bench, row
    spread = max(
        max(m["round_step_seconds"]) / min(m["round_step_seconds"])
        for m in found["methods"].values()
    )
    words = " ".join(bench.split())
    assert f"each method's rounds within {100 * (spread - 1):.0f} % of each other" in words
    # The earlier run on another CPU, kept beside it: every shared ratio within 0.11.
    with open(os.path.join(ROOT, "bench", "results", "method_cost_fmnist_amd_epyc.json")) as f:
        earlier = json.load(f)
    assert earlier["setting"]["machine"]["cpu"] == "AMD EPYC" and "elle" not in earlier["methods"]
    moved = max(
        abs(m["ratio_to_fastat"] - found["methods"][name]["ratio_to_fastat"])
        for name, m in earlier["methods"].items()
    )
    assert round(moved, 2) == 0.11  # the largest shift, as quoted
    assert "without ELLE-A, gave every ratio within 0.11 of these" in words
    assert (
        f"{ratio['standard']} for 2 passes against 4, {ratio['pgd']} and "
        f"{ratio['fastbat ig=none']} for 6, {ratio['fastbat']} for 8, {ratio['fastat_ga']} "
        f"for GradAlign's 10. ELLE-A's 10 passes take {ratio['elle']}×"
    ) in words
    design = words_of("docs", "DESIGN.md")
    assert (
        f"N-FGSM {ratio['nfgsm']}× Fast-AT's against 1.0, PGD-2-AT {ratio['pgd']}× against 1.5, "
        f"first-order Fast-BAT {ratio['fastbat ig=none']}× against 1.5, Fast-BAT "
        f"{ratio['fastbat']}× against 2.0, GradAlign {ratio['fastat_ga']}× against 2.5, ELLE-A "
        f"{ratio['elle']}× against 2.5"
    ) in design
    share = (
        found["methods"]["fastbat ig=none"]["step_seconds"]
        / found["methods"]["fastbat"]["step_seconds"]
    )
    readme = " ".join(sections().values())
    assert f"Fast-BAT's 8 (0.75 of its cost; {share:.2f} of its step time at rest" in readme


def test_bench_readme_s_interval_coverage_is_the_committed_bench_run():
    """bench/README.md's coverage table and the ranges it states are bench/results/
    interval_coverage.json's, the run of the command it names."""
    with open(os.path.join(ROOT, "bench", "results", "interval_coverage.json")) as f:
        found = json.load(f)
    with open(os.path.join(ROOT, "bench", "README.md")) as f:
        text = f.read().split("### The seeds × images interval with few seeds", 1)[1]
    assert found["command"] == "python bench/records/interval_coverage.py --draws=2000"
    assert f"`{found['command']}` wrote" in " ".join(text.split())
    for row in found["rows"]:
        crossed, seeds_only = row["crossed"], row["seeds_only"]
        line = (
            f"| {row['seeds']} | {row['tau']:g} | {crossed['coverage']:.3f} | "
            f"{crossed['mean_width']:.1f} | {seeds_only['coverage']:.3f} | "
            f"{seeds_only['mean_width']:.1f} |"
        )
        assert line in text, line

    def percent_range(rows, key):
        values = [100 * row[key]["coverage"] for row in rows]
        return f"{min(values):.0f}-{max(values):.0f} %"

    two = [row for row in found["rows"] if row["seeds"] == 2 and row["tau"] > 0]
    more = [row for row in found["rows"] if row["seeds"] >= 3]
    words = " ".join(text.split())
    assert f"held the true difference in {percent_range(two, 'crossed')} of draws" in words
    assert f"both models hold it in {percent_range(more, 'crossed')} of draws" in words
    # DESIGN.md §5.5 and paired.py's docstring give the reason for CROSSED_MIN_SEEDS with the
    # same run's ranges.
    design = words_of("docs", "DESIGN.md")
    assert (
        f"held the true difference in {percent_range(two, 'crossed')} of draws with a seed "
        f"effect, against {percent_range(more, 'crossed')} from 3 seeds"
    ) in design
    docstring = words_of("study", "paired.py")
    assert (
        f"held the true difference in {percent_range(two, 'crossed')} of simulated draws with "
        f"a seed effect (bench/records/interval_coverage.py; "
        f"{percent_range(more, 'crossed')} from three seeds on)"
    ) in docstring


def test_readme_s_deployment_figures_are_the_committed_bench_run():
    """BUILD.md's "ONNX and LiteRT" quotes bench/results/deploy_demo.json, made from the committed
    run in study/results/deploy/ (its selected weights are there to export and attack again): each
    file's size, its classes over the whole test split beside the SavedModel's, and the re-check
    table row by row as the bench printed it, each row's evaluation JSON committed."""
    with open(os.path.join(ROOT, "bench", "results", "deploy_demo.json")) as f:
        found = json.load(f)
    with open(os.path.join(ROOT, "bench", "results", "deploy_demo.md")) as f:
        rows = [line for line in f.read().splitlines() if line.startswith("| ")]
    # The committed run, whose weights are those the bench measured.
    assert found["workdir"] == os.path.join("study", "results", "deploy", "fmnist-fastbat")
    run = os.path.join(ROOT, found["workdir"])
    weights = os.path.join(run, "checkpoints", "best.weights.h5")
    assert os.path.getsize(weights) < 1_000_000
    # The figures are those of the committed weights, not of a file put in their place since.
    assert found["weights"]["path"] == os.path.relpath(weights, ROOT)
    with open(weights, "rb") as f:
        assert found["weights"]["sha256"] == hashlib.sha256(f.read()).hexdigest()
    text = sections(BUILD)["ONNX and LiteRT"]
    for size in found["bytes"].values():
        assert f"{size / 1000:.0f} KB" in text, size
    split = found["whole_split"]
    assert f"clean accuracy is {100 * found['source_clean_accuracy']:.2f}%" in text
    for name in ("model.onnx", "model.tflite", "model_int8.tflite"):
        assert split[name]["examples"] == 10_000
        said = f"{100 * split[name]['agreement']:.2f}% agreement" in text
        assert said or split[name]["disagreeing"] == 0, name
        assert f"{100 * split[name]['clean_accuracy']:.2f}%" in text, name
    int8 = split["model_int8.tflite"]
    assert f"gives {int8['disagreeing']} images another class" in text
    assert len(rows) == 1 + 4  # the header, the SavedModel and three files
    for row in rows:
        assert " ".join(row.split()) in text, row
    for checked in found["recheck"].values():
        assert checked["examples"] == 256
        assert os.path.isfile(os.path.join(ROOT, checked["results"]))


def test_the_recheck_times_quoted_are_the_committed_bench_run():
    """BUILD.md's "ONNX and LiteRT" and bench/README.md quote bench/results/recheck_once.json: the
    three commands' and the one command's wall times, measured with each file's results
    identical."""
    with open(os.path.join(ROOT, "bench", "results", "recheck_once.json")) as f:
        found = json.load(f)
    assert found["command"] == "python bench/records/recheck_once.py"
    assert found["n_examples"] == 256 and found["identical_results"] is True
    apart, together = (found["ways"][way] for way in ("one command a file", "one command"))
    assert (apart["commands"], together["commands"]) == (3, 1)
    seconds = f"{apart['seconds']:.0f} s", f"{together['seconds']:.0f} s"
    assert (
        f"{seconds[0]} in three commands, {seconds[1]} in one" in sections(BUILD)["ONNX and LiteRT"]
    )
    bench = words_of("bench", "README.md")
    assert f"{seconds[0]} against {seconds[1]} at rest" in bench


def test_the_tuned_study_s_indicators_are_its_files():
    """What study/README.md says the indicators, computed afterwards from the committed weights,
    found on the tuned study's final cells: from each evaluation's `indicators` (the report's
    `indicated`), and each computed later by one clean revision."""
    import glob

    for path in glob.glob(
        os.path.join(ROOT, "study", "results", "fashion_mnist_tuned", "*", "eval-*.json")
    ):
        with open(path) as f:
            found = json.load(f)
        # The both-sided masking check ran after the indicators were built: its own.
        if os.path.basename(path) == "eval-masking_both.json":
            assert "computed_later" not in found["indicators"], path
            assert found["code"]["dirty"] is False, path
        else:
            assert found["indicators"]["computed_later"]["dirty"] is False, path
    done = [c for c in tuned_report()["cells"] if c["state"] == "done"]

    def fired(c) -> set[str]:
        at = f"{c['eps']:g}"
        return {n for e in ("pgd", "autoattack") for n in (c[e].get("indicated") or {}).get(at, [])}

    def seeds(variant: str, eps: float, name: str) -> int:
        return sum(name in fired(c) for c in done if c["variant"] == variant and c["eps"] == eps)

    square = [c for c in done if "square_beats_white_box" in fired(c)]
    assert all(
        "square_beats_white_box" in c["autoattack"]["indicated"][f"{c['eps']:g}"] for c in square
    )
    text = sections()[TUNED]
    from fbat_tf.checks import SQUARE_MARGIN

    assert (
        f"AutoAttack's Square broke more than {100 * SQUARE_MARGIN:g} points beyond its white-box "
        "parts (the "
        f"reference's check) in {len(square)} of the {len(done)} trained final cells"
    ) in text
    for variant in ("pgd", "fastat"):
        assert seeds(variant, 76.0, "incomplete_optimization") == 5, variant
    unconstrained = [seeds(v, 76.0, "unconstrained_attack_failure") for v in ("pgd", "fastat")]
    assert (
        f"and in {unconstrained[0]} and {unconstrained[1]} of their 5 seeds PGD with no bound on "
        "ε left points unbroken"
    ) in text
    assert seeds("fastat_ga", 76.0, "unconstrained_attack_failure") == 5
    assert seeds("fastat_ga", 76.0, "unavailable_gradients") == 4
    assert "no usable gradient (in 4 of 5)" in text
    for eps in (48.0, 76.0):
        only = {
            n
            for c in done
            if c["variant"] == "fastbat ig=hessian_free" and c["eps"] == eps
            for n in fired(c)
        }
        assert only == {"square_beats_white_box"}, eps
    assert seeds("fastbat ig=none", 48.0, "incomplete_optimization") == 1
    assert seeds("fastbat ig=none", 76.0, "unavailable_gradients") == 1
    others = {n for c in done if c["variant"] == "fastbat ig=none" for n in fired(c)}
    assert others == {"square_beats_white_box", "incomplete_optimization", "unavailable_gradients"}
    assert (
        "Fast-BAT shows only Square's check, at both ε; first-order Fast-BAT besides it one "
        "seed's incomplete optimization at 48 and one seed's unavailable gradients at 76"
    ) in text
