"""The interior study (results/fashion_mnist_interior/) holds what its definition promises: every
tuning pick interior to its grid or at a bound the definition states, each candidate marked as an
author's released value or extrapolated, worked out here from the candidates and the definition
alone, not from the words the sweep wrote."""

from __future__ import annotations

import json
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SWEEP = "fashion_mnist_interior"
INTERIOR = (
    '"Tuned" that holds: interior picks, a criterion masking cannot fool, FGSM-PGI (Fashion-MNIST)'
)


def _json(*path: str):
    with open(os.path.join(ROOT, *path)) as f:
        return json.load(f)


def _groups() -> dict[str, dict]:
    """The definition's tuning groups by unit prefix (method, and the match's `ig`)."""
    definition = _json("configs", "sweeps", f"{SWEEP}.json")
    found = {}
    for group in definition["tuning"]["groups"]:
        ig = (group.get("match") or {}).get("ig")
        found[group["method"] + (f"-ig{ig}" if ig else "")] = group
    return found


def _next(value: float, factor: float, up: bool) -> float:
    """The grid's next value past `value`, as the definition's factor makes it (4 digits)."""
    return float(f"{value * factor if up else value / factor:.4g}")


def _bounded() -> tuple[int, list[tuple[str, str, float]]]:
    """How many (unit, extended flag) picks are interior, and the others: (unit, flag, the next
    value past the pick), each checked against the definition's bounds and the sweep's words."""
    picks = _json("results", SWEEP, "tuning.json")["picks"]
    groups = _groups()
    interior, bounded = 0, []
    for unit, entry in picks.items():
        group = groups[unit.rsplit("-eps", 1)[0]]
        chosen = entry["flags"]
        for flag, spec in group["extend"].items():
            line = [
                c["flags"][flag]
                for c in entry["candidates"]
                if {k: v for k, v in c["flags"].items() if k != flag}
                == {k: v for k, v in chosen.items() if k != flag}
            ]
            value = chosen[flag]
            up, down = value >= max(line), value <= min(line)
            if not (up or down):
                interior += 1
                assert entry["edges"][flag] == "interior", (unit, flag)
                continue
            beyond = _next(value, spec["factor"], up)
            assert not spec["min"] <= beyond <= spec["max"], (unit, flag, beyond)
            assert spec["why"] in entry["edges"][flag], (unit, flag)
            bounded.append((unit, flag, beyond))
    return interior, sorted(bounded)


def test_every_pick_is_interior_or_at_a_stated_bound():
    """For every flag a unit's grid extends: among the candidates that agree with the pick on
    its other flags, the pick's value has a larger and a smaller neighbour (interior), or the
    next value in the direction it is at the edge lies outside the definition's bounds; the
    sweep's words for it say the same."""
    interior, bounded = _bounded()
    assert [(unit, flag) for unit, flag, _ in bounded] == [
        ("fastbat-ighessian_free-eps76", "ig_coef"),
        ("fgsm_pgi-eps48", "fgsm_pgi_lambda"),
        ("fgsm_pgi-eps76", "fgsm_pgi_lambda"),
    ]
    assert interior == 15


def test_every_candidate_is_marked_released_or_extrapolated_as_the_definition_says():
    """A candidate is released exactly where the definition lists its flags among the group's
    released settings; one the grid gained is extrapolated and marked added; the report's tuning
    table shows both."""
    picks = _json("results", SWEEP, "tuning.json")["picks"]
    groups = _groups()
    with open(os.path.join(ROOT, "results", SWEEP, "sweep.md")) as f:
        section = f.read().split("## Tuning\n", 1)[1].split("\n## ", 1)[0]
    rows = [line.strip("|").split(" | ") for line in section.splitlines() if line.startswith("| ")]
    heading, rows = [cell.strip() for cell in rows[0]], rows[1:]
    column = heading.index("value")
    for unit, entry in picks.items():
        group = groups[unit.rsplit("-eps", 1)[0]]
        listed = [dict(c) for c in group["candidates"]]
        for candidate in entry["candidates"]:
            released = any(candidate["flags"] == dict(r) for r in group["released"])
            assert candidate["origin"] == ("released" if released else "extrapolated"), unit
            assert candidate["added"] == (candidate["flags"] not in listed), unit
            assert not (candidate["added"] and released), unit
    shown = [row[column].strip() for row in rows]
    expected = [
        c["origin"] + (", added" if c["added"] else "")
        for entry in picks.values()
        for c in entry["candidates"]
    ]
    assert sorted(shown) == sorted(expected) and len(shown) == len(expected) > 0


