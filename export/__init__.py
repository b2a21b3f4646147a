"""SavedModel export for TF-Serving, the model card beside it, and a client for the server.

    python -m export --workdir=runs/fmnist-fastbat            # -> runs/fmnist-fastbat/export/...
    python -m export.client --server=localhost:8501 --model_name=fashion_mnist-small_cnn-fastbat \\
        --images=shirt.png

    from export.savedmodel import export_run, export_model, model_card   # the library
    from export.client import rest_request_body, grpc_request            # request builders

Modules: `savedmodel` (export and model card), `modelcard` (the card's parts, from a run's
record), `versions` (the `<name>/<version>/` layout, without TensorFlow), `cli` (the flags of
`python -m export`), `client` (REST and gRPC). Importing this package imports nothing else, so
the command lines check their flags before TensorFlow loads.
"""
