"""The library's imports go down the layers of DESIGN.md §1 and never in a loop, read from the
source with `ast` (every import, also those inside functions). The study's package (study/)
stands above the library: it reads what the sweeps' cells hold, and nothing below imports it."""

from __future__ import annotations

import ast
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(ROOT, "fbat_tf")
STUDY = os.path.join(ROOT, "study")

# Bottom up. A module may import modules of lower layers, and modules of its own package (its
# siblings in attacks/, data/, methods/ or models/); the longest matching prefix gives a
# module's layer.
LAYERS = (
    ("fbat_tf", "fbat_tf.catalog"),
    (
        "fbat_tf.constraints",  # the norms it projects onto are named in the catalog
        "fbat_tf.device",
        "fbat_tf.distribute",
        "fbat_tf.schedules",
        "fbat_tf.attacks.losses",
    ),
    ("fbat_tf.models", "fbat_tf.data"),
    ("fbat_tf.records",),  # a run's record and its config, as types
    # a run directory's files; an evaluation's running sums; an exported file's runtime;
    # evaluate.py's robustness-vs-ε plot (written as the records write files)
    ("fbat_tf.run", "fbat_tf.tally", "fbat_tf.artifacts", "fbat_tf.plots"),
    ("fbat_tf.attacks", "fbat_tf.classifiers"),  # the attacks, and the classifiers they attack
    ("fbat_tf.methods",),
    # the trainer and the evaluation; older records read as today's, by the method registry
    # and older evaluations re-scored by today's robust definition; the reference AutoAttack's
    # checks, which read the attacks' losses and graphs
    (
        "fbat_tf.trainer",
        "fbat_tf.evaluation",
        "fbat_tf.upgrade",
        "fbat_tf.rescore",
        "fbat_tf.checks",
    ),
    ("fbat_tf.callbacks", "fbat_tf.indicators"),  # the indicators run an evaluation's attacks
    # one run; the sweeps; committed evaluations given today's indicators from their models
    ("fbat_tf.training", "fbat_tf.sweeps", "fbat_tf.indicate"),
    # the report on the sweeps' cells: tables, verdicts, plots (the launchers are handed it)
    ("study",),
)


def module_names(packages: tuple[str, ...] = (PACKAGE, STUDY)) -> dict[str, str]:
    """Dotted module name -> source path, for every module of the library and the study."""
    found = {}
    for top, _, files in (walked for package in packages for walked in os.walk(package)):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(top, name)
                dotted = os.path.relpath(path, ROOT)[: -len(".py")].replace(os.sep, ".")
                found[dotted.removesuffix(".__init__")] = path
    return found


def imports(path: str, modules: set[str]) -> set[str]:
    """The package's modules that the file at `path` imports (`from a import b` names a.b when
    that is a module, else a)."""
    names = set()
    for node in ast.walk(ast.parse(open(path).read())):
        # A module named now and imported at first use (fbat_tf/lazy.py) is imported all the same.
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "later"
            and isinstance(node.args[0], ast.Constant)
        ):
            names.add(node.args[0].value)
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                child = f"{node.module}.{alias.name}"
                names.add(child if child in modules else node.module)
    return {name for name in names if name in modules}


def layer(module: str) -> int:
    best = None
    for index, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if module == prefix or module.startswith(prefix + "."):
                if best is None or len(prefix) > best[0]:
                    best = (len(prefix), index)
    assert best is not None, f"{module} has no layer in LAYERS"
    return best[1]


def package(module: str, modules: dict[str, str]) -> str:
    """The package a module belongs to: itself for a package or a module of fbat_tf's top level
    (each is its own unit there), else its parent (attacks, data, methods, models)."""
    parent = module.rpartition(".")[0]
    if modules[module].endswith("__init__.py") or parent == "fbat_tf":
        return module
    return parent


def graph() -> dict[str, set[str]]:
    modules = module_names()
    return {name: imports(path, set(modules)) - {name} for name, path in modules.items()}


def upward_imports(edges: dict[str, set[str]], packages: dict[str, str]) -> list[str]:
    """Imports of a module's own layer or above, outside its package."""
    return [
        f"{module} (layer {layer(module)}) imports {target} (layer {layer(target)})"
        for module, targets in sorted(edges.items())
        for target in sorted(targets)
        if layer(target) >= layer(module)
        and packages[module] != packages[target]
        and packages[target] != module  # a package's __init__ re-exports its modules
    ]


