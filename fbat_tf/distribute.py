"""tf.distribute strategies by name, for train.py and evaluate.py.

    strategy = create_strategy("mirrored")     # all local GPUs (or the logical CPUs in tests)
    with strategy.scope():
        classifier = models.build(...)
        trainer = AdversarialTrainer(classifier, method); trainer.compile(optimizer=...)
    trainer.fit(dataset_with_global_batch)      # Keras splits each global batch over replicas

Per-example sums stay per example, and the trainer scales each replica's objective by
1/num_replicas, so that the all-reduced (summed) gradient is that of the mean over the global
batch: a mirrored step equals a single-device step on the same global batch, except where
batch-norm statistics are per replica (as in any data-parallel training without synchronized
batch-norm).

"multi_worker" reads the cluster from TF_CONFIG (see BUILD.md); "tpu" connects to the TPU
named by the environment (TPU_NAME) or the local one.
"""

from __future__ import annotations

import tensorflow as tf

from fbat_tf.catalog import STRATEGIES


def create_strategy(name: str) -> tf.distribute.Strategy:
    if name == "default":
        return tf.distribute.get_strategy()
    if name == "mirrored":
        gpus = tf.config.list_logical_devices("GPU")
        devices = [d.name for d in gpus] or [d.name for d in tf.config.list_logical_devices("CPU")]
        return tf.distribute.MirroredStrategy(devices)
    if name == "multi_worker":
        return tf.distribute.MultiWorkerMirroredStrategy()
    if name == "tpu":
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver()
        tf.config.experimental_connect_to_cluster(resolver)
        tf.tpu.experimental.initialize_tpu_system(resolver)
        return tf.distribute.TPUStrategy(resolver)
    raise ValueError(f"unknown strategy {name!r}; choose one of {STRATEGIES}")


def is_chief(strategy: tf.distribute.Strategy) -> bool:
    """True except on the non-chief workers of a multi-worker strategy (worker 0 is chief)."""
    return _is_chief(getattr(strategy, "cluster_resolver", None))


def is_chief_process(strategy_name: str) -> bool:
    """`is_chief` before the strategy exists: from TF_CONFIG, for strategy "multi_worker"."""
    if strategy_name != "multi_worker":
        return True
    return _is_chief(tf.distribute.cluster_resolver.TFConfigClusterResolver())


def _is_chief(resolver) -> bool:
    if resolver is None or not resolver.cluster_spec().as_dict():
        return True
    return resolver.task_type in ("chief", None) or (
        resolver.task_type == "worker"
        and resolver.task_id == 0
        and "chief" not in resolver.cluster_spec().as_dict()
    )
