"""The catalog names what the registries build, methods and attacks declare their options, and
the entry points parse their flags without loading TensorFlow, so that a bad command fails at
once."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import keras
import pytest

from fbat_tf import attacks, catalog, data, distribute, methods, models, upgrade
from fbat_tf.data import registry
from fbat_tf.methods import fast_bat
from fbat_tf.models import layers

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_each_registry_builds_exactly_the_catalogued_names():
    assert tuple(data.names()) == catalog.DATASETS
    streamed = tuple(n for n in data.names() if not registry.lookup(n).in_memory)
    assert streamed == catalog.STREAMED_DATASETS
    assert tuple(models.names()) == catalog.MODELS
    assert distribute.STRATEGIES == catalog.STRATEGIES
    assert layers.ACTIVATIONS == catalog.ACTIVATIONS
    assert fast_bat.IMPLICIT_GRADIENTS == catalog.IMPLICIT_GRADIENTS


def test_every_registered_attack_is_created_by_name():
    source = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    for name in attacks.names():
        attack = attacks.create(name, 8 / 255, {"source": source})
        assert callable(attack) and attack.eps == 8 / 255, name
    assert attacks.create("pgd", 8 / 255, steps=7, restarts=2).steps == 7
    assert attacks.label("pgd", {"steps": 7}) == "PGD-7-10"
    assert attacks.label("autoattack") == "AutoAttack (standard)"
    with pytest.raises(ValueError, match="pgdd"):
        attacks.create("pgdd", 8 / 255)
    with pytest.raises(ValueError, match="takes no options"):
        attacks.create("fab-t", 8 / 255, n_queries=10)
    with pytest.raises(ValueError, match=r"takes no option\(s\) \['p_init'\]"):
        attacks.create("square", 8 / 255, p_init=0.5)
    with pytest.raises(ValueError, match="source"):
        attacks.create("transfer", 8 / 255)


@pytest.mark.parametrize("entry_point", ["train", "sweep", "evaluate", "export.cli"])
def test_entry_points_define_their_flags_without_tensorflow(entry_point):
    code = (
        f"import sys; import {entry_point}; "
        "loaded = sorted(m for m in ('tensorflow', 'keras', 'tensorflow_datasets') "
        "if m in sys.modules); print(loaded); sys.exit(1 if loaded else 0)"
    )
    child = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert child.returncode == 0, child.stdout + child.stderr[-2000:]


@pytest.mark.parametrize(
    "spelled, name, options",
    [
        ("fastbat", "fastbat", {}),
        ("fastbat ig=none", "fastbat", {"ig": "none"}),
        ("fastbat ig=none", "fastbat", {"ig_coef": 0.0}),
        ("fastbat", "fastbat", {"ig_coef": 1.0, "lambda_inv": 10.0}),
        ("fastbat ig=hessian_aware", "fastbat", {"ig": "hessian_aware"}),
        ("pgd", "pgd", {}),
        ("pgd steps=10", "pgd", {"steps": 10}),
        ("fastat", "fastat", {}),
        ("free", "free", {"replays": 4}),
        ("elle", "elle", {"schedule": "constant", "weight": 10.0}),
        ("elle attack=none", "elle", {"attack": "none"}),
    ],
)
def test_a_method_s_cost_variant_is_bench_step_time_s_name_for_it(spelled, name, options):
    # bench/step_time.py names a variant "name:key=value"; its JSON keys read "name key=value".
    method = methods.create(name, eps=8 / 255, **options)
    assert method.cost_variant == spelled
    assert methods.cost_variant(name, method.config()) == spelled  # from a recorded config


def test_each_default_is_written_once(tmp_path, monkeypatch):
    """train.py's flags take TrainConfig's defaults (ε's in its own units), the default ε is
    the catalog's 8/255, every default of PGD's steps and restarts is the catalog's PGD-50-10
    and its step size the catalog's ε/4; a sweep's evaluation batch, PGD's passes and every
    method option's default (also where an older record is read) each have one source."""
    import dataclasses
    import inspect

    from absl import flags as absl_flags

    import flags.common  # noqa: F401 (defines the flags)
    import flags.train  # noqa: F401
    from export import savedmodel
    from fbat_tf.attacks.pgd import PGD
    from fbat_tf.attacks.transfer import transfer_pgd
    from fbat_tf.evaluation import pgd_attacks
    from fbat_tf.records import MethodRecord, TrainConfig, units
    from fbat_tf.sweeps import definition, estimate, evaluations
    from fbat_tf.sweeps.cells import Cell

    # ε: the run's, train.py's flag (in 1/255 units) and a method's made without one.
    assert catalog.EPS == 8 / 255
    assert TrainConfig(workdir="w").eps == catalog.EPS
    assert absl_flags.FLAGS["eps"].default == units.in_flag_units(catalog.EPS) == 8.0
    assert inspect.signature(methods.create).parameters["eps"].default == catalog.EPS

    other_units = {"workdir", "eps", "precision", "jit_compile", "verbose"}
    compared = 0
    for field in dataclasses.fields(TrainConfig):
        if field.name in absl_flags.FLAGS and field.name not in other_units:
            assert absl_flags.FLAGS[field.name].default == field.default, field.name
            compared += 1
    assert compared >= 25
    pgd = (catalog.PGD_STEPS, catalog.PGD_RESTARTS)
    assert pgd == (50, 10)
    for function in (PGD.__init__, transfer_pgd, pgd_attacks):
        parameters = inspect.signature(function).parameters
        assert (parameters["steps"].default, parameters["restarts"].default) == pgd
    assert tuple(attacks.entry("pgd").defaults().values()) == pgd
    config = TrainConfig(workdir="w")
    assert (config.eval_pgd_steps, config.eval_pgd_restarts) == pgd
    older = upgrade.evaluation_block({})["attacks"][0]["options"]  # a sweep's older form
    assert (older["steps"], older["restarts"]) == pgd
    # A sweep cell that names no final-test flag (what the estimate reads).
    cell = Cell("c", {"method": "pgd"}, ("method",))
    assert (cell.config.eval_pgd_steps, cell.config.eval_pgd_restarts) == pgd
    # PGD's step size: the attack's default, and the model card's account of train.py's test.
    assert catalog.PGD_STEP_SIZE == 1 / 4
    assert PGD(catalog.EPS).step_size == catalog.EPS * catalog.PGD_STEP_SIZE
    (tmp_path / "results.json").write_text(
        json.dumps(
            {
                "config": {"workdir": str(tmp_path), "eps": catalog.EPS},
                "status": "complete",
                "history": [],
                "final": {
                    "test_examples": 4,
                    "test_clean_accuracy": 0.5,
                    "test_pgd_robust_accuracy": 0.25,
                },
            }
        )
    )
    card_pgd = savedmodel.model_card(str(tmp_path))["robustness"]["pgd"]
    assert card_pgd["step_size"] == PGD(catalog.EPS).step_size
    # A sweep's evaluation batch: a Definition's, and that of each form of "evaluation".
    batch = evaluations.EVALUATION_DEFAULTS["batch_size"]
    assert batch == 500
    fields = {field.name: field.default for field in dataclasses.fields(definition.Definition)}
    assert fields["batch_size"] == batch
    for given in ({}, {"attacks": [{"attack": "pgd"}]}):
        assert evaluations.parse_evaluations("d.json", given)[0] == batch
    # PGD-7-3's forward-backward passes: the registry's, which a sweep's estimate of train.py's
    # validation (and FGSM's and a clean pass) and final test (and a clean pass) counts.
    seven_three = {"steps": 7, "restarts": 3}
    passes = attacks.passes("pgd", seven_three)
    assert passes == 7 * 3 == attacks.passes("transfer", seven_three)
    cell = Cell("c", {"val_attack_steps": 7, "val_restarts": 3, "val_examples": 1}, ())
    assert estimate._validation_seconds({}, cell, 1.0, 0.5) == passes + 2
    final = {"eval_pgd_steps": 7, "eval_pgd_restarts": 3, "eval_autoattack": False}
    cell = Cell("c", {**final, "eval_examples": 1}, ())
    assert estimate._final_seconds({}, cell, 1.0, 0.5) == 1 + passes
    # A method option's default is its declaration's: train.py's flag and the constructor take
    # it from there.
    declared = 0
    for name in methods.names():
        entry = methods.entry(name)
        cls = entry.target
        parameters = inspect.signature(cls.__init__).parameters
        for option in entry.options:
            assert absl_flags.FLAGS[entry.flag_name(option)].default == option.default
            assert parameters[option.name].default == option.default, (name, option.name)
            declared += 1
    assert declared >= 12
    # Fast-BAT's ig_coef where an older record names none: the declaration's, so that the
    # record reads as one stating it, and as first-order Fast-BAT were the default 0.
    ig_coef = methods.defaults("fastbat")["ig_coef"]
    assert ig_coef == 0.1

    def read_ig(config: dict) -> str | None:
        return upgrade.method(MethodRecord("fastbat", config=config), "fastbat").config.get("ig")

    assert read_ig({}) == read_ig({"ig_coef": ig_coef})
    fastbat = methods.entry("fastbat")
    # An Entry tells its class it is the class's declaration: the copy below would stay the
    # class's after the test (and fail test_methods' check that it is the module's) were the
    # class's own not put back at teardown.
    monkeypatch.setattr(fastbat.target, "entry", fastbat)
    zero = [
        dataclasses.replace(o, default=0.0) if o.name == "ig_coef" else o for o in fastbat.options
    ]
    monkeypatch.setitem(
        methods.REGISTRY, "fastbat", dataclasses.replace(fastbat, options=tuple(zero))
    )
    assert read_ig({}) == "none"


def test_both_programs_calibrate_int8_on_the_catalog_s_number_of_images():
    """train.py's and `python -m export`'s --int8_examples (two programs, one flag name: read in
    a process each) default to the catalog's number."""
    for module in ("flags.train", "export.cli"):
        done = subprocess.run(
            [
                sys.executable,
                "-c",
                f"import {module}; from absl import flags; "
                "print(flags.FLAGS['int8_examples'].default)",
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        assert int(done.stdout.strip().splitlines()[-1]) == catalog.INT8_EXAMPLES == 500, module
