"""The private Keras and TensorFlow APIs the library relies on, each with what breaks if an
upgrade changes it. A failure here names the place to rewrite before anything else fails."""

from __future__ import annotations

import inspect

import keras
import tensorflow as tf


def test_keras_model_builds_symbolically_through_maybe_symbolic_build():
    """fbat_tf/trainer.py overrides Model._maybe_symbolic_build(iterator, data_batch) to build
    the optimizer before the first trace (else tf.function traces the step twice) and to skip
    Keras' symbolic build under MultiWorkerMirroredStrategy (it fails there). If Keras renames
    or changes it, the override silently stops being called: the step is traced twice and
    multi-worker training fails at its first batch."""
    method = getattr(keras.Model, "_maybe_symbolic_build", None)
    assert method is not None, "keras.Model._maybe_symbolic_build is gone: see fbat_tf/trainer.py"
    parameters = list(inspect.signature(method).parameters)
    assert parameters == ["self", "iterator", "data_batch"], parameters
    source = inspect.getsource(keras.src.backend.tensorflow.trainer.TensorFlowTrainer.fit)
    assert "_maybe_symbolic_build" in source, "fit no longer calls _maybe_symbolic_build"


def test_tensorflow_says_whether_a_strategy_needs_merge_call():
    """fbat_tf/trainer.py skips a non-finite batch with a conditional optimizer step; under a
    strategy that needs merge_call it runs the condition in the cross-replica context, as
    Keras' LossScaleOptimizer does, and asks tf.__internal__ which case it is in. Without it,
    the conditional step fails under MirroredStrategy."""
    ask = tf.__internal__.distribute.strategy_supports_no_merge_call
    with tf.distribute.get_strategy().scope():
        assert ask() in (True, False)


def test_sgd_finds_a_variables_velocity_by_its_private_index():
    """fbat_tf/schedules.py's CyclicMomentumSGD finds a variable's velocity as SGD.update_step
    does, with Optimizer._get_variable_index; if it changes, the cycling momentum's update
    fails (tests/test_schedules.py too)."""
    optimizer = keras.optimizers.SGD(0.1, momentum=0.9)
    weights = [keras.Variable(1.0), keras.Variable(2.0)]
    optimizer.build(weights)
    assert [optimizer._get_variable_index(w) for w in weights] == [0, 1]
    assert "_get_variable_index" in inspect.getsource(keras.optimizers.SGD.update_step)


def test_batch_normalization_computes_its_statistics_in_a_private_method():
    """fbat_tf/models/layers.py's BatchNormalization overrides BatchNormalization._moments(inputs,
    mask) and reads self._reduction_axes, to keep the batch mean differentiable for second
    derivatives. If Keras renames either, the override is never called (or fails at build) and
    Fast-BAT's implicit term and GradAlign come out wrong without an error."""
    method = getattr(keras.layers.BatchNormalization, "_moments", None)
    assert method is not None, "BatchNormalization._moments is gone: see fbat_tf/models/layers.py"
    assert list(inspect.signature(method).parameters) == ["self", "inputs", "mask"]
    assert "self._moments(" in inspect.getsource(keras.layers.BatchNormalization.call)
    layer = keras.layers.BatchNormalization(axis=-1)
    layer.build((None, 4, 4, 3))
    assert list(layer._reduction_axes) == [0, 1, 2], layer._reduction_axes


def test_a_layer_walks_its_nested_layers_through_flatten_layers():
    """fbat_tf/models/layers.py (use_exact_second_derivatives) and export/artifacts.py find every
    nested layer with Layer._flatten_layers(include_self=, recursive=): Keras has no public walk
    (Model.layers stops at a custom layer's sublayers). If it goes, the exact-derivative swap and
    the ONNX export's Normalization fix miss nested layers."""

    class Block(keras.layers.Layer):
        def __init__(self):
            super().__init__()
            self.inner = keras.layers.BatchNormalization()

        def call(self, x):
            return self.inner(x)

    inputs = keras.Input((4,))
    model = keras.Model(inputs, Block()(inputs))
    walked = list(model._flatten_layers(include_self=True, recursive=True))
    assert model in walked
    assert any(isinstance(layer, keras.layers.BatchNormalization) for layer in walked)
    assert model not in list(model._flatten_layers(include_self=False))


def test_tensorflow_says_whether_a_graph_is_compiled_by_xla():
    """fbat_tf/models/layers.py asks tensorflow.python.ops.control_flow_util whether the graph
    being built is compiled by XLA (as TensorFlow's own gradients do) to pick a max-pooling
    gradient XLA compiles. If it goes, importing fbat_tf.models fails."""
    from tensorflow.python.ops import control_flow_util

    def ask(x):
        return x + float(
            control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph())
        )

    assert float(tf.function(ask, jit_compile=True)(tf.constant(0.0))) == 1.0
    assert float(tf.function(ask, jit_compile=False)(tf.constant(0.0))) == 0.0


