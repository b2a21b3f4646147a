"""Tests for the dataset package `fbat_tf.data`.

    python -m pytest tests/test_data.py -q

What it is checked against:

- real Fashion-MNIST (Debian's dataset-fashion-mnist) decoded here with gzip + numpy: split
  sizes, the 90/10 cut in file order, `max_examples`, and the published mean/std;
- fake CIFAR-10/100 folders and tarballs written here in the documented pickle format
  (pixels laid out plane by plane from HWC images), both as Python 3 pickles them and byte for
  byte as Python 2 pickled the official files, and a fake Tiny-ImageNet folder of JPEGs;
- files from elsewhere: a CIFAR batch whose unpickling would run a command is refused before the
  command runs, and tarball members named `../x` or `/x` are never written anywhere;
- TFDS mocked with `tfds.testing.mock_data` (cifar10, cifar100, svhn_cropped, imagenet2012) and
  read through an injected TFDS source (`data.use_tfds_source`), compared with the mock's own
  examples read straight from the builder; the download and prepared-data branches with TFDS's
  offline DummyMnist builder;
- augmentations against brute force (each crop is a window of the zero-padded image, possibly
  mirrored) and closed forms (a 90° rotation is np.rot90, the center pixel is fixed);
- error messages for missing data, unknown names and splits.

No test touches the network: an autouse fixture makes every socket connection fail.
"""

from __future__ import annotations

import collections
import gzip
import io
import math
import os
import pickle
import pickletools
import re
import shlex
import shutil
import socket
import struct
import subprocess
import sys
import tarfile

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

from fbat_tf import data
from fbat_tf.data import augment, local, tfds_source
from tests.commands import NO_TENSORFLOW, python_command
from tests.mock_tfds.mocked_tfds import mock_tfds

FASHION_DIR = "/usr/share/datasets/fashion-mnist"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_CREATE_CONNECTION = socket.create_connection  # before no_network puts a refusal in its place


