"""tf.data pipelines: (float32 NHWC images in [0, 1], int32 labels) batches, prefetched.

Two shapes of input: whole splits held in memory as uint8 numpy arrays (every dataset but
ImageNet), and a stream of encoded images (ImageNet from TFDS).

    from fbat_tf.data import augment, pipeline

    ds = pipeline.from_arrays(images_uint8, labels, batch_size=128, shuffle=True,
                              augment_fn=augment.pad_crop_flip, seed=0, drop_remainder=True)

Randomness is reproducible from `seed`: the shuffle order comes from a seeded
`Dataset.shuffle`, and each batch's augmentation seed from a seeded `Dataset.random`; both
change from one pass over the dataset to the next (so epochs differ) in the same way on
every run.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import tensorflow as tf

from fbat_tf.data.augment import AugmentFn


def _shuffle_seed(seed: int) -> int:
    return 2 * seed


def _augment_seeds(seed: int) -> tf.data.Dataset:
    # A different op seed from the shuffle's, so the two streams never coincide.
    return tf.data.Dataset.random(seed=2 * seed + 1, rerandomize_each_iteration=True).batch(2)


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
) -> tf.data.Dataset:
    """Batches of an in-memory split, in array order unless `shuffle`."""
    count = len(labels)
    image_shape = images.shape[1:]
    images_tensor = tf.constant(images, tf.uint8)
    labels_tensor = tf.constant(labels, tf.int32)
    # Shuffle indices, not images: the buffer then holds int64s rather than a copy of the data,
    # and a batch is one gather.
    indices = tf.data.Dataset.range(count)
    if shuffle:
        indices = indices.shuffle(count, seed=_shuffle_seed(seed), reshuffle_each_iteration=True)
    # Batch before repeat so every pass is a whole epoch of count // batch_size batches.
    batches = indices.batch(batch_size, drop_remainder=drop_remainder)

    def gather(batch_indices: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        x = tf.cast(tf.gather(images_tensor, batch_indices), tf.float32) / 255.0
        return x, tf.gather(labels_tensor, batch_indices)

    if augment_fn is None:
        ds = batches.map(gather, num_parallel_calls=tf.data.AUTOTUNE)
    else:

        def gather_and_augment(batch_indices: tf.Tensor, batch_seed: tf.Tensor):
            x, y = gather(batch_indices)
            return tf.ensure_shape(augment_fn(x, batch_seed), [None, *image_shape]), y

        ds = tf.data.Dataset.zip((batches, _augment_seeds(seed))).map(
            gather_and_augment, num_parallel_calls=tf.data.AUTOTUNE
        )
    return _finish(ds, repeat)


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
    shuffle_buffer: int = 10_000,
) -> tf.data.Dataset:
    """Batches of (encoded image bytes, label) examples, decoded and cropped per example.

    `train_view(image_uint8, seed)` is the random crop used when `augment`, `eval_view(image)`
    the deterministic one otherwise; both return float32 images in [0, 1] of one fixed shape.
    """
    if shuffle:
        examples = examples.shuffle(
            shuffle_buffer, seed=_shuffle_seed(seed), reshuffle_each_iteration=True
        )

    def decode(encoded: tf.Tensor) -> tf.Tensor:
        return tf.io.decode_image(encoded, channels=3, expand_animations=False)

    if augment:
        ds = tf.data.Dataset.zip((examples, _augment_seeds(seed))).map(
            lambda example, s: (train_view(decode(example[0]), s), example[1]),
            num_parallel_calls=tf.data.AUTOTUNE,
        )
    else:
        ds = examples.map(
            lambda encoded, label: (eval_view(decode(encoded)), label),
            num_parallel_calls=tf.data.AUTOTUNE,
        )
    ds = ds.map(lambda x, y: (x, tf.cast(y, tf.int32)))
    return _finish(ds.batch(batch_size, drop_remainder=drop_remainder), repeat)


def _finish(ds: tf.data.Dataset, repeat: bool) -> tf.data.Dataset:
    if repeat:
        ds = ds.repeat()
    return ds.prefetch(tf.data.AUTOTUNE)
