"""fbat-tf: Fast-BAT and its baselines for Keras 3 on TensorFlow.

    from fbat_tf import data, methods, models
    from fbat_tf.training import TrainConfig, train

    results = train(TrainConfig(workdir="runs/demo", method="fastbat", dataset="fashion_mnist",
                                model="small_cnn", eps=8 / 255, epochs=4))

The library never reads flags; train.py and evaluate.py turn flags into these calls.
"""

__version__ = "0.1.0"
