"""`load`: batches of a dataset split from the source `sources.resolve` finds.

Splits: "train" is the first 90% of the training split and "validation" the last 10%, in file
order; "train_full" is all of it; "test" is the test split. With `validation_from="test"` (how
the paper's released code splits Tiny-ImageNet) "train" is the whole training split and the test
split is halved class by class: "validation" is one half, "test" the other (`held_out`).
Everything but ImageNet is decoded once per process into memory (uint8, a few splits kept) and
batched from there; ImageNet is streamed from TFDS and decoded per example.
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np
import tensorflow as tf

from fbat_tf import catalog
from fbat_tf.data import augment as augment_lib
from fbat_tf.data import pipeline, registry, sources

SPLITS = ("train", "validation", "train_full", "test")
# Where the validation split comes from: the training split's last tenth, or half the test split.
VALIDATION_SOURCES = catalog.VALIDATION_SOURCES
# The validation split is the last 1/_VALIDATION_DIVISOR of the training split.
_VALIDATION_DIVISOR = 10
# The seed of the class-by-class halving of the test split (validation_from="test"). Fixed, so
# that every machine and every run holds out the same images; results.json records it.
HELD_OUT_SEED = 10


def load(
    name: str,
    split: str,
    *,
    data_dir: str | None = None,
    batch_size: int = 128,
    shuffle: bool | None = None,
    augment: bool | None = None,
    seed: int = 0,
    max_examples: int | None = None,
    drop_remainder: bool | None = None,
    repeat: bool = False,
    start_batch: int = 0,
    download: bool = True,
    validation_from: str = "train",
    with_indices: bool = False,
) -> tf.data.Dataset:
    """Batches of (float32 NHWC images in [0, 1], int32 labels) of one split, prefetched;
    with `with_indices`, (images, labels, int64 positions of the examples in the split), for a
    training method with state per example (in-memory datasets only).

    `shuffle`, `augment` and `drop_remainder` default to True for "train"/"train_full" and to
    False otherwise. `max_examples` keeps the first N examples of the split (after the 90/10
    cut, before shuffling). `seed` fixes the shuffle order and the augmentation; successive
    passes over the returned dataset differ from each other, identically on every run.
    `repeat=True` gives the endless stream of passes 0, 1, 2, ... (each of
    `len(split) // batch_size` batches when dropping the remainder), pass p shuffled and
    augmented from (seed, p) alone; `start_batch=n` starts that stream at its n-th batch, which
    is how a resumed run reads on exactly where it stopped. Datasets without augmentation
    (SVHN, MNIST, Fashion-MNIST) ignore `augment`. `validation_from` is "train" (validation is
    the training split's last tenth) or "test" (half the test split, `held_out`).
    """
    entry = registry.lookup(name)
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r} for {name!r}; valid splits: {list(SPLITS)}")
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
    if max_examples is not None and (not isinstance(max_examples, int) or max_examples < 1):
        raise ValueError(f"max_examples must be a positive integer or None, got {max_examples!r}")
    if not isinstance(start_batch, int) or start_batch < 0:
        raise ValueError(f"start_batch must be a non-negative integer, got {start_batch!r}")
    if validation_from not in VALIDATION_SOURCES:
        raise ValueError(
            f"validation_from must be one of {list(VALIDATION_SOURCES)}, got {validation_from!r}"
        )
    if validation_from == "test" and not entry.in_memory:
        raise ValueError(
            f"{name} is streamed: its validation split comes from its training split only "
            "(validation_from='train')"
        )
    training = split in ("train", "train_full")
    augment = training if augment is None else augment
    # The batching options, as pipeline.from_arrays and pipeline.from_encoded take them.
    options = dict(
        batch_size=batch_size,
        shuffle=training if shuffle is None else shuffle,
        seed=seed,
        drop_remainder=training if drop_remainder is None else drop_remainder,
        repeat=repeat,
        start_batch=start_batch,
    )

    source = sources.resolve(entry, data_dir, download)
    if source.needs_download:
        sources.download(entry, source, data_dir)
    if not entry.in_memory:
        if with_indices:
            raise ValueError(_NO_INDICES.format(name=entry.info.name))
        return _load_streamed(entry, source, split, max_examples, augment, options)

    images, labels = _split_arrays(entry, source, split, max_examples, validation_from)
    _check_batchable(entry.info.name, split, len(labels), options)
    augment_fn = None
    if augment and entry.augmentation is not None:
        augment_fn = getattr(augment_lib, entry.augmentation)
    return pipeline.from_arrays(
        images, labels, augment_fn=augment_fn, with_indices=with_indices, **options
    )


_NO_INDICES = (
    "{name} is streamed, so its batches carry no example indices: a method with state per "
    "example trains on an in-memory dataset only"
)


def examples(
    name: str,
    split: str,
    *,
    data_dir: str | None = None,
    max_examples: int | None = None,
    download: bool = True,
    validation_from: str = "train",
    **batching: Any,
) -> int:
    """How many examples `load` with these arguments batches (before dropping a remainder):
    the size of a state kept per example of the split (in-memory datasets only). `load`'s
    arguments that only batch the split (`batch_size`, `seed`, ...) are taken and change
    nothing."""
    entry = registry.lookup(name)
    if not entry.in_memory:
        raise ValueError(_NO_INDICES.format(name=entry.info.name))
    source = sources.resolve(entry, data_dir, download)
    if source.needs_download:
        sources.download(entry, source, data_dir)
    return len(_split_arrays(entry, source, split, max_examples, validation_from)[1])


def _split_arrays(
    entry: registry.Entry,
    source: sources.Source,
    split: str,
    max_examples: int | None,
    validation_from: str,
) -> tuple[np.ndarray, np.ndarray]:
    """The images and labels of an in-memory split, in the order `load` indexes them."""
    if validation_from == "test":
        images, labels = _held_out_arrays(entry, source, split, max_examples)
    else:
        images, labels = _arrays(entry, source, "test" if split == "test" else "train")
        start, stop = split_range(len(labels), split, max_examples)
        images, labels = images[start:stop], labels[start:stop]
    if images.shape[1:] != entry.info.image_shape:
        raise ValueError(
            f"{source.description} holds images of shape {images.shape[1:]}, "
            f"but {entry.info.name} images are {entry.info.image_shape}"
        )
    return images, labels


def split_range(count: int, split: str, max_examples: int | None = None) -> tuple[int, int]:
    """[start, stop) of `split` within its source split of `count` examples.

    "train" and "validation" cut the training split at count - count // 10; "train_full" and
    "test" take all of their split. `max_examples` then keeps the first N of the range.
    """
    cut = count - count // _VALIDATION_DIVISOR
    start, stop = {
        "train": (0, cut),
        "validation": (cut, count),
        "train_full": (0, count),
        "test": (0, count),
    }[split]
    if max_examples is not None:
        stop = min(stop, start + max_examples)
    return start, stop


def held_out(labels: np.ndarray, seed: int = HELD_OUT_SEED) -> tuple[np.ndarray, np.ndarray]:
    """Indices (ascending) of the validation and test halves of a test split with `labels`.

    Each class's examples are shuffled by `seed` (classes in ascending order, one generator)
    and the first half of each, rounded down, is validation: 25 of each Tiny-ImageNet class's
    50 val images, as the paper's released loader moves 25 a class to its val/ folder (it takes
    them in file-system order, which no seed reproduces; this draw is the same everywhere).
    """
    rng = np.random.default_rng(seed)
    validation = []
    for label in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == label))
        validation.append(members[: len(members) // 2])
    chosen = np.zeros(len(labels), bool)
    chosen[np.concatenate(validation) if validation else []] = True
    return np.flatnonzero(chosen), np.flatnonzero(~chosen)


def points(
    name: str,
    split: str,
    *,
    data_dir: str | None = None,
    download: bool = True,
    validation_from: str = "train",
) -> dict[str, Any]:
    """Which points an evaluation of `split` (as `load` gives it, evaluated in order) attacks,
    besides the split and `validation_from` that name it: "first_point", where in the split it
    starts (0: `load` keeps a split's first N), and where the split is half the test split
    (validation_from="test"), "held_out_seed", the seed that halved it, and "held_out_sha256",
    the first 16 hex digits of the SHA-256 of that half's indices in the test split (ascending,
    as little-endian int64), so that two evaluations can be told to be on the same points
    whatever the generator drew."""
    described: dict[str, Any] = {"first_point": 0}
    if validation_from == "test" and split in ("validation", "test"):
        entry = registry.lookup(name)
        _, labels = _arrays(entry, sources.resolve(entry, data_dir, download), "test")
        validation, test = held_out(labels)
        half = validation if split == "validation" else test
        digest = hashlib.sha256(half.astype("<i8").tobytes()).hexdigest()
        described.update(held_out_seed=HELD_OUT_SEED, held_out_sha256=digest[:16])
    return described


def _held_out_arrays(
    entry: registry.Entry, source: sources.Source, split: str, max_examples: int | None
) -> tuple[np.ndarray, np.ndarray]:
    if split in ("train", "train_full"):
        images, labels = _arrays(entry, source, "train")
    else:
        images, labels = _arrays(entry, source, "test")
        validation, test = held_out(labels)
        keep = validation if split == "validation" else test
        images, labels = images[keep], labels[keep]
    if max_examples is not None:
        images, labels = images[:max_examples], labels[:max_examples]
    return images, labels


# A part's arrays, decoded once per process (sources.decoded), so that "train" and "validation"
# in one process decode the files once, and train.py's early check decodes them for the run.
def _arrays(
    entry: registry.Entry, source: sources.Source, part: str
) -> tuple[np.ndarray, np.ndarray]:
    if source.local_files is not None:
        return sources.local_arrays(entry, source.local_files, part)
    tfds_split = entry.tfds_test_split if part == "test" else "train"
    if not source.tfds.cache_decoded:
        return source.tfds.read_arrays(source.builder, tfds_split)
    key = ("tfds", entry.tfds_name, source.tfds.prepared_path(source.builder), part)
    return sources.decoded(key, lambda: source.tfds.read_arrays(source.builder, tfds_split))


def _check_batchable(name: str, split: str, count: int, options: dict) -> None:
    if count == 0:
        raise ValueError(f"split {split!r} of {name!r} is empty")
    if options["drop_remainder"] and count < options["batch_size"]:
        raise ValueError(
            f"split {split!r} of {name!r} has {count} examples, fewer than batch_size "
            f"{options['batch_size']}: with drop_remainder=True it would yield no batch"
        )


def _load_streamed(
    entry: registry.Entry,
    source: sources.Source,
    split: str,
    max_examples: int | None,
    augment: bool,
    options: dict,
) -> tf.data.Dataset:
    tfds_split = entry.tfds_test_split if split == "test" else "train"
    count = source.tfds.num_examples(source.builder, tfds_split)
    batches_per_pass = None
    if count is None:
        # A builder that knows no split sizes (and ignores slices, as TFDS's mock does): cut
        # by percentages and let its examples stand in.
        split_spec = {"train": "train[:90%]", "validation": "train[90%:]"}.get(split, tfds_split)
    else:
        start, stop = split_range(count, split, max_examples)
        _check_batchable(entry.info.name, split, stop - start, options)
        split_spec = f"{tfds_split}[{start}:{stop}]"
        batch_size = options["batch_size"]
        batches_per_pass = (stop - start) // batch_size
        if not options["drop_remainder"]:
            batches_per_pass = -(-(stop - start) // batch_size)
    examples = source.tfds.read_encoded(
        source.builder, split_spec, shuffle_files=options["shuffle"], seed=options["seed"]
    )
    if max_examples is not None:
        examples = examples.take(max_examples)  # a no-op unless the builder ignored the slice
    return pipeline.from_encoded(
        examples,
        train_view=augment_lib.imagenet_train_crop,
        eval_view=augment_lib.imagenet_eval_crop,
        augment=augment,
        batches_per_pass=batches_per_pass,
        **options,
    )