@pytest.fixture(autouse=True)
def no_network(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a data test tried to use the network")

    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    monkeypatch.setattr(socket.socket, "connect", refuse)


def collect(ds: tf.data.Dataset) -> tuple[np.ndarray, np.ndarray]:
    batches = list(ds.as_numpy_iterator())
    return np.concatenate([b[0] for b in batches]), np.concatenate([b[1] for b in batches])


def in_order(name: str, split: str, **kwargs) -> tf.data.Dataset:
    """An unshuffled, unaugmented, complete pass over a split."""
    return data.load(
        name, split, shuffle=False, augment=False, drop_remainder=False, download=False, **kwargs
    )


# ------------------------------------------------------------------------------- registry


def test_names_and_info():
    assert data.names() == [
        "cifar10",
        "cifar100",
        "svhn",
        "tiny_imagenet",
        "imagenet",
        "mnist",
        "fashion_mnist",
    ]
    for name in data.names():
        meta = data.info(name)
        assert meta.name == name
        assert len(meta.mean) == len(meta.std) == meta.image_shape[2]
    assert data.info("cifar100").num_classes == 100
    assert data.info("tiny_imagenet").image_shape == (64, 64, 3)
    assert data.info("imagenet").image_shape == (224, 224, 3)
    assert data.info("svhn").train_examples == 73_257


def test_unknown_name_and_split_raise_value_error():
    with pytest.raises(ValueError, match="'cifar11'") as err:
        data.info("cifar11")
    assert "cifar10" in str(err.value)  # lists the valid names
    with pytest.raises(ValueError, match="'cifar11'"):
        data.check_available("cifar11")
    with pytest.raises(ValueError, match="'cifar11'"):
        data.load("cifar11", "train")
    with pytest.raises(ValueError, match="'valid'") as err:
        data.load("fashion_mnist", "valid")
    assert "validation" in str(err.value)
    with pytest.raises(ValueError, match="batch_size"):
        data.load("fashion_mnist", "test", batch_size=0)
    with pytest.raises(ValueError, match="max_examples"):
        data.load("fashion_mnist", "test", max_examples=0)


# --------------------------------------------------------------------- real Fashion-MNIST


def read_idx_gz(path: str, header_bytes: int) -> np.ndarray:
    with gzip.open(path, "rb") as f:
        return np.frombuffer(f.read(), np.uint8, offset=header_bytes)


# The module's fixtures are built once for all its tests: pytest-xdist runs them on one worker
# (--dist loadgroup, pyproject.toml).
pytestmark = pytest.mark.xdist_group("data")


@pytest.fixture(scope="module")
def fashion():
    """The Debian Fashion-MNIST files decoded here: 16-byte image headers, 8-byte label headers."""
    if not os.path.isdir(FASHION_DIR):
        pytest.skip(f"{FASHION_DIR} missing: install the Debian package dataset-fashion-mnist")

    def images(stem):
        return read_idx_gz(os.path.join(FASHION_DIR, stem), 16).reshape(-1, 28, 28, 1)

    def labels(stem):
        return read_idx_gz(os.path.join(FASHION_DIR, stem), 8).astype(np.int32)

    return {
        "train": (images("train-images-idx3-ubyte.gz"), labels("train-labels-idx1-ubyte.gz")),
        "test": (images("t10k-images-idx3-ubyte.gz"), labels("t10k-labels-idx1-ubyte.gz")),
    }


def test_fashion_mnist_source_is_the_debian_files(fashion):
    assert data.check_available("fashion_mnist", download=False) == (
        f"local IDX files in {FASHION_DIR}"
    )


def test_local_files_and_data_not_there_are_told_without_tensorflow(fashion, tmp_path):
    """The package, its facts and `check_available` on local files load no TensorFlow (sweep.py
    checks a definition's data so). A dataset with nothing of it on disk and no download
    possible is told so without TensorFlow too (it took 22 s where TFDS was asked first);
    `needs_tensorflow` says TFDS, and so TensorFlow, is asked only where TFDS's data dir holds
    something of it, or a download may work."""
    prepared = tmp_path / "prepared"
    (prepared / "cifar10" / "3.0.2").mkdir(parents=True)
    empty = str(tmp_path / "empty")
    code = (
        f"import sys\n{NO_TENSORFLOW}\n"
        "from fbat_tf import data\n"
        f"print(data.check_available('fashion_mnist', {FASHION_DIR!r}, download=False))\n"
        f"print(data.needs_tensorflow('fashion_mnist', {FASHION_DIR!r}))\n"
        f"print(data.needs_tensorflow('cifar10', {str(prepared)!r}, download=False))\n"
        f"print(data.needs_tensorflow('cifar10', {empty!r}, download=False))\n"
        f"print(data.needs_tensorflow('imagenet', {empty!r}))\n"
        f"print(data.needs_tensorflow('tiny_imagenet', {empty!r}))\n"
        "for name in ('cifar10', 'imagenet'):\n"
        "    try:\n"
        f"        data.check_available(name, {empty!r}, download=name == 'imagenet')\n"
        "    except data.DatasetNotFoundError as error:\n"
        "        print([line for line in str(error).splitlines() if line[:2] == '  '][-2:])\n"
        "print(data.info('cifar10').num_classes, len(data.names()))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    manual = os.path.join(empty, "downloads", "manual")
    assert done.stdout.splitlines() == [
        f"local IDX files in {FASHION_DIR}",
        "False",
        "True",  # something there: TFDS tells whether it is prepared
        "False",  # nothing there, no download
        "False",  # ImageNet: nothing there and no archives fetched by hand
        "False",  # local only: not found without asking TFDS
        str(
            [
                f"  Looked for prepared TFDS data (cifar10) in: {os.path.join(empty, 'cifar10')}",
                "  Downloading is disabled (download=False).",
            ]
        ),
        str(
            [
                "  Looked for prepared TFDS data (imagenet2012) in: "
                + os.path.join(empty, "imagenet2012"),
                "  TFDS cannot download imagenet2012: its archives must be fetched by hand into "
                f"{manual} (see below).",
            ]
        ),
        "10 7",
    ]


def test_the_online_probe_answers_within_its_timeout_while_the_name_lookup_hangs(monkeypatch):
    """`socket.create_connection`'s timeout leaves the name lookup unbounded: a name server
    that drops the query held the missing-dataset message for 22 s. The probe answers False
    (offline) while the lookup is still held."""
    import socket
    import threading

    from fbat_tf.data import online

    for name in online.PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(online, "_answer", None)
    released, answered = threading.Event(), []

    def held_lookup(*args, **kwargs):
        released.wait(30)  # a name server that never answers, until the test lets it go
        answered.append(True)
        raise socket.gaierror("no answer")

    # socket's own create_connection, which looks the name up with socket.getaddrinfo.
    monkeypatch.setattr(socket, "create_connection", _CREATE_CONNECTION)
    monkeypatch.setattr(socket, "getaddrinfo", held_lookup)
    try:
        assert online.reachable(timeout=0.2) is False
        assert not answered  # the probe answered while the lookup was still held
    finally:
        released.set()
    assert online.reachable(timeout=0.2) is False  # the first answer holds for the process


def test_each_augmentation_the_registry_names_is_a_function_of_augment():
    from fbat_tf.data import registry

    named = {name: registry.lookup(name).augmentation for name in data.names()}
    assert named["cifar10"] == "pad_crop_flip" and named["cifar100"] == "pad_crop_flip_rotate"
    for augmentation in filter(None, named.values()):
        assert callable(getattr(augment, augmentation)), augmentation


@pytest.mark.slow
def test_fashion_mnist_splits_match_independent_decoding(fashion):
    train_images, train_labels = fashion["train"]
    test_images, test_labels = fashion["test"]
    assert len(train_labels) == 60_000 and len(test_labels) == 10_000
    expected = {
        "train": (train_images[:54_000], train_labels[:54_000]),
        "validation": (train_images[54_000:], train_labels[54_000:]),  # last 10%, file order
        "train_full": (train_images, train_labels),
        "test": (test_images, test_labels),
    }
    for split, (images, labels) in expected.items():
        x, y = collect(in_order("fashion_mnist", split, batch_size=5000))
        assert x.dtype == np.float32 and y.dtype == np.int32
        assert x.shape == (len(labels), 28, 28, 1), split
        assert 0.0 <= x.min() and x.max() <= 1.0
        assert set(np.unique(y)) <= set(range(10))
        np.testing.assert_array_equal(x, images.astype(np.float32) / 255.0)
        np.testing.assert_array_equal(y, labels)


def test_fashion_mnist_max_examples_keeps_the_first_examples_of_the_split(fashion):
    train_images, train_labels = fashion["train"]
    x, y = collect(in_order("fashion_mnist", "validation", batch_size=7, max_examples=10))
    np.testing.assert_array_equal(x, train_images[54_000:54_010] / np.float32(255))
    np.testing.assert_array_equal(y, train_labels[54_000:54_010])
    x, y = collect(in_order("fashion_mnist", "test", batch_size=64, max_examples=100))
    np.testing.assert_array_equal(y, fashion["test"][1][:100])


@pytest.mark.slow
def test_fashion_mnist_training_defaults_shuffle_and_drop_the_remainder(fashion):
    train_images, train_labels = fashion["train"]
    ds = data.load("fashion_mnist", "train", batch_size=1000, seed=1, download=False)
    assert ds.cardinality().numpy() == 54
    x, y = collect(ds)
    assert x.shape == (54_000, 28, 28, 1)
    assert not np.array_equal(y, train_labels[:54_000])  # shuffled
    # The same examples, each once: compare per-example fingerprints as multisets.
    fingerprint = (x.reshape(54_000, -1) * 255).round().astype(np.int64) @ np.arange(1, 785)
    expected = train_images[:54_000].reshape(54_000, -1).astype(np.int64) @ np.arange(1, 785)
    np.testing.assert_array_equal(np.sort(fingerprint), np.sort(expected))
    ds = data.load("fashion_mnist", "train", batch_size=1024, max_examples=3000, download=False)
    assert ds.cardinality().numpy() == 2  # 3000 // 1024: the partial batch is dropped


@pytest.mark.slow
def test_fashion_mnist_mean_and_std_match_the_registry(fashion):
    pixels = fashion["train"][0].astype(np.float64) / 255.0
    meta = data.info("fashion_mnist")
    assert meta.train_examples == len(pixels)
    np.testing.assert_allclose(pixels.mean(), meta.mean[0], atol=1e-3)
    np.testing.assert_allclose(pixels.std(), meta.std[0], atol=1e-3)


# ------------------------------------------------------------------------------ local CIFAR


def cifar_rows(images: np.ndarray) -> np.ndarray:
    """The CIFAR row layout written out by hand: all red pixels row by row, then green, blue."""
    return np.stack(
        [np.concatenate([img[:, :, c].ravel() for c in range(3)]) for img in images]
    ).astype(np.uint8)


def write_pickle(path: str, batch: dict) -> None:
    with open(path, "wb") as f:
        pickle.dump(batch, f, protocol=2)


def python2_pickle(value) -> bytes:
    """`value` pickled the way Python 2's cPickle wrote the official CIFAR batches (protocol 2,
    without memo entries): bytes as Python 2 str, with no global, and numpy arrays through
    numpy.core.multiarray._reconstruct, numpy.ndarray and numpy.dtype, the only globals of the
    official files. Takes dicts, lists, bytes, small non-negative ints and numpy arrays."""
    if isinstance(value, dict):
        items = b"".join(python2_pickle(k) + python2_pickle(v) for k, v in value.items())
        return b"}(" + items + b"u"
    if isinstance(value, list):
        return b"](" + b"".join(python2_pickle(item) for item in value) + b"e"
    if isinstance(value, bytes):
        if len(value) < 256:
            return b"U" + bytes([len(value)]) + value
        return b"T" + struct.pack("<I", len(value)) + value
    if isinstance(value, int):
        return b"K" + bytes([value]) if value < 256 else b"M" + struct.pack("<H", value)
    value = np.ascontiguousarray(value)
    # numpy.dtype(code, 0, 1) with the state (3, byte order, None, None, None, -1, -1, 0).
    order, code = value.dtype.str[0].encode(), value.dtype.str[1:].encode()
    dtype = b"cnumpy\ndtype\n" + python2_pickle(code) + b"K\x00K\x01\x87R"
    dtype += b"(K\x03U\x01" + order + b"NNNJ\xff\xff\xff\xffJ\xff\xff\xff\xffK\x00tb"
    # _reconstruct(ndarray, (0,), "b") with the state (1, shape, dtype, False, raw bytes).
    shape = b"(" + b"".join(python2_pickle(int(n)) for n in value.shape) + b"t"
    return (
        b"cnumpy.core.multiarray\n_reconstruct\ncnumpy\nndarray\nK\x00\x85U\x01b\x87R"
        + b"(K\x01"
        + shape
        + dtype
        + b"\x89"
        + python2_pickle(value.tobytes())
        + b"tb"
    )


def write_python2_pickle(path: str, batch: dict) -> None:
    with open(path, "wb") as f:
        f.write(b"\x80\x02" + python2_pickle(batch) + b".")


def test_python2_pickles_name_only_the_globals_of_the_official_batches():
    rows = np.arange(6, dtype=np.uint8).reshape(2, 3)
    written = b"\x80\x02" + python2_pickle({b"data": rows, b"labels": [1, 300]}) + b"."
    named = [arg for op, arg, _ in pickletools.genops(written) if op.name == "GLOBAL"]
    assert named == ["numpy.core.multiarray _reconstruct", "numpy ndarray", "numpy dtype"]
    loaded = pickle.loads(written, encoding="bytes")
    np.testing.assert_array_equal(loaded[b"data"], rows)
    assert loaded[b"labels"] == [1, 300]


def make_cifar10(
    root: str, per_batch: int = 4, seed: int = 0, write=write_pickle
) -> tuple[np.ndarray, ...]:
    """A fake `cifar-10-batches-py/` (5 train batches, 1 test batch) written by `write`;
    returns the truth."""
    rng = np.random.default_rng(seed)
    folder = os.path.join(root, "cifar-10-batches-py")
    os.makedirs(folder)
    train_images = rng.integers(0, 256, (5 * per_batch, 32, 32, 3), dtype=np.uint8)
    train_labels = rng.integers(0, 10, 5 * per_batch).astype(np.int32)
    test_images = rng.integers(0, 256, (per_batch, 32, 32, 3), dtype=np.uint8)
    test_labels = rng.integers(0, 10, per_batch).astype(np.int32)
    for i in range(5):
        part = slice(i * per_batch, (i + 1) * per_batch)
        write(
            os.path.join(folder, f"data_batch_{i + 1}"),
            {
                b"batch_label": f"training batch {i + 1} of 5".encode(),
                b"labels": train_labels[part].tolist(),
                b"data": cifar_rows(train_images[part]),
                b"filenames": [b"x.png"] * per_batch,
            },
        )
    write(
        os.path.join(folder, "test_batch"),
        {b"labels": test_labels.tolist(), b"data": cifar_rows(test_images)},
    )
    return train_images, train_labels, test_images, test_labels


def make_tarball(source_root: str, folder: str, tarball_path: str) -> None:
    with tarfile.open(tarball_path, "w:gz") as tar:
        tar.add(os.path.join(source_root, folder), arcname=folder)


# Both spellings of the documented format: Python 3's pickle, and Python 2's as in the official
# files (str keys and numpy 1.x module names).
WRITERS = pytest.mark.parametrize("write", [write_pickle, write_python2_pickle])


@WRITERS
def test_local_cifar10_folder_and_tarball(tmp_path, write):
    folder_root, tar_root = str(tmp_path / "folder"), str(tmp_path / "tar")
    os.makedirs(tar_root)
    train_images, train_labels, test_images, test_labels = make_cifar10(folder_root, write=write)
    make_tarball(
        folder_root, "cifar-10-batches-py", os.path.join(tar_root, "cifar-10-python.tar.gz")
    )
    assert "CIFAR python folder" in data.check_available("cifar10", folder_root, download=False)
    assert "CIFAR python tarball" in data.check_available("cifar10", tar_root, download=False)
    for root in (folder_root, tar_root):
        x, y = collect(in_order("cifar10", "train", data_dir=root, batch_size=8))
        np.testing.assert_array_equal(x, train_images[:18] / np.float32(255))  # 20 - 20 // 10
        np.testing.assert_array_equal(y, train_labels[:18])
        x, y = collect(in_order("cifar10", "validation", data_dir=root, batch_size=8))
        np.testing.assert_array_equal(x, train_images[18:] / np.float32(255))
        np.testing.assert_array_equal(y, train_labels[18:])
        x, y = collect(in_order("cifar10", "test", data_dir=root, batch_size=8))
        np.testing.assert_array_equal(x, test_images / np.float32(255))
        np.testing.assert_array_equal(y, test_labels)


@pytest.mark.slow
@WRITERS
def test_local_cifar100_uses_fine_labels(tmp_path, write):
    rng = np.random.default_rng(1)
    folder = tmp_path / "cifar-100-python"
    folder.mkdir()
    truth = {}
    for part, count in (("train", 10), ("test", 5)):
        images = rng.integers(0, 256, (count, 32, 32, 3), dtype=np.uint8)
        fine = rng.integers(20, 100, count)  # never a coarse label (< 20)
        coarse = rng.integers(0, 20, count)
        write(
            str(folder / part),
            {b"data": cifar_rows(images), b"fine_labels": fine.tolist(), b"coarse_labels": coarse},
        )
        truth[part] = (images, fine)
    tar_root = tmp_path / "tar"
    tar_root.mkdir()
    make_tarball(str(tmp_path), "cifar-100-python", str(tar_root / "cifar-100-python.tar.gz"))
    for root in (tmp_path, tar_root):
        x, y = collect(in_order("cifar100", "train_full", data_dir=str(root), batch_size=4))
        np.testing.assert_array_equal(x, truth["train"][0] / np.float32(255))
        np.testing.assert_array_equal(y, truth["train"][1])
        x, y = collect(in_order("cifar100", "test", data_dir=str(root), batch_size=4))
        np.testing.assert_array_equal(y, truth["test"][1])
        # The training default augments (crop, flip, rotation); shapes and range stay.
        x, y = collect(data.load("cifar100", "train", data_dir=str(root), batch_size=3))
        assert x.shape == (9, 32, 32, 3) and x.dtype == np.float32
        assert 0.0 <= x.min() and x.max() <= 1.0


class RunsACommand:
    """Unpickling it runs a shell command that creates `marker`."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {shlex.quote(self.marker)}",)


@pytest.mark.parametrize("layout", ["folder", "tarball"])
def test_a_cifar_batch_that_would_run_a_command_is_refused(tmp_path, layout):
    marker = tmp_path / "marker"
    folder_root = tmp_path / "folder"
    _, train_labels, _, _ = make_cifar10(str(folder_root))
    batch = folder_root / "cifar-10-batches-py" / "data_batch_3"
    write_pickle(
        str(batch), {b"labels": train_labels[:4].tolist(), b"data": RunsACommand(str(marker))}
    )
    if layout == "folder":
        root, named = folder_root, str(batch)
    else:
        root = tmp_path / "tar"
        root.mkdir()
        tarball = root / "cifar-10-python.tar.gz"
        make_tarball(str(folder_root), "cifar-10-batches-py", str(tarball))
        named = f"{tarball} (member cifar-10-batches-py/data_batch_3)"
    with pytest.raises(pickle.UnpicklingError) as refused:
        data.load("cifar10", "train", data_dir=str(root), download=False)
    message = str(refused.value)
    assert message.startswith(f"refusing to load {named}: ")
    assert f"the Python global {os.system.__module__}.system" in message
    assert not marker.exists()
    # The file does what it says: a plain pickle.load runs the command.
    with open(batch, "rb") as f:
        pickle.load(f, encoding="bytes")
    assert marker.exists()


@pytest.mark.parametrize(
    "payload, named",
    [
        (b"cbuiltins\neval\n(V1 + 1\ntR.", "the Python global builtins.eval"),
        (
            b"ccopyreg\n_reconstructor\n(c__main__\nX\ncbuiltins\nobject\nNtR.",
            "the Python global copyreg._reconstructor",
        ),
        (b"c_codecs\nencode\n(Vx\nVrot13\ntR.", "the codec 'rot13'"),
    ],
)
def test_a_cifar_batch_is_unpickled_with_numpy_and_bytes_only(payload, named):
    with pytest.raises(pickle.UnpicklingError, match="refusing to load batch.bin: ") as refused:
        local.load_cifar_batch(io.BytesIO(payload), "batch.bin")
    assert named in str(refused.value)


def test_tarball_members_are_read_never_written(tmp_path, monkeypatch):
    # Extra members named to land outside whatever folder they were extracted into.
    make_cifar10(str(tmp_path / "source"))
    data_dir, cwd = tmp_path / "deep" / "data", tmp_path / "deep" / "cwd"
    data_dir.mkdir(parents=True)
    cwd.mkdir()
    absolute = tmp_path / "absolute-escape"
    names = ["../escape", "cifar-10-batches-py/../../escape", str(absolute)]
    with tarfile.open(data_dir / "cifar-10-python.tar.gz", "w:gz") as tar:
        tar.add(tmp_path / "source" / "cifar-10-batches-py", arcname="cifar-10-batches-py")
        for name in names:
            member = tarfile.TarInfo(name)
            member.size = 7
            tar.addfile(member, io.BytesIO(b"escaped"))
    with tarfile.open(data_dir / "cifar-10-python.tar.gz") as tar:
        assert set(names) <= set(tar.getnames())
    monkeypatch.chdir(cwd)
    before = sorted(tmp_path.rglob("*"))
    x, _ = collect(in_order("cifar10", "train", data_dir=str(data_dir), batch_size=8))
    assert len(x) == 18
    assert sorted(tmp_path.rglob("*")) == before
    assert not absolute.exists()
    assert not os.path.exists(os.path.join(os.path.dirname(tmp_path), "escape"))


# ---------------------------------------------------------------------- local Tiny-ImageNet


def write_jpeg(path: str, image: np.ndarray) -> bytes:
    encoded = tf.io.encode_jpeg(image, quality=95).numpy()
    with open(path, "wb") as f:
        f.write(encoded)
    return encoded


def test_local_tiny_imagenet_layout(tmp_path):
    rng = np.random.default_rng(2)
    root = tmp_path / "tiny-imagenet-200"
    wnids = ["n02000002", "n01000001", "n03000003"]  # not sorted on purpose
    (root / "val" / "images").mkdir(parents=True)
    (root / "wnids.txt").write_text("\n".join(wnids) + "\n")
    decoded = {}
    for wnid in wnids:
        images_dir = root / "train" / wnid / "images"
        images_dir.mkdir(parents=True)
        for i in range(11):  # 0..10, so "_10" must sort after "_9"
            path = str(images_dir / f"{wnid}_{i}.JPEG")
            image = rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)
            decoded[(wnid, i)] = tf.io.decode_jpeg(write_jpeg(path, image)).numpy()
    val_lines, val_truth = [], []
    for i, wnid in enumerate(["n03000003", "n01000001", "n03000003", "n02000002"]):
        image = rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)
        encoded = write_jpeg(str(root / "val" / "images" / f"val_{i}.JPEG"), image)
        val_lines.append(f"val_{i}.JPEG\t{wnid}\t0\t0\t63\t63")
        val_truth.append((tf.io.decode_jpeg(encoded).numpy(), sorted(wnids).index(wnid)))
    (root / "val" / "val_annotations.txt").write_text("\n".join(val_lines) + "\n")

    assert "Tiny-ImageNet" in data.check_available("tiny_imagenet", str(tmp_path), download=False)
    # Documented order: image i of every class (classes sorted by wnid), for i = 0, 1, ...
    order = [(wnid, i) for i in range(11) for wnid in sorted(wnids)]
    x, y = collect(in_order("tiny_imagenet", "train_full", data_dir=str(tmp_path), batch_size=8))
    np.testing.assert_array_equal(x, np.stack([decoded[k] for k in order]) / np.float32(255))
    np.testing.assert_array_equal(y, [sorted(wnids).index(w) for w, _ in order])
    # 33 - 33 // 10 = 30: validation is the last image of every class, one per class.
    x, y = collect(in_order("tiny_imagenet", "validation", data_dir=str(tmp_path), batch_size=8))
    np.testing.assert_array_equal(y, [0, 1, 2])
    np.testing.assert_array_equal(x[0], decoded[("n01000001", 10)] / np.float32(255))
    x, y = collect(in_order("tiny_imagenet", "test", data_dir=str(tmp_path), batch_size=8))
    np.testing.assert_array_equal(x, np.stack([v[0] for v in val_truth]) / np.float32(255))
    np.testing.assert_array_equal(y, [v[1] for v in val_truth])
    x, _ = collect(data.load("tiny_imagenet", "train", data_dir=str(tmp_path), batch_size=10))
    assert x.shape == (30, 64, 64, 3) and 0.0 <= x.min() and x.max() <= 1.0


def tiny_imagenet_folder(
    root, rng, per_class_val: int, classes: int = 3, per_class_train: int = 5
) -> list[tuple[str, str]]:
    """A small tiny-imagenet-200/ as downloaded: `classes` classes (wnids not in sorted order),
    `per_class_train` train images and `per_class_val` val images a class (annotations in mixed
    class order), an unlabelled test/images/. Returns the annotations (file, wnid)."""
    wnids = ["n02000002", "n01000001", "n03000003"][:classes]
    (root / "val" / "images").mkdir(parents=True)
    (root / "test" / "images").mkdir(parents=True)
    write_jpeg(str(root / "test" / "images" / "test_0.JPEG"), np.zeros((64, 64, 3), np.uint8))
    (root / "wnids.txt").write_text("\n".join(wnids) + "\n")
    for wnid in wnids:
        (root / "train" / wnid / "images").mkdir(parents=True)
        for i in range(per_class_train):
            image = rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)
            write_jpeg(str(root / "train" / wnid / "images" / f"{wnid}_{i}.JPEG"), image)
    count = classes * per_class_val
    annotations = [(f"val_{i}.JPEG", wnids[(i * 7) % classes]) for i in range(count)]
    for name, _ in annotations:
        image = rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)
        write_jpeg(str(root / "val" / "images" / name), image)
    lines = [f"{name}\t{wnid}\t0\t0\t63\t63" for name, wnid in annotations]
    (root / "val" / "val_annotations.txt").write_text("\n".join(lines) + "\n")
    return annotations


def prepare_as_released_loader(root, annotations, per_class: int) -> None:
    """What the paper's released loader does to a downloaded folder: test/ becomes
    test_original/; the val images move, in file-system order, to val/<wnid>/images/ until a
    class has `per_class` there (25 in the release), the rest to test/<wnid>/images/;
    val/images/ is removed and val_annotations.txt stays."""
    if (root / "test").exists():
        os.rename(root / "test", root / "test_original")
    wnid_of = dict(annotations)
    kept = collections.Counter()
    for name in os.listdir(root / "val" / "images"):
        wnid = wnid_of[name]
        part = "val" if kept[wnid] < per_class else "test"
        kept[wnid] += part == "val"
        (root / part / wnid / "images").mkdir(parents=True, exist_ok=True)
        os.rename(root / "val" / "images" / name, root / part / wnid / "images" / name)
    os.rmdir(root / "val" / "images")


def test_tiny_imagenet_held_out_split_is_the_same_in_both_layouts(tmp_path):
    rng = np.random.default_rng(4)
    downloaded, prepared = (
        tmp_path / "a" / "tiny-imagenet-200",
        tmp_path / "b" / "tiny-imagenet-200",
    )
    annotations = tiny_imagenet_folder(downloaded, rng, per_class_val=4)
    shutil.copytree(downloaded, prepared)
    prepare_as_released_loader(prepared, annotations, per_class=2)
    assert not (prepared / "val" / "images").exists()
    assert len(list((prepared / "test").rglob("*.JPEG"))) == 6

    def split(folder, name, validation_from):
        return collect(
            in_order(
                "tiny_imagenet",
                name,
                data_dir=str(folder.parent),
                batch_size=4,
                validation_from=validation_from,
            )
        )

    val_x, val_y = split(downloaded, "test", "train")  # all 12 val images, annotation order
    wnids = sorted({wnid for _, wnid in annotations})
    labels = [wnids.index(wnid) for _, wnid in annotations]
    np.testing.assert_array_equal(val_y, labels)
    for folder in (downloaded, prepared):
        x, y = split(folder, "test", "train")
        np.testing.assert_array_equal(x, val_x)
        # Trained on all 15 training images, none held out for validation.
        assert len(split(folder, "train", "test")[1]) == 15
        sel_x, sel_y = split(folder, "validation", "test")
        test_x, test_y = split(folder, "test", "test")
        # Half of every class each, together every val image once, each half in file order.
        assert np.bincount(sel_y).tolist() == [2, 2, 2]
        assert np.bincount(test_y).tolist() == [2, 2, 2]
        rows = {img.tobytes(): i for i, img in enumerate(val_x)}
        sel_rows = [rows[img.tobytes()] for img in sel_x]
        test_rows = [rows[img.tobytes()] for img in test_x]
        assert sorted(sel_rows + test_rows) == list(range(12))
        assert sel_rows == sorted(sel_rows) and test_rows == sorted(test_rows)
        np.testing.assert_array_equal(sel_y, val_y[sel_rows])
        if folder is downloaded:
            first = (sel_rows, test_rows)
        else:  # the seed decides, not the folder the released loader left
            assert (sel_rows, test_rows) == first
    # The draw is pinned: a change of seed or procedure changes every kit's test set.
    assert first[0] == [0, 5, 7, 8, 9, 10]
    validation, test = data.held_out(np.asarray(labels))
    assert validation.tolist() == first[0] and test.tolist() == first[1]


def test_held_out_halves_each_class_by_its_seed():
    labels = np.repeat(np.arange(200), 50)[np.random.default_rng(0).permutation(10_000)]
    validation, test = data.held_out(labels)
    assert len(validation) == len(test) == 5000
    assert np.bincount(labels[validation], minlength=200).tolist() == [25] * 200
    assert not set(validation.tolist()) & set(test.tolist())
    again, _ = data.held_out(labels)
    other, _ = data.held_out(labels, seed=data.HELD_OUT_SEED + 1)
    np.testing.assert_array_equal(validation, again)
    assert not np.array_equal(validation, other)
    # An odd class gives its extra example to the test half.
    validation, test = data.held_out(np.asarray([0, 0, 0, 1]))
    assert len(validation) == 1 and len(test) == 3


def test_validation_from_test_is_refused_for_a_streamed_dataset():
    with pytest.raises(ValueError, match="imagenet is streamed"):
        data.load("imagenet", "validation", validation_from="test", download=False)
    with pytest.raises(ValueError, match="validation_from must be one of"):
        data.load("cifar10", "validation", validation_from="val")


# -------------------------------------------------------------------------- TFDS (mocked)


@pytest.fixture
def mocked_tfds():
    with mock_tfds(num_examples=20):
        yield


@pytest.mark.slow
@pytest.mark.parametrize(
    "name,tfds_name,classes",
    [("cifar10", "cifar10", 10), ("cifar100", "cifar100", 100), ("svhn", "svhn_cropped", 10)],
)
def test_mocked_tfds_small_datasets(mocked_tfds, tmp_path, name, tfds_name, classes):
    data_dir = str(tmp_path)  # empty, so no local files: TFDS is the source
    assert "mock_data" in data.check_available(name, data_dir, download=False)
    ds = data.load(name, "train", data_dir=data_dir, batch_size=4, download=False)
    assert ds.cardinality().numpy() == 4  # 18 training examples, partial batch dropped
    x, y = collect(ds)
    assert x.shape == (16, 32, 32, 3) and x.dtype == np.float32 and y.dtype == np.int32
    assert 0.0 <= x.min() and x.max() <= 1.0
    assert 0 <= y.min() and y.max() < classes
    # In-order splits are the builder's own examples, in its order.
    examples = list(
        tfds.builder(tfds_name).as_dataset(split="test", shuffle_files=False).as_numpy_iterator()
    )
    x, y = collect(in_order(name, "test", data_dir=data_dir, batch_size=6))
    np.testing.assert_array_equal(x, np.stack([e["image"] for e in examples]) / np.float32(255))
    np.testing.assert_array_equal(y, [e["label"] for e in examples])
    x, _ = collect(in_order(name, "validation", data_dir=data_dir, batch_size=6))
    assert len(x) == 2


@pytest.mark.slow
def test_mocked_tfds_imagenet(mocked_tfds, tmp_path):
    data_dir = str(tmp_path)
    assert "mock_data" in data.check_available("imagenet", data_dir, download=False)
    train = data.load(
        "imagenet", "train", data_dir=data_dir, batch_size=2, max_examples=4, download=False
    )
    for x, y in train.take(2):
        assert x.shape == (2, 224, 224, 3) and x.dtype == tf.float32 and y.dtype == tf.int32
        assert 0.0 <= float(tf.reduce_min(x)) and float(tf.reduce_max(x)) <= 1.0
        assert 0 <= int(tf.reduce_min(y)) and int(tf.reduce_max(y)) < 1000
    # Evaluation view, recomputed by hand: shorter side to 256, then the central 224 window.
    x, y = collect(in_order("imagenet", "test", data_dir=data_dir, batch_size=2, max_examples=2))
    examples = tfds.builder("imagenet2012").as_dataset(
        split="validation", shuffle_files=False, decoders={"image": tfds.decode.SkipDecoding()}
    )
    for i, example in enumerate(examples.take(2).as_numpy_iterator()):
        image = tf.io.decode_jpeg(example["image"], channels=3)
        height, width = image.shape[:2]
        scale = 256 / min(height, width)
        size = [max(256, round(height * scale)), max(256, round(width * scale))]
        resized = tf.image.resize(image, size, antialias=True).numpy()
        top, left = (size[0] - 224) // 2, (size[1] - 224) // 2
        window = resized[top : top + 224, left : left + 224] / 255.0
        np.testing.assert_allclose(x[i], np.clip(window, 0, 1), atol=1e-6)
        assert y[i] == example["label"]


def test_encoded_stream_loads_and_keeps_its_order_under_any_global_seed(mocked_tfds, tmp_path):
    """ImageNet's training stream (encoded examples through a shuffle buffer) after
    keras.utils.set_random_seed(0), which every training run with the default --seed calls: it
    loads, and its order over two passes is the one under another global seed."""
    import keras

    def labels(global_seed: int) -> list[int]:
        keras.utils.set_random_seed(global_seed)
        train = data.load(
            "imagenet",
            "train",
            data_dir=str(tmp_path),
            batch_size=4,
            max_examples=8,
            repeat=True,
            augment=False,
            download=False,
        )
        return [int(label) for _, y in train.take(4) for label in y]

    at_zero = labels(0)
    assert sorted(at_zero[:8]) == sorted(at_zero[8:]) and at_zero[:8] != at_zero[8:]
    assert labels(7) == at_zero


# ----------------------------------------------------------- TFDS (prepared, downloaded)


class ConnectedSource(tfds_source.TFDSSource):
    """The TFDS source, told whether the machine is online (the tests never really are)."""

    def __init__(self, online: bool):
        self.online = online

    def internet_reachable(self, timeout: float = 3.0) -> bool:
        return self.online


class DummyMnistSource(ConnectedSource):
    """Online, and hands out TFDS's DummyMnist (20 train + 20 test 28x28x1 examples, one shard
    each) whatever the name."""

    def __init__(self):
        super().__init__(online=True)

    def builder(self, tfds_name: str, data_dir: str | None) -> tfds.core.DatasetBuilder:
        return tfds.testing.DummyMnist(data_dir=data_dir)


@pytest.fixture
def dummy_mnist_tfds():
    with data.use_tfds_source(DummyMnistSource()):
        yield


@pytest.mark.slow
def test_tfds_download_then_prepared_data(tmp_path, dummy_mnist_tfds):
    """The non-mocked TFDS branches, offline: TFDS's DummyMnist "downloads" by generating data.

    The TFDS source hands out DummyMnist whatever the name, so "mnist" and "imagenet" both
    read it.
    """
    data_dir = str(tmp_path)
    assert "to be downloaded" in data.check_available("mnist", data_dir, download=True)
    with pytest.raises(data.DatasetNotFoundError):
        data.load("mnist", "test", data_dir=data_dir, download=False)
    # download=True prepares it (no network: DummyMnist generates its examples).
    x, y = collect(
        data.load("mnist", "train_full", data_dir=data_dir, shuffle=False, drop_remainder=False)
    )
    description = data.check_available("mnist", data_dir, download=False)
    assert description == f"TFDS mnist in {data_dir}/dummy_mnist/3.0.1"
    builder = tfds.testing.DummyMnist(data_dir=data_dir)
    examples = list(builder.as_dataset(split="train", shuffle_files=False).as_numpy_iterator())
    np.testing.assert_array_equal(x, np.stack([e["image"] for e in examples]) / np.float32(255))
    np.testing.assert_array_equal(y, [e["label"] for e in examples])
    # The streamed reader slices the TFDS split: "validation" is train[18:20], in order.
    x, y = collect(in_order("imagenet", "validation", data_dir=data_dir, batch_size=4))
    assert x.shape == (2, 224, 224, 3)
    np.testing.assert_array_equal(y, [e["label"] for e in examples[18:]])
    ds = data.load("imagenet", "train", data_dir=data_dir, batch_size=4, max_examples=9)
    assert ds.cardinality().numpy() == 2  # train[0:9], partial batch dropped
    x, y = collect(ds)
    assert x.shape == (8, 224, 224, 3) and 0.0 <= x.min() and x.max() <= 1.0
    assert set(y) <= {e["label"] for e in examples[:9]}


# --------------------------------------------------------------------------- missing data


@pytest.mark.parametrize(
    "name", ["cifar10", "cifar100", "svhn", "tiny_imagenet", "imagenet", "mnist", "fashion_mnist"]
)
def test_missing_data_fails_fast_with_a_helpful_message(tmp_path, name):
    data_dir = str(tmp_path)
    with pytest.raises(data.DatasetNotFoundError) as err:
        data.check_available(name, data_dir, download=False)
    message = str(err.value)
    assert repr(name) in message and data_dir in message and "--data_dir" in message
    assert isinstance(err.value, FileNotFoundError)
    with pytest.raises(data.DatasetNotFoundError):
        data.load(name, "test", data_dir=data_dir, download=False)


def test_missing_tfds_data_is_said_once_without_tfds_warnings(tmp_path, caplog):
    # TFDS warns about the prepared-data folder it looks in even when that folder is not there;
    # the one message that the dataset is missing says where it looked.
    with caplog.at_level("WARNING"), pytest.raises(data.DatasetNotFoundError):
        data.check_available("cifar10", str(tmp_path), download=False)
    assert [record.getMessage() for record in caplog.records] == []


def test_missing_data_download_decision_without_network(tmp_path):
    data_dir = str(tmp_path)
    with data.use_tfds_source(ConnectedSource(online=False)):
        with pytest.raises(data.DatasetNotFoundError, match="internet"):
            data.check_available("cifar10", data_dir, download=True)
        # ImageNet cannot be downloaded by TFDS at all: the message says where the archives go.
        with pytest.raises(data.DatasetNotFoundError, match="ILSVRC2012_img_train.tar"):
            data.check_available("imagenet", data_dir, download=True)
    with data.use_tfds_source(ConnectedSource(online=True)):
        description = data.check_available("cifar10", data_dir, download=True)
    assert "downloaded" in description and data_dir in description
    assert os.listdir(data_dir) == []  # check_available only looks


# ---------------------------------------------------------------------------- augmentation


def random_images(shape, seed=0) -> tf.Tensor:
    return tf.constant(np.random.default_rng(seed).uniform(size=shape).astype(np.float32))


def test_crop_and_flip_output_is_a_window_of_the_padded_image():
    images = random_images((16, 32, 32, 3))
    out = augment.pad_crop_flip(images, tf.constant([3, 4])).numpy()
    assert out.shape == (16, 32, 32, 3) and out.dtype == np.float32
    padded = np.pad(images.numpy(), [(0, 0), (4, 4), (4, 4), (0, 0)])
    offsets, flips = set(), set()
    for i in range(16):
        matches = [
            (dy, dx, flip)
            for dy in range(9)
            for dx in range(9)
            for flip in (False, True)
            if np.array_equal(
                out[i],
                padded[i, dy : dy + 32, dx : dx + 32][:, ::-1]
                if flip
                else padded[i, dy : dy + 32, dx : dx + 32],
            )
        ]
        assert len(matches) == 1, i
        offsets.add(matches[0][:2])
        flips.add(matches[0][2])
    assert len(offsets) > 1 and flips == {False, True}  # the augmentation does change images


def test_augmentation_is_reproducible_from_the_seed():
    images = random_images((8, 32, 32, 3))
    for fn in (augment.pad_crop_flip, augment.pad_crop_flip_rotate):
        first = fn(images, tf.constant([1, 2])).numpy()
        np.testing.assert_array_equal(first, fn(images, tf.constant([1, 2])).numpy())
        assert not np.array_equal(first, fn(images, tf.constant([1, 3])).numpy())
        assert first.shape == images.shape and 0.0 <= first.min() and first.max() <= 1.0


def test_rotation_closed_forms():
    images = random_images((2, 8, 8, 3))
    quarter = augment.rotate(images, tf.constant([math.pi / 2, 0.0])).numpy()
    np.testing.assert_allclose(quarter[0], np.rot90(images[0].numpy(), 1), atol=1e-5)
    np.testing.assert_allclose(quarter[1], images[1].numpy(), atol=1e-6)
    # Any angle keeps the center pixel of an odd-sized image; ±15° stays within range.
    odd = random_images((4, 5, 5, 1), seed=1)
    rotated = augment.rotate(odd, tf.constant([0.1, -0.2, 0.26, 1.0])).numpy()
    np.testing.assert_allclose(rotated[:, 2, 2], odd.numpy()[:, 2, 2], atol=1e-6)


def test_imagenet_crops_on_a_coordinate_image():
    # Channel 0 holds the row index and channel 1 the column index, so a crop reveals its offset.
    rows, cols = np.meshgrid(np.arange(256), np.arange(256), indexing="ij")
    image = tf.constant(np.stack([rows, cols, np.full_like(rows, 7)], axis=-1).astype(np.uint8))
    center = augment.imagenet_eval_crop(image).numpy() * 255
    np.testing.assert_allclose(center[..., 0], rows[16:240, 16:240], atol=1e-3)
    np.testing.assert_allclose(center[..., 1], cols[16:240, 16:240], atol=1e-3)
    seen_flips = set()
    for s in range(6):
        crop = augment.imagenet_train_crop(image, tf.constant([s, 0])).numpy() * 255
        top, left = round(crop[0, 0, 0]), round(min(crop[0, 0, 1], crop[0, -1, 1]))
        flipped = crop[0, 0, 1] > crop[0, -1, 1]
        expected_cols = cols[top : top + 224, left : left + 224]
        np.testing.assert_allclose(
            crop[..., 0], rows[top : top + 224, left : left + 224], atol=1e-3
        )
        np.testing.assert_allclose(
            crop[..., 1], expected_cols[:, ::-1] if flipped else expected_cols, atol=1e-3
        )
        seen_flips.add(flipped)
    assert seen_flips == {False, True}


@pytest.mark.slow
def test_pipeline_augmentation_and_shuffle_follow_the_seed(tmp_path):
    make_cifar10(str(tmp_path), per_batch=8)  # 40 training images, 36 in "train"

    def first_epoch(seed, **kwargs):
        ds = data.load(
            "cifar10", "train", data_dir=str(tmp_path), batch_size=6, seed=seed, **kwargs
        )
        return collect(ds)

    x, y = first_epoch(3)
    x_again, y_again = first_epoch(3)
    np.testing.assert_array_equal(x, x_again)
    np.testing.assert_array_equal(y, y_again)
    assert not np.array_equal(x, first_epoch(4)[0])
    # Without shuffling, the augmented images differ from the plain ones (crops and flips).
    plain, _ = first_epoch(3, shuffle=False, augment=False)
    augmented, _ = first_epoch(3, shuffle=False)
    assert x.shape == augmented.shape == plain.shape == (36, 32, 32, 3)
    changed = np.any(augmented != plain, axis=(1, 2, 3))
    assert changed.sum() > 30  # unchanged only for offset (4, 4) without flip: p = 1/162
    # Successive iterations over a dataset differ, and do so identically on a fresh pipeline.
    once = data.load("cifar10", "train", data_dir=str(tmp_path), batch_size=6, seed=3)
    assert not np.array_equal(collect(once)[0], collect(once)[0])
    fresh = data.load("cifar10", "train", data_dir=str(tmp_path), batch_size=6, seed=3)
    np.testing.assert_array_equal(collect(fresh)[0], x)
    # The repeated stream: its passes differ, a fresh stream is the same, and a stream started
    # at batch 8 (inside the second pass) is the same stream from there on.
    ds = data.load("cifar10", "train", data_dir=str(tmp_path), batch_size=6, seed=3, repeat=True)
    two_epochs = [b[0] for b in ds.take(12).as_numpy_iterator()]
    assert not np.array_equal(np.concatenate(two_epochs[6:]), np.concatenate(two_epochs[:6]))
    ds = data.load("cifar10", "train", data_dir=str(tmp_path), batch_size=6, seed=3, repeat=True)
    again = [b[0] for b in ds.take(12).as_numpy_iterator()]
    later = data.load(
        "cifar10",
        "train",
        data_dir=str(tmp_path),
        batch_size=6,
        seed=3,
        repeat=True,
        start_batch=8,
    )
    np.testing.assert_array_equal(
        np.concatenate([b[0] for b in later.take(4).as_numpy_iterator()]),
        np.concatenate(two_epochs[8:]),
    )
    np.testing.assert_array_equal(np.concatenate(again), np.concatenate(two_epochs))


@pytest.mark.parametrize(
    ("pixels", "says"),
    [
        (lambda rows: rows.astype(np.float32) / 255, "are float32 (from 0 to 1)"),
        (lambda rows: rows.astype(np.int32) + 200, "outside the bytes 0-255"),
        (lambda rows: np.where(rows > 128, np.nan, rows.astype(np.float64)), "are float64"),
        (lambda rows: rows[:, :3000], "must be rows of 3072 values"),
    ],
    ids=["normalized", "over-255", "nan", "short-rows"],
)
def test_cifar_pixels_that_are_not_bytes_are_refused_naming_the_file(tmp_path, pixels, says):
    """A re-pickled copy whose pixels are floats in [0, 1] would have been cast to black
    images, values over 255 wrapped and NaN made 0, all without a word."""
    make_cifar10(str(tmp_path))
    batch_path = os.path.join(str(tmp_path), "cifar-10-batches-py", "data_batch_1")
    with open(batch_path, "rb") as f:
        batch = pickle.load(f, encoding="bytes")
    batch[b"data"] = pixels(batch[b"data"])
    write_pickle(batch_path, batch)
    found = local.find("cifar10", str(tmp_path))
    with pytest.raises(ValueError, match=f"{re.escape(batch_path)}: CIFAR pixels") as raised:
        local.read(found, "train")
    assert says in str(raised.value)


@pytest.mark.parametrize(
    ("labels", "says"),
    [
        (lambda y: (y + 0.9).tolist(), "label 0.9 (example 0) is not a whole class number"),
        (lambda y: (y + 10).tolist(), "label 10 (example 0) is outside the dataset's 10 classes"),
        (lambda y: (y - 1).tolist(), "label -1 (example 0) is outside the dataset's 10 classes"),
    ],
    ids=["fractional", "over", "negative"],
)
def test_cifar_labels_that_are_not_the_classes_are_refused_naming_the_file(tmp_path, labels, says):
    """Float labels were truncated to integers and labels beyond the classes reached the loss,
    which failed inside TensorFlow naming no file."""
    make_cifar10(str(tmp_path))
    batch_path = os.path.join(str(tmp_path), "cifar-10-batches-py", "data_batch_1")
    with open(batch_path, "rb") as f:
        batch = pickle.load(f, encoding="bytes")
    batch[b"labels"] = labels(np.zeros(len(batch[b"labels"]), np.int64))
    write_pickle(batch_path, batch)
    with pytest.raises(ValueError, match=re.escape(f"{batch_path}: {says}")):
        collect(in_order("cifar10", "train", data_dir=str(tmp_path), batch_size=8))
    # Whole numbers written as floats are the classes they name.
    batch[b"labels"] = np.zeros(len(batch[b"labels"]), np.float64).tolist()
    write_pickle(batch_path, batch)
    found = local.find("cifar10", str(tmp_path))
    assert local.read(found, "train", 10)[1].dtype == np.int32


def _bad_label(folder, labels: str = "t10k-labels-idx1-ubyte.gz") -> str:
    """Fashion-MNIST's files in `folder`, the sixth label of `labels` (the test file's unless
    named) made 200; the labels' path."""
    for name in os.listdir(FASHION_DIR):
        shutil.copy(os.path.join(FASHION_DIR, name), folder / name)
    labels_path = folder / labels
    with gzip.open(labels_path, "rb") as f:
        raw = bytearray(f.read())
    raw[8 + 5] = 200
    with gzip.open(labels_path, "wb") as f:
        f.write(bytes(raw))
    return str(labels_path)


