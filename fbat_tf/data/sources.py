"""Where a dataset's data comes from, first match wins; messages that say where it looked.

1. local files (formats in `local.py`) in `data_dir`, or with no `data_dir` in the entry's
   default folders;
2. TFDS data that the TFDS source in use reports as prepared in `data_dir` (or TFDS's default
   data dir);
3. a TFDS download, if `download` and the machine is online (ImageNet: from hand-downloaded
   archives only). Otherwise `DatasetNotFoundError`, at once, saying where it looked.

TFDS is reached through one `tfds_source.TFDSSource`; `use_tfds_source(source)` puts another
in its place for a block of code.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import errno
import os
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import numpy as np

from fbat_tf.data import local, online, registry

if TYPE_CHECKING:
    from fbat_tf.data.tfds_source import TFDSSource

_TINY_IMAGENET_URL = "http://cs231n.stanford.edu/tiny-imagenet-200.zip"

# The TFDS source in use; None until first needed, then the default TFDSSource.
_tfds_source: TFDSSource | None = None


class DatasetNotFoundError(FileNotFoundError):
    """No local files, no prepared TFDS data, and no download possible; says where it looked."""


@contextlib.contextmanager
def use_tfds_source(source: TFDSSource) -> Iterator[TFDSSource]:
    """Read TFDS through `source` (a `tfds_source.TFDSSource`) inside the block.

    `check_available` and `load` then ask `source` which builder to use, whether its data is
    prepared, and for the examples; the previous source is back after the block.

        with data.use_tfds_source(MySource()):
            train = data.load("cifar10", "train", download=False)
    """
    global _tfds_source
    previous, _tfds_source = _tfds_source, source
    try:
        yield source
    finally:
        _tfds_source = previous


def tfds_source_in_use() -> TFDSSource:
    """The TFDS source `resolve` asks: the one of the innermost `use_tfds_source`, else the
    default `tfds_source.TFDSSource`."""
    global _tfds_source
    if _tfds_source is None:
        # Imported on first use: importing TFDS takes seconds, and local files never need it.
        from fbat_tf.data import tfds_source

        _tfds_source = tfds_source.TFDSSource()
    return _tfds_source


@dataclasses.dataclass(frozen=True)
class Source:
    """What `resolve` found: local files, or a TFDS builder with the TFDS source to read it."""

    description: str
    local_files: local.LocalFiles | None = None
    tfds: TFDSSource | None = None
    builder: object | None = None  # tfds.core.DatasetBuilder
    needs_download: bool = False


def check_available(name: str, data_dir: str | None = None, download: bool = True) -> str:
    """Describe the source `load` will use, cheaply (no decoding), or raise DatasetNotFoundError.

    With `download=True` and nothing on disk, this opens one TCP connection (a few seconds at
    most) to tell whether a TFDS download can work; pass `download=False` to stay offline.
    """
    return resolve(registry.lookup(name), data_dir, download).description


# Decoded splits, kept for the run: a few entries at most, each holds a whole split (CIFAR:
# 150 MB, Tiny-ImageNet: 1.2 GB).
_DECODED: collections.OrderedDict[tuple, tuple[np.ndarray, np.ndarray]] = collections.OrderedDict()
_DECODED_SIZE = 4


def decoded(
    key: tuple, read: Callable[[], tuple[np.ndarray, np.ndarray]]
) -> tuple[np.ndarray, np.ndarray]:
    """The (images, labels) `read` decodes, read-only, kept under `key` for the run (the few
    latest): a split is decoded once however many times it is asked for."""
    if key not in _DECODED:
        images, labels = read()
        images.flags.writeable = False
        labels.flags.writeable = False
        _DECODED[key] = (images, labels)
        while len(_DECODED) > _DECODED_SIZE:
            _DECODED.popitem(last=False)
    _DECODED.move_to_end(key)
    return _DECODED[key]


def local_arrays(
    entry: registry.Entry, found: local.LocalFiles, part: str
) -> tuple[np.ndarray, np.ndarray]:
    """The "train" or "test" part of local files, decoded once (`decoded`); ValueError naming
    the file where it is bad."""
    key = ("local", found.format_name, found.path, part)
    return decoded(key, lambda: local.read(found, part, entry.info.num_classes))


def check_local_files(
    name: str, data_dir: str | None = None, parts: tuple[str, ...] = ("train", "test")
) -> None:
    """Decode the `parts` of a dataset's local files, so that a bad file (labels outside the
    classes, say) stops a program before it trains, not at its final test; ValueError naming
    the file. Needs no TensorFlow, so a program can check before it loads it; the decoded parts
    stay kept for the run. Nothing for TFDS data."""
    entry = registry.lookup(name)
    found = _find_local(entry, data_dir)
    if found is not None:
        for part in parts:
            local_arrays(entry, found, part)


def needs_tensorflow(name: str, data_dir: str | None = None, download: bool = True) -> bool:
    """Whether `check_available(name, data_dir, download)` asks TFDS, which loads TensorFlow:
    no local files found, a TFDS version to look for, and TFDS not known without it to have
    none (`_offline_refusal`). Finding local files loads none, nor does telling that nothing
    can be had."""
    entry = registry.lookup(name)
    return (
        _find_local(entry, data_dir) is None
        and entry.tfds_name is not None
        and _offline_refusal(entry, data_dir, download) is None
    )


def _find_local(entry: registry.Entry, data_dir: str | None) -> local.LocalFiles | None:
    for directory in _local_dirs(entry, data_dir):
        found = local.find(entry.local_format, directory)
        if found is not None:
            return found
    return None


def resolve(entry: registry.Entry, data_dir: str | None, download: bool) -> Source:
    """The first source of `entry` in the order of this module's docstring."""
    found = _find_local(entry, data_dir)
    if found is not None:
        return Source(found.description, local_files=found)
    searched = _local_dirs(entry, data_dir)
    tfds_name = entry.tfds_name
    if tfds_name is None:
        raise _not_found(entry, searched, f"{entry.info.name} has no TFDS version.")

    refusal = _offline_refusal(entry, data_dir, download)
    if refusal is not None:  # told without TensorFlow
        root = _tfds_root(data_dir)
        raise _not_found(
            entry, searched, refusal, os.path.join(root, tfds_name), _manual_dir(entry, root)
        )
    tfds = tfds_source_in_use()
    builder = tfds.builder(tfds_name, os.path.expanduser(data_dir) if data_dir else None)
    if tfds.is_prepared(builder):
        return Source(tfds.describe(tfds_name, builder), tfds=tfds, builder=builder)
    refusal = _download_refusal(tfds, builder, tfds_name, download)
    if refusal is not None:
        manual = tfds.manual_dir(builder) if tfds.needs_manual_download(builder) else None
        raise _not_found(entry, searched, refusal, tfds.prepared_path(builder), manual)
    prepared_path = tfds.prepared_path(builder)
    if tfds.needs_manual_download(builder):
        plan = f"prepared in {prepared_path} from {tfds.manual_dir(builder)}"
    else:
        plan = f"downloaded and prepared in {prepared_path}"
    return Source(
        f"TFDS {tfds_name}, to be {plan}", tfds=tfds, builder=builder, needs_download=True
    )


