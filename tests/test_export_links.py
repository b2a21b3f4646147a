"""An export's own paths are never written through a link it did not make: the run's default
export/ folder, the version folder and card that `add_formats` writes into, the card an
artifact's re-check adds its row to, and the folders TFDS would download into. Each test plants
the link and checks that what lies behind it is byte for byte what it was."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from fbat_tf.records import files
from tests.snapshots import snapshot

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUN = os.path.join(ROOT, "study", "results", "deploy", "fmnist-fastbat")  # a committed small run


def _outside(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("kept")
    return outside


def test_python_m_export_refuses_a_runs_export_folder_that_is_a_link(tmp_path):
    run = tmp_path / "run"
    shutil.copytree(RUN, run)
    outside = _outside(tmp_path)
    (run / "export").symlink_to(outside, target_is_directory=True)
    before = snapshot(outside)
    done = subprocess.run(
        [sys.executable, "-m", "export", f"--workdir={run}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
    )
    assert done.returncode == 1, done.stderr[-2000:]
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: {run / 'export'}: a symbolic link"), last
    assert "--export_dir" in last and "Traceback" not in done.stderr
    assert snapshot(outside) == before


def test_a_recheck_row_is_never_added_to_a_card_behind_a_link(tmp_path):
    from export import artifacts

    version = tmp_path / "export" / "m" / "1"
    version.mkdir(parents=True)
    outside = _outside(tmp_path)
    (outside / "model_card.json").write_text('{"model": "someone else\'s"}')
    (version / "assets.extra").symlink_to(outside, target_is_directory=True)
    before = snapshot(outside)
    with pytest.raises(files.LinkRefused):
        artifacts.record_recheck(str(version), "model.onnx", {"examples": 1})
    assert snapshot(outside) == before


def test_formats_are_never_added_into_a_version_or_through_a_file_that_is_a_link(tmp_path):
    """add_formats (train.py's export of a finished run) checks the version folder from the
    run's export/ on and each file it writes, before any conversion."""
    from export import savedmodel

    run = tmp_path / "run"
    shutil.copytree(RUN, run, ignore=shutil.ignore_patterns("export"))
    outside = _outside(tmp_path)
    (outside / "model.onnx").write_bytes(b"someone else's file")
    (run / "export" / "m").mkdir(parents=True)
    version = run / "export" / "m" / "1"
    version.symlink_to(outside, target_is_directory=True)
    before = snapshot(outside)
    with pytest.raises(files.LinkRefused):
        savedmodel.add_formats(str(run), str(version), ["saved_model", "onnx"])
    os.remove(version)
    version.mkdir()
    (version / "assets.extra").mkdir()
    (version / "model.tflite").symlink_to(outside / "model.tflite")  # dangling: not there yet
    with pytest.raises(files.LinkRefused):
        savedmodel.add_formats(str(run), str(version), ["saved_model", "litert"])
    assert snapshot(outside) == before


def test_tfds_never_downloads_into_a_dataset_folder_that_is_a_link(tmp_path):
    from fbat_tf import data
    from fbat_tf.data import registry, sources

    outside = _outside(tmp_path)
    root = tmp_path / "data"
    root.mkdir()
    (root / "cifar10").symlink_to(outside, target_is_directory=True)
    before = snapshot(outside)

    class Never:
        def download_and_prepare(self, builder):
            raise AssertionError("TFDS was asked to download")

    source = sources.Source("TFDS cifar10, to be downloaded", tfds=Never(), needs_download=True)
    with pytest.raises(OSError, match="a symbolic link, and TFDS would download"):
        sources.download(registry.lookup("cifar10"), source, str(root))
    assert snapshot(outside) == before
    assert data.names()  # the package is whole
