"""Classify images through a running TF-Serving, over REST or gRPC.

    python -m export.client --server=localhost:8501 --model_name=fashion_mnist-small_cnn-fastbat \\
        --images=shirt.png,boot.png
    python -m export.client --protocol=grpc --server=localhost:8500 \\
        --model_name=fashion_mnist-small_cnn-fastbat --images=batch.npy

As a library (images: a batch [N, H, W, C], uint8 pixels or floats in [0, 1]):

    body = rest_request_body(images)            # {"signature_name": ..., "instances": [...]}
    outputs = rest_predict("localhost:8501", "fmnist", images)   # {"classes": array([...]), ...}
    request = grpc_request(images, "fmnist")    # a tensorflow_serving PredictRequest
    outputs = grpc_predict("localhost:8500", request)

The signature follows the pixels' dtype unless one is named: uint8 -> "serve_uint8", floats ->
"serving_default" (sent as float32). REST needs only numpy and the standard library; gRPC needs
`tensorflow-serving-api` (and so grpcio and TensorFlow), imported only when used. Image files
(PNG, JPEG, BMP, GIF) are decoded with TensorFlow; `.npy` files hold one image [H, W, C] or a
batch [N, H, W, C] of numbers (an object array, which is a pickle, is refused).
"""

from __future__ import annotations

import json
import math
import os
import sys
import urllib.error
import urllib.request
from collections.abc import Sequence
from typing import Any

import numpy as np

from fbat_tf.run import FLOAT_SIGNATURE, UINT8_SIGNATURE  # loads no TensorFlow

INPUT_KEY = "images"


class ServingError(RuntimeError):
    """The server could not be reached or refused the request; the message says which."""


def as_pixels(images: Any) -> np.ndarray:
    """A batch [N, H, W, C] of uint8 pixels, or of float32 pixels in [0, 1]; else ValueError.

    The server rejects other values too; checking here gives the message before the round trip.
    """
    images = np.asarray(images)
    if images.ndim != 4:
        raise ValueError(f"images must be a batch [N, H, W, C], got shape {images.shape}")
    if images.dtype == np.uint8:
        return images
    if not np.issubdtype(images.dtype, np.floating):
        raise ValueError(f"images must be uint8 or floating-point pixels, got {images.dtype}")
    images = images.astype(np.float32)
    if images.size and not (np.all(images >= 0.0) and np.all(images <= 1.0)):
        raise ValueError(
            f"float pixels must lie in [0, 1] (NaN is not a pixel), got [{np.nanmin(images)}, "
            f"{np.nanmax(images)}]; divide uint8 pixels by 255 or send them as uint8"
        )
    return images


def signature_for(images: np.ndarray) -> str:
    """The exported signature that takes these pixels: serve_uint8 or serving_default."""
    return UINT8_SIGNATURE if images.dtype == np.uint8 else FLOAT_SIGNATURE


def rest_request_body(
    images: Any, columnar: bool = False, signature: str | None = None
) -> dict[str, Any]:
    """The JSON body of POST /v1/models/<name>:predict for a batch of images.

    Row format `{"instances": [image, ...]}` (one entry per image), or columnar
    `{"inputs": {"images": batch}}`; both name the signature (default: by dtype).
    """
    images = as_pixels(images)
    body: dict[str, Any] = {"signature_name": signature or signature_for(images)}
    # tolist() gives Python ints for uint8 and the exact float32 values as doubles, which
    # TF-Serving casts back to the same float32.
    if columnar:
        body["inputs"] = {INPUT_KEY: images.tolist()}
    else:
        body["instances"] = images.tolist()
    return body


def rest_url(server: str, model_name: str, version: int | None = None) -> str:
    """http://<server>/v1/models/<name>[/versions/<N>]:predict (server: host:port or a URL)."""
    base = server if "://" in server else f"http://{server}"
    path = f"/v1/models/{model_name}"
    if version is not None:
        path += f"/versions/{int(version)}"
    return f"{base.rstrip('/')}{path}:predict"