_DEMO_RUN = os.path.join(ROOT, "study", "results", "deploy", "fmnist-fastbat")
# Per case: the program, its words, the path it would write, and the labels file damaged.
_ON_BAD_DATA = {
    "train.py": (
        "train.py",
        [
            "--dataset=fashion_mnist",
            "--model=small_cnn",
            "--width=4",
            "--epochs=1",
            "--max_train_examples=256",
            "--val_examples=64",
            "--eval_examples=64",
            "--noexport",
            "--workdir={out}",
        ],
        "run",
        "t10k-labels-idx1-ubyte.gz",
    ),
    # A committed run's selected weights, evaluated on the damaged test file.
    "evaluate.py": (
        "evaluate.py",
        [f"--model_path={_DEMO_RUN}", "--results={out}"],
        "eval.json",
        "t10k-labels-idx1-ubyte.gz",
    ),
    # Its validation split is the training file's last tenth: that file is checked too.
    "evaluate.py --split=validation": (
        "evaluate.py",
        [f"--model_path={_DEMO_RUN}", "--split=validation", "--results={out}"],
        "eval.json",
        "train-labels-idx1-ubyte.gz",
    ),
}


@pytest.mark.parametrize("case", sorted(_ON_BAD_DATA))
def test_a_label_beyond_the_classes_stops_a_program_before_tensorflow_loads(tmp_path, case):
    """train.py and evaluate.py on local files whose labels hold a 200 in the file they read:
    one line naming the file, before TensorFlow loads (it is unimportable here, so nothing later
    can be what stopped them), and nothing written."""
    program, words, written, labels = _ON_BAD_DATA[case]
    labels_path = _bad_label(tmp_path, labels)
    out = tmp_path / written
    done = subprocess.run(
        python_command(
            os.path.join(ROOT, program),
            f"--data_dir={tmp_path}",
            *(word.format(out=out) for word in words),
            prelude=NO_TENSORFLOW,
        ),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode != 0
    lines = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert lines == [
        f"error: {labels_path}: label 200 (example 5) is outside the dataset's 10 classes (0 to 9)"
    ], done.stderr[-3000:]
    assert "Traceback" not in done.stderr and not out.exists()


@pytest.mark.parametrize("damage", ["truncated", "not-gzip"])
def test_an_idx_file_that_cannot_be_read_whole_is_refused_naming_it(tmp_path, damage):
    for name in os.listdir(FASHION_DIR):
        shutil.copy(os.path.join(FASHION_DIR, name), tmp_path / name)
    path = tmp_path / "t10k-labels-idx1-ubyte.gz"
    raw = path.read_bytes()
    path.write_bytes(raw[: len(raw) // 2] if damage == "truncated" else b"plain bytes" + raw)
    found = local.find("idx", str(tmp_path))
    with pytest.raises(ValueError) as raised:
        local.read(found, "test", 10)
    message = str(raised.value)
    assert message.startswith(f"{path} cannot be read whole (") and "\n" not in message


def test_a_stream_with_indices_gives_each_example_s_position_in_the_split(tmp_path):
    """with_indices=True adds each example's position in the split: unaugmented, its image is the
    split's image there; the stream (images, labels, order) is the one without indices; each pass
    holds every position at most once; `examples` counts the split."""
    make_cifar10(str(tmp_path), per_batch=8)  # 40 training images, 36 in "train"
    options = dict(data_dir=str(tmp_path), batch_size=6, seed=3, augment=False, repeat=True)
    plain = list(data.load("cifar10", "train", **options).take(12).as_numpy_iterator())
    indexed = list(
        data.load("cifar10", "train", with_indices=True, **options).take(12).as_numpy_iterator()
    )
    split, _ = collect(
        data.load(
            "cifar10", "train", data_dir=str(tmp_path), batch_size=6, shuffle=False, augment=False
        )
    )
    assert data.examples("cifar10", "train", **options) == len(split) == 36
    assert data.examples("cifar10", "train", max_examples=20, **options) == 20
    for (x, y), (x_i, y_i, where) in zip(plain, indexed, strict=True):
        np.testing.assert_array_equal(x, x_i)
        np.testing.assert_array_equal(y, y_i)
        assert where.dtype == np.int64
        np.testing.assert_array_equal(x_i, split[where])
    for one_pass in (indexed[:6], indexed[6:]):
        positions = np.concatenate([batch[2] for batch in one_pass])
        assert sorted(positions) == list(range(36))
    assert not np.array_equal(indexed[0][2], np.arange(6))  # shuffled