def test_tensorflow_folds_a_functions_variables_into_constants():
    """fbat_tf/classifiers.py freezes a Keras model's inference function with
    tensorflow.python.framework.convert_to_constants.convert_variables_to_constants_v2 (TF 2 has
    no public way to fold variables into constants); if it goes, attacking a frozen graph
    fails at load."""
    from tensorflow.python.framework.convert_to_constants import (
        convert_variables_to_constants_v2,
    )

    weight = tf.Variable(3.0)
    function = tf.function(lambda x: x * weight).get_concrete_function(
        tf.TensorSpec([], tf.float32)
    )
    frozen = convert_variables_to_constants_v2(function)
    weight.assign(5.0)
    assert float(frozen(tf.constant(2.0))[0]) == 6.0
    assert not frozen.variables


# Every private name of Keras or TensorFlow the project's code uses, with the test above that
# pins it. A new one must be added here, with its test, and named in DESIGN §7.
PINNED = {
    "_maybe_symbolic_build": test_keras_model_builds_symbolically_through_maybe_symbolic_build,
    "_get_variable_index": test_sgd_finds_a_variables_velocity_by_its_private_index,
    "_moments": test_batch_normalization_computes_its_statistics_in_a_private_method,
    "_reduction_axes": test_batch_normalization_computes_its_statistics_in_a_private_method,
    "_flatten_layers": test_a_layer_walks_its_nested_layers_through_flatten_layers,
    "tf.__internal__": test_tensorflow_says_whether_a_strategy_needs_merge_call,
    "tensorflow.python.ops.control_flow_util": (
        test_tensorflow_says_whether_a_graph_is_compiled_by_xla
    ),
    "tensorflow.python.framework.convert_to_constants.convert_variables_to_constants_v2": (
        test_tensorflow_folds_a_functions_variables_into_constants
    ),
}


# Public names of Python's own that begin with an underscore: namedtuple's `_replace`, and
# `os._exit` (documented: the process ends without cleanup, as after Ctrl-C in flags/errors.py).
PUBLIC = {"_replace", "_exit"}


def _private_names_used(root: str) -> dict[str, set[str]]:
    """Each private Keras or TensorFlow name the code under `root` uses, with the files: an
    attribute `_x` the project does not define (or reads off `super()`), `tf.__internal__`
    (Python's public underscored names aside, PUBLIC), and an import from a `tensorflow.python` or
    `keras.src` module."""
    import ast
    import glob
    import os

    sources = [
        path
        for pattern in (
            "fbat_tf/**/*.py",
            "fbat_cli/**/*.py",
            "export/**/*.py",
            "flags/**/*.py",
            "study/**/*.py",
            "*.py",
        )
        for path in glob.glob(os.path.join(root, pattern), recursive=True)
    ]
    trees = {path: ast.parse(open(path, encoding="utf-8").read()) for path in sources}
    own = set()  # every name the project defines or assigns
    for tree in trees.values():
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                own.add(node.name)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                own.add(node.attr)
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                own.add(node.target.id)
            elif isinstance(node, ast.Assign):
                own.update(t.id for t in node.targets if isinstance(t, ast.Name))
    used: dict[str, set[str]] = {}
    for path, tree in trees.items():
        name = os.path.relpath(path, root)
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute):
                if node.attr == "__internal__":
                    used.setdefault("tf.__internal__", set()).add(name)
                elif node.attr.startswith("_") and not node.attr.startswith("__"):
                    inherited = ast.unparse(node.value) == "super()"  # an override's parent
                    if (inherited or node.attr not in own) and node.attr not in PUBLIC:
                        used.setdefault(node.attr, set()).add(name)
            elif isinstance(node, ast.ImportFrom) and node.module:
                if node.module.startswith(("tensorflow.python", "keras.src")):
                    for alias in node.names:
                        used.setdefault(f"{node.module}.{alias.name}", set()).add(name)
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.startswith(("tensorflow.python", "keras.src")):
                        used.setdefault(alias.name, set()).add(name)
    return used


def test_every_private_name_the_code_uses_is_pinned_here_and_in_the_design():
    """This file pins each private API the library relies on, so that an upgrade that breaks
    one fails here first, naming the place to rewrite. To comply: a new private name gets a
    test above, an entry in PINNED, and a line in DESIGN §7; a name no longer used leaves all
    three."""
    import os

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    used = _private_names_used(root)
    unpinned = {name: sorted(files) for name, files in used.items() if name not in PINNED}
    assert not unpinned, f"private APIs used but not pinned in {__file__}: {unpinned}"
    stale = sorted(set(PINNED) - set(used))
    assert not stale, f"pinned here but no longer used, remove them: {stale}"
    design = open(os.path.join(root, "docs", "DESIGN.md"), encoding="utf-8").read()
    section = design[design.index("## 7.") :]
    missing = [name for name in PINNED if name not in section]
    assert not missing, f"DESIGN §7 does not name these private APIs: {missing}"