def test_the_study_page_s_account_of_the_picks_is_the_tuning_file():
    """study/README.md's counts of candidates, added ones and picks, the picks stopped at a
    bound with the next value and the bound, the released picks, and every pick that moved
    since the tuned study, each from the two tuning files."""
    from tests.test_readme_findings import sections

    text = sections()[INTERIOR]
    picks = _json("results", SWEEP, "tuning.json")["picks"]
    candidates = [c for entry in picks.values() for c in entry["candidates"]]
    added = [c for c in candidates if c["added"]]
    interior, bounded = _bounded()
    assert interior + len(bounded) == sum(
        len(_groups()[u.rsplit("-eps", 1)[0]]["extend"]) for u in picks
    )
    assert (
        f"of {len(candidates)} candidates, {len(added)} were added by the extensions, and "
        f"{len(picks)} of the {len(picks)} units' picks are interior on every flag their grid "
        "extends or stop at a stated bound"
    ) in text
    groups = _groups()
    nexts = {
        unit: (beyond, groups[unit.rsplit("-eps", 1)[0]]["extend"][flag])
        for unit, flag, beyond in bounded
    }
    pgi = [picks[f"fgsm_pgi-eps{e}"]["flags"]["fgsm_pgi_lambda"] for e in (48, 76)]
    assert pgi[0] == pgi[1]
    beyond, spec = nexts["fgsm_pgi-eps48"]
    assert nexts["fgsm_pgi-eps76"][0] == beyond
    assert (
        f"Three stop at one: FGSM-PGI's λ = {pgi[0]:g} at both ε, the smallest tried, with "
        f"validation still rising toward it (the next, {beyond:g}, would pass the bound "
        f"{spec['min']:g}"
    ) in text
    for eps in (48, 76):
        means = {
            c["flags"]["fgsm_pgi_lambda"]: c["mean"]
            for c in picks[f"fgsm_pgi-eps{eps}"]["candidates"]
        }
        ordered = [means[v] for v in sorted(means)]
        assert ordered[0] > ordered[1], eps  # still rising toward the smallest
    beyond, spec = nexts["fastbat-ighessian_free-eps76"]
    weight = picks["fastbat-ighessian_free-eps76"]["flags"]["ig_coef"]
    assert (
        f"Fast-BAT's c = {weight:g} at ε = 76 (the next, {beyond:g}, would pass the bound "
        f"{spec['max']:g}"
    ) in text
    released = sorted(
        unit
        for unit, entry in picks.items()
        if next(c for c in entry["candidates"] if c["label"] == entry["pick"])["origin"]
        == "released"
    )
    assert released == ["fastat_ga-eps48", "fastat_ga-eps76"]
    ga = [picks[u]["flags"]["ga_coef"] for u in released]
    assert (
        f"Only GradAlign's two picks (λ = {ga[0]:g} at 48, {ga[1]:g} at 76) are values an author "
        f"released; the other {len(picks) - 2} extrapolate"
    ) in text
    before = _json("results", "fashion_mnist_tuned", "tuning.json")["picks"]
    moved = {
        unit: (before[unit]["flags"], picks[unit]["flags"])
        for unit in before
        if before[unit]["flags"] != picks[unit]["flags"]
    }
    assert f"Against the tuned study, {len(moved)} of its {len(before)} picks moved" in text
    assert sorted(moved) == [
        "fastat-eps76",
        "fastat_ga-eps76",
        "fastbat-ighessian_free-eps48",
        "fastbat-ighessian_free-eps76",
        "fastbat-ignone-eps76",
        "nfgsm-eps48",
        "nfgsm-eps76",
        "pgd-eps48",
    ]
    was, now = moved["fastat-eps76"]
    assert (
        f"Fast-AT's α at 76 from ε to {now['fastat_step']:g}ε" in text and was["fastat_step"] == 1
    )
    assert all(moved[f"nfgsm-eps{e}"][1]["nfgsm_clip"] == 1 for e in (48, 76))
    assert "nfgsm_clip" not in moved["nfgsm-eps48"][0]
    assert f"(with k = {moved['nfgsm-eps48'][1]['nfgsm_noise']:g} at 48)" in text
    was, now = moved["fastat_ga-eps76"]
    assert f"GradAlign's λ at 76 from {was['ga_coef']:g} to {now['ga_coef']:g}" in text
    was, now = moved["pgd-eps48"]
    assert (was["pgd_step"], now["pgd_step"]) == (0.75, 1.0)
    assert "PGD-2-AT's step at 48 from 0.75ε to ε" in text
    for unit in ("fastbat-ignone-eps76", "fastbat-ighessian_free-eps76"):
        assert (moved[unit][0]["lambda_inv"], moved[unit][1]["lambda_inv"]) == (10000, 20000)
    assert "1/λ at 76 from 10,000 to 20,000/255 for both Fast-BATs" in text
    was, now = moved["fastbat-ighessian_free-eps48"]
    assert was["lambda_inv"] == now["lambda_inv"]
    assert f"Fast-BAT's c at 48 from {was['ig_coef']:g} to {now['ig_coef']:g}" in text


def test_every_run_is_the_pinned_revision_s_its_weights_kept_and_its_seed_paired():
    """The set-up the study page states, from every committed run's own results.json: each ran
    the pinned revision from a clean checkout, each tuning run kept its selected weights, and
    each final cell starts from the initial weights and first batch of the tuned study's cell
    of its seed (whatever the method, DESIGN.md §2.4)."""
    import glob

    from tests.test_readme_findings import sections

    pinned = _json("results", SWEEP, "revision.json")["revision"]
    root = os.path.join(ROOT, "results", SWEEP)
    tuning = glob.glob(os.path.join(root, "tuning", "*", "results.json"))
    finals = glob.glob(os.path.join(root, "*", "results.json"))
    assert len(tuning) == 231 and finals
    for path in tuning + finals:
        code = _json(path)["code"]
        assert (code["revision"], code["dirty"]) == (pinned, False), path
    for path in tuning:
        assert os.path.exists(os.path.join(os.path.dirname(path), "checkpoints", "best.weights.h5"))
    paired = 0
    for path in finals:
        name = os.path.basename(os.path.dirname(path))
        seed = name.rsplit("-seed", 1)[1]
        before = glob.glob(os.path.join(ROOT, "results", "fashion_mnist_tuned", f"*-seed{seed}"))
        run = _json(path)
        if run["status"] != "complete":
            continue
        pairings = {json.dumps(_json(p, "results.json")["pairing"]) for p in before}
        assert pairings == {json.dumps(run["pairing"])}, name
        paired += 1
    assert paired > 0
    text = sections()[INTERIOR]
    assert (
        f"Every run ran revision {pinned[:7]}, which the sweep pinned, from a clean checkout"
        in text
    )
    assert "kept every run's selected weights" in text
    assert "the picks train on the paired seeds 0-4 (the tuned study's initial weights" in text