def download(entry: registry.Entry, source: Source, data_dir: str | None) -> None:
    """Download and prepare what `resolve` found to need it; DatasetNotFoundError if that fails.
    TFDS writes by name: the folders it writes in under the data dir (the dataset's and
    downloads/) are refused first where they are symbolic links (an OSError naming the folder,
    as records/files.py's LinkRefused does for the project's own writes)."""
    root = _tfds_root(data_dir)
    for folder in (os.path.join(root, entry.tfds_name), os.path.join(root, "downloads")):
        if os.path.islink(folder):
            raise OSError(
                errno.ELOOP,
                "a symbolic link, and TFDS would download and prepare the data through it: move "
                "the link away (or pass another --data_dir) and run the command again",
                folder,
            )
    try:
        source.tfds.download_and_prepare(source.builder)
    except OSError as err:  # ConnectionError, requests' errors and disk errors are OSErrors
        reason = f"Download of {entry.tfds_name} failed: {err}"
        searched = _local_dirs(entry, data_dir)
        tfds, builder = source.tfds, source.builder
        manual = tfds.manual_dir(builder) if tfds.needs_manual_download(builder) else None
        raise _not_found(entry, searched, reason, tfds.prepared_path(builder), manual) from err


def _local_dirs(entry: registry.Entry, data_dir: str | None) -> list[str]:
    if not entry.local_format:
        return []
    roots = [data_dir] if data_dir else list(entry.default_dirs)
    dirs = []
    for root in roots:
        root = os.path.expanduser(root)
        dirs.extend(os.path.join(root, sub) for sub in entry.local_subdirs)
        dirs.append(root)
    return dirs


