"""How many examples AutoAttack's FAB-T breaks that APGD-CE and APGD-T left robust, over every
committed AutoAttack evaluation: what choosing one FAB flavour over another can move at most.
A study still running its AutoAttack evaluations (a cell neither evaluated nor diverged,
`study.committed.sweeps` with `checks=False`) is left out until they are all in, so that its cells
can be committed as they land; rerun this then. A masking check still running counts no AutoAttack.

    python bench/records/fab_share.py        # writes bench/results/fab_share.json and .md

AutoAttack (standard) runs APGD-CE, APGD-T, FAB-T and Square in turn, each on what the ones
before left robust; evaluate.py records the robust accuracy after each part. FAB-T's share is
the accuracy after APGD-T minus the accuracy after FAB-T, times the examples. Reads files only.
"""

from __future__ import annotations

import glob
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)  # fbat_tf, run from a checkout without installing it
sys.path.insert(0, os.path.join(ROOT, "bench"))

from harness import publish  # noqa: E402

from fbat_tf.records import EvaluationResult  # noqa: E402


def counted() -> list[str]:
    """The AutoAttack evaluations counted: every one under study/results/, but those of a study
    (study.committed.sweeps) whose evaluations are not all in (its masking checks aside)."""
    from study import committed

    running = {path for path, done in committed.sweeps(ROOT, checks=False).items() if not done}
    found = glob.glob(os.path.join(ROOT, "study", "results", "*", "*", "eval-autoattack.json"))
    return sorted(p for p in found if os.path.dirname(os.path.dirname(p)) not in running)


def shares() -> list[dict]:
    found = []
    for path in counted():
        result = EvaluationResult.load(path)
        for attacked in result.robust:
            parts = attacked.parts
            if "apgd-t" in parts and "fab-t" in parts:
                broken = round((parts["apgd-t"] - parts["fab-t"]) * result.examples)
                found.append(
                    {
                        "file": os.path.relpath(path, ROOT),
                        "budget": attacked.key,
                        "examples": result.examples,
                        "fab_t_broke": broken,
                    }
                )
    return found


def main() -> None:
    found = shares()
    examples = sum(row["examples"] for row in found)
    broke = sum(row["fab_t_broke"] for row in found)
    worst = max(found, key=lambda row: row["fab_t_broke"])
    summary = {
        "evaluations": len(found),
        "examples": examples,
        "fab_t_broke": broke,
        "evaluations_where_it_broke_any": sum(1 for row in found if row["fab_t_broke"] > 0),
        "most_in_one": {key: worst[key] for key in ("file", "budget", "examples", "fab_t_broke")},
    }
    text = "\n".join(
        [
            "| AutoAttack evaluations | examples | broken by FAB-T after APGD-T | evaluations "
            "with any | most in one evaluation |",
            "|---|---|---|---|---|",
            f"| {len(found)} | {examples} | {broke} ({100 * broke / examples:.3f}%) | "
            f"{summary['evaluations_where_it_broke_any']} | {worst['fab_t_broke']} of "
            f"{worst['examples']} ({worst['file']}, {worst['budget']}) |",
        ]
    )
    out = os.path.join(ROOT, "bench", "results", "fab_share")
    payload = {"summary": summary, "evaluations": found}
    publish(text, payload, f"{out}.json", markdown_path=f"{out}.md")


if __name__ == "__main__":
    main()
