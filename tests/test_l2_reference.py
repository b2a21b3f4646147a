"""fbat-tf's L2 AutoAttack (standard) and PGD-50-10 against the reference's, on the same trained
model and points: tests/data/l2_reference/ holds a Fashion-MNIST MLP trained by L2 PGD-AT at
ε = 1.5 and the per-point outcomes of pyautoattack's AutoAttack (norm='L2', 'standard') and of a
plain PyTorch PGD-50-10 L2 loop on its first test images (bench/records/l2_reference.py, which
ran PyTorch; CI need not). Here evaluate.py attacks the committed model again as a user types
it, and each robust accuracy must be within 1 point of the reference's."""

from __future__ import annotations

import json
import os

import pytest

from tests.test_train_cli import FASHION_MNIST, ROOT, run_train

HERE = os.path.join(ROOT, "tests", "data", "l2_reference")
# The first points of the reference's, attacked here (1 point = 5 of them).
EXAMPLES = 500


# The module's fixtures are built once for all its tests: pytest-xdist runs them on one worker
# (--dist loadgroup, pyproject.toml).
pytestmark = [pytest.mark.xdist_group("l2_reference"), pytest.mark.slow]


@pytest.fixture(scope="module")
def reference() -> dict:
    with open(os.path.join(HERE, "reference.json")) as f:
        return json.load(f)


@pytest.fixture(scope="module")
def evaluated(reference, tmp_path_factory) -> dict:
    results = tmp_path_factory.mktemp("l2") / "eval.json"
    done = run_train(
        f"--model_path={os.path.join(HERE, 'mlp.keras')}",
        "--dataset=fashion_mnist",
        f"--data_dir={FASHION_MNIST}",
        "--attacks=pgd,autoattack",
        "--norm=l2",
        f"--eps={reference['eps']:g}",
        f"--n_examples={EXAMPLES}",
        "--batch_size=128",
        f"--results={results}",
        program="evaluate.py",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    with open(results) as f:
        return json.load(f)


def share(bits: str) -> float:
    return bits.count("1") / len(bits)


def test_the_reference_record_is_an_l2_evaluation_of_the_committed_model(reference):
    assert reference["norm"] == "l2" and reference["eps"] == 1.5
    assert reference["examples"] >= EXAMPLES
    assert reference["reference"]["logits_max_abs_diff"] < 1e-4
    outcomes = reference["reference"]["outcomes"]
    # Neither trivially robust nor broken: a comparison that can tell implementations apart.
    assert 0.2 < share(outcomes["autoattack"][:EXAMPLES]) < share(outcomes["clean"][:EXAMPLES])
    assert os.path.getsize(os.path.join(HERE, "mlp.keras")) < 1_000_000


@pytest.mark.parametrize("attack", ["autoattack", "pgd"])
def test_l2_robust_accuracy_is_within_one_point_of_the_reference(reference, evaluated, attack):
    eps = f"{reference['eps']:g}"
    ours = evaluated["outcomes"][f"{attack}@l2:{eps}"]
    theirs = reference["reference"]["outcomes"][attack][:EXAMPLES]
    assert evaluated["norm"] == "l2" and len(ours) == EXAMPLES
    # The same points and the same model: the clean outcomes agree point for point (but for a
    # near-tie of two logits that another CPU's rounding may flip).
    clean = reference["reference"]["outcomes"]["clean"][:EXAMPLES]
    assert sum(a != b for a, b in zip(evaluated["outcomes"]["clean"], clean, strict=True)) <= 1
    assert abs(share(ours) - share(theirs)) <= 0.01, (share(ours), share(theirs))
    # And mostly point for point: the attacks differ in their random draws only.
    same = sum(a == b for a, b in zip(ours, theirs, strict=True)) / EXAMPLES
    assert same >= 0.97, same


def test_readme_s_l2_table_is_the_committed_record(reference):
    """The studies' page (study/README.md) quotes reference.json: each row's two accuracies and
    its count of points with the same outcome."""
    with open(os.path.join(ROOT, "study", "README.md")) as f:
        section = f.read().split("## The L2 threat model against the reference", 1)[1]
    section = section.split("\n#", 1)[0]
    rows = {
        "clean": "clean",
        "PGD-50-10 (L2)": "pgd",
        "AutoAttack standard (L2)": "autoattack",
    }
    ours, theirs = reference["fbat_tf"]["outcomes"], reference["reference"]["outcomes"]
    for label, key in rows.items():
        same = sum(a == b for a, b in zip(ours[key], theirs[key], strict=True))
        expected = (
            f"| {label} | {100 * share(ours[key]):.1f}% | {100 * share(theirs[key]):.1f}% | "
            f"{same:,} of {len(ours[key]):,} |"
        )
        assert expected in section, expected