def _tfds_root(data_dir: str | None) -> str:
    """The data dir TFDS's builder reads: `data_dir`, else TFDS's default (TFDS_DATA_DIR or
    ~/tensorflow_datasets)."""
    root = data_dir or os.environ.get("TFDS_DATA_DIR") or "~/tensorflow_datasets"
    return os.path.expanduser(root)


def _manual_dir(entry: registry.Entry, root: str) -> str | None:
    """Where TFDS looks for a hand-fetched dataset's archives (its default DownloadConfig)."""
    return os.path.join(root, "downloads", "manual") if entry.tfds_manual else None


def _offline_refusal(entry: registry.Entry, data_dir: str | None, download: bool) -> str | None:
    """Why the default TFDS source cannot have the data, told from the file system and one
    bounded probe without loading TensorFlow: nothing of it in TFDS's data dir, and no download
    possible. None where TFDS must be asked, or where another TFDS source is in use (it answers
    for itself)."""
    if _tfds_source is not None or entry.tfds_name is None:
        return None
    root = _tfds_root(data_dir)
    if os.path.lexists(os.path.join(root, entry.tfds_name)):
        return None  # something there: TFDS tells whether it is prepared
    if not download:
        return "Downloading is disabled (download=False)."
    manual = _manual_dir(entry, root)
    if manual is not None:
        if os.path.isdir(manual) and os.listdir(manual):
            return None
        return (
            f"TFDS cannot download {entry.tfds_name}: its archives must be fetched by hand "
            f"into {manual} (see below)."
        )
    if not online.reachable():
        return "No internet connection, so TFDS cannot download it here."
    return None


def _download_refusal(
    tfds: TFDSSource, builder: object, tfds_name: str, download: bool
) -> str | None:
    """Why TFDS cannot download and prepare the data here, or None when it can."""
    if not download:
        return "Downloading is disabled (download=False)."
    if tfds.needs_manual_download(builder):
        if tfds.has_manual_files(builder):
            return None
        return (
            f"TFDS cannot download {tfds_name}: its archives must be fetched by hand "
            f"into {tfds.manual_dir(builder)} (see below)."
        )
    if not tfds.internet_reachable():
        return "No internet connection, so TFDS cannot download it here."
    return None


def _not_found(
    entry: registry.Entry,
    searched: list[str],
    reason: str,
    prepared: str | None = None,
    manual: str | None = None,
) -> DatasetNotFoundError:
    """The error saying where it looked (local folders, TFDS's `prepared` folder) and why it
    found nothing; `manual`: where a hand-fetched dataset's archives go."""
    name, tfds_name = entry.info.name, entry.tfds_name
    lines = [f"Dataset {name!r} not found."]
    if searched:
        lines.append(f"  Looked for local files in: {', '.join(searched)}")
    if prepared is not None:
        lines.append(f"  Looked for prepared TFDS data ({tfds_name}) in: {prepared}")
    lines.append(f"  {reason}")
    accepted = []
    if entry.local_format:
        accepted.append(local.DESCRIPTIONS[entry.local_format])
    if tfds_name:
        accepted.append(f"a TFDS data dir in which {tfds_name} is prepared")
    lines.append(f"Pass --data_dir=DIR where DIR holds {'; or '.join(accepted)}.")
    if tfds_name is None:
        lines.append(f"{name} is local only: download {_TINY_IMAGENET_URL} and unzip it in DIR.")
    elif manual is not None:
        lines.append(
            f"TFDS prepares {tfds_name} from ILSVRC2012_img_train.tar and ILSVRC2012_img_val.tar "
            f"(from image-net.org) placed in {manual}."
        )
    else:
        lines.append(
            f"On a machine with internet TFDS downloads and prepares it, e.g. "
            f'python -c "import tensorflow_datasets as tfds; '
            f"tfds.builder('{tfds_name}', data_dir='DIR').download_and_prepare()\"; "
            f"then copy DIR here."
        )
    return DatasetNotFoundError("\n".join(lines))