def loops(edges: dict[str, set[str]]) -> list[list[str]]:
    """Import loops, each as the modules along it (depth-first search)."""
    state: dict[str, str] = {}
    found = []

    def visit(module: str, path: list[str]) -> None:
        state[module] = "open"
        for target in sorted(edges[module]):
            if state.get(target) == "open":
                found.append(path[path.index(target) :] + [target])
            elif target not in state:
                visit(target, path + [target])
        state[module] = "done"

    for module in sorted(edges):
        if module not in state:
            visit(module, [module])
    return found


def test_every_import_goes_down_a_layer_or_stays_in_its_package():
    modules = module_names()
    packages = {name: package(name, modules) for name in modules}
    wrong = upward_imports(graph(), packages)
    assert not wrong, "\n".join(wrong)


def test_the_library_holds_no_report_and_the_launchers_are_handed_it():
    """The report lives in study/: no module of fbat_tf/ imports it (the layers above say so
    too), and sweep.py hands it to both launchers, which call what they are handed."""
    library = [m for m in module_names((PACKAGE,))]
    edges = graph()
    importers = [m for m in library if any(t.startswith("study") for t in edges[m])]
    assert not importers, f"the library imports the study: {importers}"
    assert not [m for m in library if m.split(".")[-1] in ("report", "readings", "comparisons")]
    sweep = ast.parse(open(os.path.join(ROOT, "fbat_cli", "sweep.py")).read())
    handed = [
        node.func.attr
        for node in ast.walk(sweep)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in ("run_cells", "run_cells_on_ray")
        and any(ast.unparse(arg) == "study.rewrite" for arg in node.args)
    ]
    assert sorted(handed) == ["run_cells", "run_cells_on_ray"], handed


def test_a_lazily_named_module_counts_as_an_import():
    """`later("fbat_tf.constraints")` in a method's module is an import of constraints: the
    checks above see it (Fast-AT's module names it so)."""
    path = os.path.join(PACKAGE, "methods", "fast_at.py")
    assert "fbat_tf.constraints" in imports(path, set(module_names()))


def test_no_import_loop():
    found = loops(graph())
    assert not found, "\n".join(" -> ".join(loop) for loop in found)


def test_the_checks_report_a_loop_and_an_upward_import():
    """On a made-up graph with the two faults the package once had: evaluation and AutoAttack
    importing each other, and attacks.metrics importing from a training method."""
    edges = {
        "fbat_tf.evaluation": {"fbat_tf.attacks.autoattack"},
        "fbat_tf.attacks.autoattack": {"fbat_tf.evaluation"},
        "fbat_tf.attacks.metrics": {"fbat_tf.methods.fast_at_ga"},
        "fbat_tf.methods.fast_at_ga": {"fbat_tf.attacks.losses"},
        "fbat_tf.attacks.losses": set(),
    }
    packages = {name: name.rpartition(".")[0] for name in edges}
    assert loops(edges) == [
        ["fbat_tf.attacks.autoattack", "fbat_tf.evaluation", "fbat_tf.attacks.autoattack"]
    ]
    assert upward_imports(edges, packages) == [
        "fbat_tf.attacks.autoattack (layer 5) imports fbat_tf.evaluation (layer 7)",
        "fbat_tf.attacks.metrics (layer 5) imports fbat_tf.methods.fast_at_ga (layer 6)",
    ]


RUN_FILES = ("results.json", "flags.txt", "best.weights.h5", "checkpoints", "tensorboard", "eval-")


def run_file_literals(path: str) -> list[str]:
    """String literals of a file that name a run directory's file: a word (no spaces, so not
    prose such as a flag's help) containing one of RUN_FILES, and no field of a run's config
    (`tensorboard_every` names a setting, not the tensorboard/ folder)."""
    import dataclasses

    from fbat_tf.records import TrainConfig

    settings = {field.name for field in dataclasses.fields(TrainConfig)}
    found = []
    for node in ast.walk(ast.parse(open(path).read())):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            text = node.value
            if text in settings:
                continue
            if " " not in text and any(name in text for name in RUN_FILES):
                found.append(f"{os.path.relpath(path, ROOT)}:{node.lineno}: {text!r}")
    return found


def test_only_the_run_module_names_the_run_directory_files():
    sources = [
        p for p in module_names().values() if not p.endswith(os.path.join("fbat_tf", "run.py"))
    ]
    sources += [
        os.path.join(ROOT, "fbat_cli", name) for name in ("train.py", "evaluate.py", "sweep.py")
    ]
    sources += [
        os.path.join(ROOT, "export", name)
        for name in os.listdir(os.path.join(ROOT, "export"))
        if name.endswith(".py")
    ]
    named = [literal for path in sorted(sources) for literal in run_file_literals(path)]
    assert not named, "\n".join(named)
    assert run_file_literals(os.path.join(PACKAGE, "run.py"))  # the check sees the names


