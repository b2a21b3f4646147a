"""tf.data pipelines: (float32 NHWC images in [0, 1], int32 labels) batches, prefetched.

Two shapes of input: whole splits held in memory as uint8 numpy arrays (every dataset but
ImageNet), and a stream of encoded images (ImageNet from TFDS).

    from fbat_tf.data import augment, pipeline

    ds = pipeline.from_arrays(images_uint8, labels, batch_size=128, shuffle=True,
                              augment_fn=augment.pad_crop_flip, seed=0, drop_remainder=True)

Randomness is a function of (`seed`, pass, position) alone. With `repeat=True` the dataset is
the endless stream of passes 0, 1, 2, ...: pass p is shuffled by a stateless permutation seeded
by (seed, p), and each batch's augmentation seed is folded from (seed, p, batch). `start_batch`
starts that stream anywhere, so a resumed run reads exactly what an uninterrupted one would.
Without `repeat`, each iteration over the dataset draws a fresh pass key from a seeded
`Dataset.random`, so epochs differ in the same way on every run.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import tensorflow as tf

from fbat_tf.data.augment import AugmentFn

# The graph-level seed of the shuffle in `from_encoded` (any fixed nonzero value).
GRAPH_SEED = 1


def _shuffle_seed(seed: int, epoch: tf.Tensor) -> tf.Tensor:
    return tf.stack([tf.constant(2 * seed, tf.int64), epoch])


def _augment_seed(seed: int, epoch: tf.Tensor, position: tf.Tensor) -> tf.Tensor:
    # An odd first word, so that no augmentation seed coincides with a shuffle seed.
    base = tf.stack([tf.constant(2 * seed + 1, tf.int64), epoch])
    return tf.random.experimental.stateless_fold_in(base, position)


def _epochs(seed: int, repeat: bool, first: int) -> tf.data.Dataset:
    """The pass keys: first, first + 1, ... when repeating; else one seeded random key per
    iteration over the dataset."""
    if repeat:
        return tf.data.Dataset.range(first, 2**62)
    return tf.data.Dataset.random(seed=seed, rerandomize_each_iteration=True).take(1)


def from_arrays(
    images: np.ndarray,
    labels: np.ndarray,
    *,
    batch_size: int,
    shuffle: bool,
    augment_fn: AugmentFn | None,
    seed: int,
    drop_remainder: bool,
    repeat: bool,
    start_batch: int = 0,
    with_indices: bool = False,
) -> tf.data.Dataset:
    """Batches of an in-memory split, in array order unless `shuffle`; `with_indices` adds each
    example's position in the split (int64 [batch]) as a third element."""
    count = len(labels)
    image_shape = images.shape[1:]
    images_tensor = tf.constant(images, tf.uint8)
    labels_tensor = tf.constant(labels, tf.int32)
    per_pass = count // batch_size if drop_remainder else -(-count // batch_size)

    def one_pass(epoch: tf.Tensor) -> tf.data.Dataset:
        # Shuffle indices, not images: a batch is then one gather from the split in memory.
        indices = tf.range(count, dtype=tf.int64)
        if shuffle:
            indices = tf.random.experimental.stateless_shuffle(
                indices, seed=_shuffle_seed(seed, epoch)
            )
        batches = tf.data.Dataset.from_tensor_slices(indices).batch(
            batch_size, drop_remainder=drop_remainder
        )
        positions = tf.data.Dataset.range(per_pass)
        return tf.data.Dataset.zip(
            (batches, positions, tf.data.Dataset.from_tensors(epoch).repeat())
        )

    def gather(batch_indices: tf.Tensor, position: tf.Tensor, epoch: tf.Tensor):
        x = tf.cast(tf.gather(images_tensor, batch_indices), tf.float32) / 255.0
        if augment_fn is not None:
            x = augment_fn(x, _augment_seed(seed, epoch, position))
            x = tf.ensure_shape(x, [None, *image_shape])
        if with_indices:
            return x, tf.gather(labels_tensor, batch_indices), batch_indices
        return x, tf.gather(labels_tensor, batch_indices)

    ds = _epochs(seed, repeat, start_batch // per_pass).flat_map(one_pass)
    ds = ds.skip(start_batch % per_pass)
    if not repeat:
        ds = ds.apply(tf.data.experimental.assert_cardinality(per_pass - start_batch % per_pass))
    return ds.map(gather, num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE)


def from_encoded(
    examples: tf.data.Dataset,
    *,
    train_view: Callable[[tf.Tensor, tf.Tensor], tf.Tensor],
    eval_view: Callable[[tf.Tensor], tf.Tensor],
    batch_size: int,
    shuffle: bool,
    augment: bool,
    seed: int,
    drop_remainder: bool,
    repeat: bool,
    start_batch: int = 0,
    batches_per_pass: int | None = None,
    shuffle_buffer: int = 10_000,
) -> tf.data.Dataset:
    """Batches of (encoded image bytes, label) examples, decoded and cropped per example.

    `train_view(image_uint8, seed)` is the random crop used when `augment`, `eval_view(image)`
    the deterministic one otherwise; both return float32 images in [0, 1] of one fixed shape.
    Each pass reads `examples` afresh (the same file order every pass) through a shuffle buffer
    seeded by (seed, pass). `start_batch` needs `batches_per_pass`.
    """
    if start_batch and not batches_per_pass:
        raise ValueError("start_batch needs batches_per_pass")
    per_pass = batches_per_pass or 1

    def decode(encoded: tf.Tensor) -> tf.Tensor:
        return tf.io.decode_image(encoded, channels=3, expand_animations=False)

    def one_pass(epoch: tf.Tensor) -> tf.data.Dataset:
        ds = examples
        if shuffle:
            shuffle_seed = tf.random.stateless_uniform(
                [], _shuffle_seed(seed, epoch), minval=None, maxval=None, dtype=tf.int64
            )
            # tf.data pairs a shuffle's seed with the graph's, and where that is 0 (after
            # keras.utils.set_random_seed(0), as training runs call it) it compares the tensor
            # seed with 0 in Python and fails. This function's graph gets a fixed seed of its
            # own: the order depends on (seed, pass) alone, whatever the global seed.
            tf.compat.v1.get_default_graph().seed = GRAPH_SEED
            ds = ds.shuffle(shuffle_buffer, seed=shuffle_seed, reshuffle_each_iteration=False)
        if augment:
            ds = tf.data.Dataset.zip((ds, tf.data.Dataset.range(2**62))).map(
                lambda example, i: (
                    train_view(decode(example[0]), _augment_seed(seed, epoch, i)),
                    example[1],
                ),
                num_parallel_calls=tf.data.AUTOTUNE,
            )
        else:
            ds = ds.map(
                lambda encoded, label: (eval_view(decode(encoded)), label),
                num_parallel_calls=tf.data.AUTOTUNE,
            )
        ds = ds.map(lambda x, y: (x, tf.cast(y, tf.int32)))
        return ds.batch(batch_size, drop_remainder=drop_remainder)

    ds = _epochs(seed, repeat, start_batch // per_pass).flat_map(one_pass)
    ds = ds.skip(start_batch % per_pass)
    if batches_per_pass and not repeat:
        ds = ds.apply(tf.data.experimental.assert_cardinality(per_pass - start_batch % per_pass))
    return ds.prefetch(tf.data.AUTOTUNE)
