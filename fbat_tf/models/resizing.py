"""keras.layers.Resizing with derivatives of every order, for models that resize their input.

TensorFlow declares the gradient of its bilinear resize (ResizeBilinearGrad) not differentiable,
so a second derivative through a bilinear `keras.layers.Resizing` is None, which the tape reads
as zero: a model that resizes its input inside the graph (keras-hub's image converters do, to
the preset's size) gives Fast-BAT no implicit term and GradAlign no regularizer gradient, without
an error. TensorFlow's other resizes (nearest, bicubic, antialiased) have no registered second
derivative at all.
"""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf

# The largest difference from Keras' own resize, relative to the image's largest value, that
# the matrices may show on a random image before they are trusted (float32 rounding is ~1e-7).
TOLERANCE = 1e-5


@keras.saving.register_keras_serializable(package="fbat_tf")
class Resizing(keras.layers.Resizing):
    """keras.layers.Resizing whose images' resize is two matrix products, A_h · x · A_wᵀ.

    Every resize of `keras.layers.Resizing` (its interpolations, antialiasing, a crop to the
    target's aspect ratio) is linear in the image and acts on rows and columns separately.
    At the first call for an input size the two matrices are read off Keras' own resize of
    one-hot images (eagerly, also inside a traced function) and checked to give Keras' result
    on a random image; a configuration where they do not (padding to the target's aspect ratio,
    which adds the fill value) raises ValueError. Derivatives of every order are then those of
    matrix products. Only the images' transform changes (config, masks, boxes and saving are
    Keras').
    """

    def transform_images(self, images, transformation=None, training=True):
        if self.data_format == "channels_first":
            images = tf.transpose(images, (0, 2, 3, 1))
        height, width = images.shape[1], images.shape[2]
        if height is None or width is None:
            raise ValueError(
                f"{self.name}: exact second derivatives of a resize need the input's height and "
                f"width, got the shape {images.shape}"
            )
        rows, columns = self.matrices(int(height), int(width))
        dtype = images.dtype
        resized = tf.einsum(
            "oh,bhwc,pw->bopc", tf.cast(rows, dtype), images, tf.cast(columns, dtype)
        )
        if self.data_format == "channels_first":
            resized = tf.transpose(resized, (0, 3, 1, 2))
        return resized

    def matrices(self, height: int, width: int) -> tuple[np.ndarray, np.ndarray]:
        """(A_h [out_height, height], A_w [out_width, width]) for an input of that size."""
        cache = self.__dict__.setdefault("_exact_matrices", {})
        if (height, width) not in cache:
            with tf.init_scope():  # eagerly, also while a function is traced
                cache[(height, width)] = self._read_matrices(height, width)
        return cache[(height, width)]

    def _keras_resize(self, images: np.ndarray) -> np.ndarray:
        """Keras' resize of NHWC images, whatever this layer's data format."""
        images = tf.constant(images, tf.float32)
        if self.data_format == "channels_first":
            images = tf.transpose(images, (0, 3, 1, 2))
        resized = super().transform_images(images)
        if self.data_format == "channels_first":
            resized = tf.transpose(resized, (0, 2, 3, 1))
        return np.asarray(resized, dtype=np.float64)

    def _read_matrices(self, height: int, width: int) -> tuple[np.ndarray, np.ndarray]:
        # Image i of the batch is one on its row i (column i) and zero elsewhere: resized, its
        # column (row) 0 is column i of A_h (of A_w), each row of A_w (A_h) summing to one.
        shape = (height, width, 1)
        one_hot_rows = np.broadcast_to(np.eye(height)[:, :, None, None], (height, *shape))
        one_hot_columns = np.broadcast_to(np.eye(width)[:, None, :, None], (width, *shape))
        rows = self._keras_resize(one_hot_rows)[:, :, 0, 0].T
        columns = self._keras_resize(one_hot_columns)[:, 0, :, 0].T
        image = np.random.default_rng(0).uniform(0, 1, (1, height, width, 1))
        expected = self._keras_resize(image)[0, :, :, 0]
        error = np.max(np.abs(rows @ image[0, :, :, 0] @ columns.T - expected))
        if not error <= TOLERANCE:
            raise ValueError(
                f"{self.name}: this resize ({self.interpolation}, crop_to_aspect_ratio="
                f"{self.crop_to_aspect_ratio}, pad_to_aspect_ratio={self.pad_to_aspect_ratio}, "
                f"fill_value={self.fill_value}) is not read as the product of a row and a column "
                f"matrix (differs from Keras' by {error:.3g}); resize the images in the data "
                "pipeline"
            )
        return rows.astype(np.float32), columns.astype(np.float32)
