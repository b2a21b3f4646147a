"""A sweep definition is checked whole before any cell runs, each error naming its key: an
infinite margin, a flag key that smuggles an absl flag, seeds train.py cannot take and an
unknown method are refused at load, not in every cell once TensorFlow has loaded."""

from __future__ import annotations

import json

import pytest

from fbat_tf import sweeps

GRID = [{"method": ["fastat"], "eps": [8], "seed": [0]}]


def load(tmp_path, **raw):
    path = tmp_path / "d.json"
    path.write_text(json.dumps({"grid": GRID, **raw}))
    return sweeps.load_definition(str(path))


@pytest.mark.parametrize(
    "raw, says",
    [
        ({"margin": float("inf")}, "'margin' must be a positive, finite number"),
        ({"margin": float("nan")}, "'margin' must be a positive, finite number"),
        ({"flags": {"flagfile=/etc/flags": True}}, "flags: 'flagfile=/etc/flags' is not a"),
        ({"flags": {"flagfile": "x.flags"}}, "flags: 'flagfile' is not a train.py flag name"),
        ({"grid": [{"method": ["fastat"], "undefok": ["x"]}]}, "grid part 0: 'undefok' is not"),
        ({"grid": [{"method": ["fastat"], "Eps": [8]}]}, "grid part 0: 'Eps' is not"),
        ({"grid": [{"method": ["fastat"], "seed": [-1]}]}, "'seed' -1 must be a whole number"),
        ({"grid": [{"method": ["fastat"], "seed": [2**40]}]}, "'seed' 1099511627776 must be"),
        ({"grid": [{"method": ["fastat"], "seed": [1.5]}]}, "'seed' 1.5 must be a whole number"),
        (
            {"grid": [{"method": ["fastta"], "eps": [8]}], "comparisons": [["fastta", "x"]]},
            "grid part 0: 'method' 'fastta' is not a method; known: standard, fastat",
        ),
    ],
)
def test_a_bad_definition_is_refused_at_load_naming_the_key(tmp_path, raw, says):
    with pytest.raises(sweeps.DefinitionError) as raised:
        load(tmp_path, **raw)
    message = str(raised.value)
    assert says in message and "\n" not in message


def test_json_s_infinity_is_read_as_json_allows_and_still_refused(tmp_path):
    path = tmp_path / "d.json"
    path.write_text('{"grid": [{"method": ["fastat"], "eps": [8]}], "margin": Infinity}')
    with pytest.raises(sweeps.DefinitionError, match="'margin' must be a positive, finite"):
        sweeps.load_definition(str(path))


def test_a_good_definition_loads(tmp_path):
    definition = load(tmp_path, margin=0.5)
    assert definition.margin == 0.5 and [c.name for c in sweeps.expand(definition)] == [
        "fastat-eps8-seed0"
    ]


def test_a_grid_of_more_cells_than_a_sweep_runs_is_refused_before_it_is_listed(tmp_path):
    """A 100,000-cell grid printed nothing for minutes and grew to gigabytes in a dry run."""
    grid = [{"method": ["fastat"], "eps": list(range(1, 101)), "seed": list(range(1000))}]
    with pytest.raises(sweeps.DefinitionError, match=r"'grid' makes 100,000 cells, more than"):
        load(tmp_path, grid=grid)


def test_a_grid_value_reaches_train_py_and_evaluate_py_as_given(tmp_path):
    """A grid ε of 1.23456789 reached train.py as --eps=1.23457 (and evaluate.py's budgets so):
    a float that six digits would round is written in full; others keep their short form."""
    grid = [{"method": ["pgd"], "norm": ["l2"], "eps": [1.23456789, 0.5, 8.0], "seed": [0]}]
    definition = load(tmp_path, grid=grid)
    cells = {cell.flags["eps"]: cell for cell in sweeps.expand(definition)}
    argv = sweeps.commands(definition, cells[1.23456789], str(tmp_path / "out"))
    assert "--eps=1.23456789" in argv["train"]
    evaluated = [w for words in list(argv.values())[1:] for w in words if w.startswith("--eps=")]
    assert evaluated and all("1.23456789" in w and "1.23457" not in w for w in evaluated), argv
    assert sweeps.flag_words({"eps": 0.5, "lr_max": 8.0, "ig_coef": 1e-05}) == [
        "--eps=0.5",
        "--lr_max=8",
        "--ig_coef=1e-05",
    ]
