"""Training-set augmentations: pure TF ops, stateless, usable eagerly and inside tf.data.

Batch augmentations (in-memory datasets) take float32 NHWC images in [0, 1] and a stateless
seed (int32/int64 tensor of shape [2]); every example in the batch gets its own crop offset,
flip and angle, so a batch is reproducible given (images, seed):

    from fbat_tf.data import augment

    x = augment.pad_crop_flip(x, seed)          # CIFAR-10, Tiny-ImageNet
    x = augment.pad_crop_flip_rotate(x, seed)   # CIFAR-100: also a rotation within ±15°

ImageNet works per example, before batching, because decoded images differ in size:

    x = augment.imagenet_train_crop(image_uint8, seed)   # shorter side 256, random 224 crop + flip
    x = augment.imagenet_eval_crop(image_uint8)          # shorter side 256, center 224 crop
"""

from __future__ import annotations

import math
from collections.abc import Callable

import tensorflow as tf

# (images [B, H, W, C] float32, seed [2]) -> images of the same shape.
AugmentFn = Callable[[tf.Tensor, tf.Tensor], tf.Tensor]

CROP_PADDING = 4
MAX_ROTATION_DEGREES = 15.0
IMAGENET_RESIZE = 256
IMAGENET_CROP = 224


def random_crop_with_padding(
    images: tf.Tensor, seed: tf.Tensor, padding: int = CROP_PADDING
) -> tf.Tensor:
    """Zero-pad each side by `padding`, then crop back to H x W at a random offset per example.

    The crop is two batched gathers (rows, then columns) so each example has its own offset
    without a per-example loop.
    """
    height, width = images.shape[1], images.shape[2]
    batch = tf.shape(images)[0]
    padded = tf.pad(images, [[0, 0], [padding, padding], [padding, padding], [0, 0]])
    offsets = tf.random.stateless_uniform(
        [batch, 2], seed=seed, minval=0, maxval=2 * padding + 1, dtype=tf.int32
    )
    rows = offsets[:, 0:1] + tf.range(height)[tf.newaxis, :]  # [B, H]
    cols = offsets[:, 1:2] + tf.range(width)[tf.newaxis, :]  # [B, W]
    cropped = tf.gather(padded, rows, axis=1, batch_dims=1)
    return tf.gather(cropped, cols, axis=2, batch_dims=1)


def random_flip_left_right(images: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
    """Mirror each example horizontally with probability 1/2."""
    batch = tf.shape(images)[0]
    flip = tf.random.stateless_uniform([batch], seed=seed) < 0.5
    return tf.where(flip[:, tf.newaxis, tf.newaxis, tf.newaxis], tf.reverse(images, [2]), images)


def rotate(images: tf.Tensor, angles: tf.Tensor) -> tf.Tensor:
    """Rotate each example by its angle (radians) about the image center; zero fill, bilinear.

    Zero fill matches torchvision's RandomRotation default, which CIFAR-100 recipes use.
    """
    height = tf.cast(tf.shape(images)[1], tf.float32)
    width = tf.cast(tf.shape(images)[2], tf.float32)
    center_x, center_y = (width - 1.0) / 2.0, (height - 1.0) / 2.0
    cos, sin = tf.cos(angles), tf.sin(angles)
    zeros = tf.zeros_like(angles)
    # The op maps each output pixel (x, y) to the input pixel it samples:
    # x_in = cos*x - sin*y + a2, y_in = sin*x + cos*y + b2, fixing the center.
    transforms = tf.stack(
        [
            cos,
            -sin,
            center_x - cos * center_x + sin * center_y,
            sin,
            cos,
            center_y - sin * center_x - cos * center_y,
            zeros,
            zeros,
        ],
        axis=1,
    )
    return tf.raw_ops.ImageProjectiveTransformV3(
        images=images,
        transforms=transforms,
        output_shape=tf.shape(images)[1:3],
        fill_value=0.0,
        interpolation="BILINEAR",
        fill_mode="CONSTANT",
    )


def random_rotation(
    images: tf.Tensor, seed: tf.Tensor, max_degrees: float = MAX_ROTATION_DEGREES
) -> tf.Tensor:
    """Rotate each example by an angle drawn uniformly from [-max_degrees, max_degrees]."""
    max_radians = max_degrees * math.pi / 180.0
    angles = tf.random.stateless_uniform(
        [tf.shape(images)[0]], seed=seed, minval=-max_radians, maxval=max_radians
    )
    rotated = rotate(images, angles)
    rotated.set_shape(images.shape)
    return rotated


def pad_crop_flip(images: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
    """CIFAR-10 / Tiny-ImageNet: 4-pixel zero-padded random crop, then horizontal flip."""
    crop_seed, flip_seed = tf.unstack(tf.random.experimental.stateless_split(seed, num=2))
    return random_flip_left_right(random_crop_with_padding(images, crop_seed), flip_seed)


def pad_crop_flip_rotate(images: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
    """CIFAR-100: crop and flip as `pad_crop_flip`, then a random rotation within ±15°."""
    crop_seed, flip_seed, rotation_seed = tf.unstack(
        tf.random.experimental.stateless_split(seed, num=3)
    )
    images = random_flip_left_right(random_crop_with_padding(images, crop_seed), flip_seed)
    return random_rotation(images, rotation_seed)


def resize_shorter_side(image: tf.Tensor, size: int = IMAGENET_RESIZE) -> tf.Tensor:
    """Resize one HWC image (any dtype) so that its shorter side is `size`; float32 out."""
    shape = tf.cast(tf.shape(image)[:2], tf.float32)
    scale = size / tf.reduce_min(shape)
    # max(size, .) guards the shorter side against rounding to size - 1.
    new_shape = tf.maximum(tf.cast(tf.round(shape * scale), tf.int32), size)
    return tf.image.resize(image, new_shape, method="bilinear", antialias=True)


def center_crop(image: tf.Tensor, size: int = IMAGENET_CROP) -> tf.Tensor:
    """The central size x size window of one HWC image (at least size on both sides)."""
    top = (tf.shape(image)[0] - size) // 2
    left = (tf.shape(image)[1] - size) // 2
    return image[top : top + size, left : left + size, :]


def imagenet_train_crop(image: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
    """ImageNet training view: shorter side 256, random 224 crop, random flip; [0, 1] float32."""
    crop_seed, flip_seed = tf.unstack(tf.random.experimental.stateless_split(seed, num=2))
    image = resize_shorter_side(image)
    image = tf.image.stateless_random_crop(image, [IMAGENET_CROP, IMAGENET_CROP, 3], seed=crop_seed)
    image = tf.image.stateless_random_flip_left_right(image, seed=flip_seed)
    return _to_unit_range(image)


def imagenet_eval_crop(image: tf.Tensor) -> tf.Tensor:
    """ImageNet evaluation view: shorter side 256, center 224 crop; [0, 1] float32."""
    return _to_unit_range(center_crop(resize_shorter_side(image)))


def _to_unit_range(image: tf.Tensor) -> tf.Tensor:
    # Resizing works in 0..255; antialiased bilinear can overshoot by rounding, hence the clip.
    image = tf.ensure_shape(image, [IMAGENET_CROP, IMAGENET_CROP, 3])
    return tf.clip_by_value(image / 255.0, 0.0, 1.0)