ENTRY_POINTS = ("train", "evaluate", "sweep")


def test_no_entry_point_imports_another():
    """What train.py and sweep.py share lives in flags/ and the library; an entry point is a
    program, never a library of another."""
    imported = {}
    for name in ENTRY_POINTS:
        found = set()
        for node in ast.walk(ast.parse(open(os.path.join(ROOT, "fbat_cli", f"{name}.py")).read())):
            if isinstance(node, ast.Import):
                found.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found.add(node.module.split(".")[0])
        imported[name] = found & (set(ENTRY_POINTS) - {name})
    assert imported == dict.fromkeys(ENTRY_POINTS, set())
    # The check sees an import: the library module the entry points share is found.
    sweep = ast.parse(open(os.path.join(ROOT, "fbat_cli", "sweep.py")).read())
    assert any(isinstance(n, ast.ImportFrom) and n.module == "flags" for n in ast.walk(sweep))


def test_no_branch_on_a_method_or_attack_name_outside_its_own_package():
    """Methods and attacks say what others need of them (replays, single_device, log names,
    cost_variant, options, labels); nothing outside fbat_tf/methods and fbat_tf/attacks compares
    a name with one of theirs."""
    from fbat_tf import attacks, methods

    names = set(methods.names()) | set(attacks.names())
    sources = [
        path
        for module, path in module_names().items()
        if not module.startswith(("fbat_tf.methods", "fbat_tf.attacks"))
    ]
    sources += [os.path.join(ROOT, f"{name}.py") for name in ENTRY_POINTS]
    for folder in ("flags", "export"):
        sources += [
            os.path.join(ROOT, folder, f)
            for f in os.listdir(os.path.join(ROOT, folder))
            if f.endswith(".py")
        ]
    found = []
    for path in sources:
        for node in ast.walk(ast.parse(open(path).read())):
            if isinstance(node, ast.Compare):
                for operand in [node.left, *node.comparators]:
                    elements = (
                        operand.elts if isinstance(operand, (ast.Tuple, ast.List)) else [operand]
                    )
                    for element in elements:
                        if isinstance(element, ast.Constant) and element.value in names:
                            found.append(
                                f"{os.path.relpath(path, ROOT)}:{node.lineno}: {element.value!r}"
                            )
    assert not found, "\n".join(found)


def test_every_registered_attack_is_built_inside_the_attacks_package():
    """The registry imports each attack's builder inside a function, when the attack is made:
    each one lies in fbat_tf/attacks, so that the registry (low in the house) never reaches up
    to a module above it, and none is named by a string."""
    from fbat_tf import attacks

    built = {name: attacks.entry(name).target() for name in attacks.names()}
    outside = [
        f"{n}: {b.__module__}"
        for n, b in built.items()
        if not b.__module__.startswith("fbat_tf.attacks.")
    ]
    assert not outside, outside
    assert not [n for n in attacks.names() if isinstance(attacks.entry(n).target, str)]


def test_no_registry_names_a_class_by_a_string():
    """The registries list what they hold by importing it: no "module:Class" string in the
    library (a name in a string is an import no check here can see, and a typo found late)."""
    import re

    named = [
        f"{os.path.relpath(path, ROOT)}:{node.lineno}: {node.value!r}"
        for path in module_names().values()
        for node in ast.walk(ast.parse(open(path).read()))
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and re.fullmatch(r"fbat_tf(\.\w+)+:\w+", node.value)
    ]
    assert not named, "\n".join(named)


def test_modules_and_orchestration_stay_short():
    """No module of the library over 450 lines; the functions that run a training, an
    evaluation, a sweep and an export at most 60 lines each, the work in named steps below
    them."""
    long_modules = [
        f"{module}: {n}"
        for module, path in module_names().items()
        if (n := len(open(path).read().splitlines())) > 450
    ]
    assert not long_modules
    for path, names in (
        ("fbat_tf/training.py", None),  # every function of the module
        ("fbat_cli/train.py", ("main",)),
        ("fbat_cli/evaluate.py", ("main",)),
        ("fbat_cli/sweep.py", ("main",)),
        ("fbat_tf/sweeps/cluster.py", ("run_cells_on_ray",)),
        ("export/cli.py", ("main",)),
        ("export/savedmodel.py", ("export_model", "model_card")),
    ):
        tree = ast.parse(open(os.path.join(ROOT, path)).read())
        functions = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
        for name in names or functions:
            assert name in functions, (path, name)
            found = functions[name]
            assert found.end_lineno - found.lineno + 1 <= 60, (path, name)