def parse_rest_response(payload: dict[str, Any]) -> dict[str, np.ndarray]:
    """Outputs by name from a predict response, row (`predictions`) or columnar (`outputs`)."""
    if "error" in payload:
        raise ServingError(str(payload["error"]))
    if "predictions" in payload:
        rows = payload["predictions"]
        if rows and isinstance(rows[0], dict):
            if any(not isinstance(row, dict) or set(row) != set(rows[0]) for row in rows):
                raise ServingError("not a predict response: its rows hold different outputs")
            return {key: np.asarray([row[key] for row in rows]) for key in rows[0]}
        return {"outputs": np.asarray(rows)}
    if "outputs" in payload:
        outputs = payload["outputs"]
        if isinstance(outputs, dict):
            return {key: np.asarray(value) for key, value in outputs.items()}
        return {"outputs": np.asarray(outputs)}
    raise ServingError(f"not a predict response: keys {sorted(payload)}")


def rest_predict(
    server: str,
    model_name: str,
    images: Any,
    *,
    columnar: bool = False,
    signature: str | None = None,
    version: int | None = None,
    timeout: float = 30.0,
) -> dict[str, np.ndarray]:
    """POST the images to TF-Serving's REST API; returns its outputs by name."""
    url = rest_url(server, model_name, version)
    body = json.dumps(rest_request_body(images, columnar, signature)).encode()
    request = urllib.request.Request(
        url, data=body, headers={"Content-Type": "application/json"}, method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            payload = json.load(response)
    except json.JSONDecodeError as error:
        raise ServingError(f"{url}: the answer is not JSON ({error})") from None
    except urllib.error.HTTPError as error:
        text = error.read().decode(errors="replace")
        try:
            message = json.loads(text).get("error", text)
        except (json.JSONDecodeError, AttributeError):
            message = text
        raise ServingError(f"{url}: HTTP {error.code}: {message}") from None
    except urllib.error.URLError as error:
        raise ServingError(f"cannot reach {url}: {error.reason}") from None
    return parse_rest_response(payload)


def grpc_request(
    images: Any,
    model_name: str,
    signature: str | None = None,
    version: int | None = None,
):
    """A tensorflow_serving.apis.predict_pb2.PredictRequest for the images.

    The signature defaults by dtype ("serving_default" for floats, sent as DT_FLOAT).
    """
    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2

    images = as_pixels(images)
    request = predict_pb2.PredictRequest()
    request.model_spec.name = model_name
    request.model_spec.signature_name = signature or signature_for(images)
    if version is not None:
        request.model_spec.version.value = int(version)
    request.inputs[INPUT_KEY].CopyFrom(tf.make_tensor_proto(images))
    return request


def grpc_predict(server: str, request: Any, timeout: float = 30.0) -> dict[str, np.ndarray]:
    """Send a PredictRequest to TF-Serving's gRPC PredictionService; outputs by name."""
    import grpc
    import tensorflow as tf
    from tensorflow_serving.apis import prediction_service_pb2_grpc

    with grpc.insecure_channel(server) as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        try:
            response = stub.Predict(request, timeout=timeout)
        except grpc.RpcError as error:
            raise ServingError(f"{server}: {error.code().name}: {error.details()}") from None
    return {key: tf.make_ndarray(tensor) for key, tensor in response.outputs.items()}


def load_images(paths: Sequence[str]) -> tuple[np.ndarray, list[str]]:
    """One batch from .npy files and image files, and a label per image ("file" or "file[i]")."""
    batches, labels = [], []
    for path in paths:
        suffix = os.path.splitext(path)[1].lower()
        if suffix == ".npz":
            raise ValueError(
                f"{path}: an .npz archive; give its arrays as .npy files ([H, W, C] or "
                "[N, H, W, C]) or image files"
            )
        if suffix == ".npy":
            try:
                # Never allow_pickle: an object array is a pickle, and a pickle can run code.
                array = np.load(path, allow_pickle=False)
            except ValueError as error:
                raise ValueError(
                    f"{path}: {error}; the client reads numeric .npy arrays only"
                ) from None
            if array.ndim == 3:
                array = array[None]
            if array.ndim != 4:
                raise ValueError(f"{path}: expected [H, W, C] or [N, H, W, C], got {array.shape}")
            if len(array) == 0:
                raise ValueError(f"{path} holds no image (shape {array.shape})")
            labels += [f"{path}[{i}]" for i in range(len(array))] if len(array) > 1 else [path]
        else:
            import tensorflow as tf

            encoded = tf.io.read_file(path)
            try:
                array = tf.io.decode_image(encoded, dtype=tf.uint8, expand_animations=False)
            except tf.errors.InvalidArgumentError:
                raise ValueError(
                    f"{path}: not an image TensorFlow decodes (PNG, JPEG, GIF, BMP, WebP) nor an "
                    ".npy file"
                ) from None
            array = array.numpy()[None]
            labels.append(path)
        batches.append(array)
    if not batches:
        raise ValueError("no images given")
    shapes = {(b.shape[1:], b.dtype.str) for b in batches}
    if len(shapes) > 1:
        raise ValueError(f"images differ in shape or dtype, cannot batch them: {sorted(shapes)}")
    return np.concatenate(batches), labels


def define_flags() -> None:
    """The command line's flags, defined only when run as a program (not when imported)."""
    from absl import flags

    flags.DEFINE_string("server", None, "host:port of TF-Serving (REST 8501, gRPC 8500).")
    flags.DEFINE_string("model_name", None, "Model name the server serves.")
    flags.DEFINE_list("images", None, "Comma-separated .npy files and/or image files.")
    flags.DEFINE_enum("protocol", "rest", ["rest", "grpc"], "API to call.")
    flags.DEFINE_string("signature", None, "Signature (default: serve_uint8 for uint8 pixels).")
    flags.DEFINE_bool("columnar", False, "REST: send the columnar {'inputs': ...} body.")
    flags.DEFINE_integer("model_version", None, "Version to ask for (default: the latest).")
    flags.DEFINE_float("timeout", 30.0, "Seconds to wait for the server (more than 0).")
    flags.register_validator(
        "timeout",
        lambda value: math.isfinite(value) and value > 0,
        message="--timeout must be a finite number of seconds above 0",
    )
    flags.mark_flags_as_required(["server", "model_name", "images"])


def main(argv: list[str]) -> None:
    from absl import app, flags

    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    values = flags.FLAGS
    try:
        images, labels = load_images(values.images)
        if values.protocol == "rest":
            outputs = rest_predict(
                values.server,
                values.model_name,
                images,
                columnar=values.columnar,
                signature=values.signature,
                version=values.model_version,
                timeout=values.timeout,
            )
        else:
            request = grpc_request(
                images, values.model_name, values.signature, values.model_version
            )
            outputs = grpc_predict(values.server, request, timeout=values.timeout)
    except (ValueError, OSError, ServingError) as error:
        sys.exit(f"error: {error}")
    except ImportError as error:
        sys.exit(f"error: {error}; gRPC needs `pip install tensorflow-serving-api`")
    classes = outputs.get("classes")
    if classes is None or np.ndim(classes) != 1 or len(classes) != len(labels):
        got = "no classes" if classes is None else f"classes of shape {np.shape(classes)}"
        sys.exit(
            f"error: {values.server} answered {got} for {len(labels)} images (outputs: "
            f"{', '.join(sorted(outputs))}): is --model_name a model fbat-tf exported?"
        )
    probabilities = outputs.get("probabilities")
    names = outputs.get("class_names")
    for i, label in enumerate(labels):
        confidence = "" if probabilities is None else f" (p = {probabilities[i][classes[i]]:.4f})"
        print(f"{label}: class {classes[i]}{_named(names, i)}{confidence}")


def _named(names: np.ndarray | None, i: int) -> str:
    """' "Shirt"' for the i-th answer of a model that names its classes, '' otherwise."""
    if names is None or np.ndim(names) != 1 or i >= len(names):
        return ""
    name = names[i]
    return f' "{name.decode() if isinstance(name, bytes) else name}"'


def run_program() -> None:
    """The program as `python -m export.client` and `fbat-serve-client` run it."""

    from flags import usage

    define_flags()
    # absl files the flags defined here under the module that defined them: the program's path
    # (sys.argv[0]) run as __main__, else this module's name (fbat-serve-client).
    here = sys.argv[0] if __name__ == "__main__" else __name__
    usage.run(__doc__, {here: "Client", "flags.errors": "Errors"}, main)


if __name__ == "__main__":
    run_program()
