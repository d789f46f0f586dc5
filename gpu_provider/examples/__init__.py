"""The example pipeline's job programs: the code that runs *inside* the jobs of ``gpu_ml_pipeline``.

Four stages, each a program run as a module, so they work from a pip install and from a trainer
image with the package installed, with no file paths to configure::

    python -m gpu_provider.examples.preprocess --start DATE --end DATE --out URI [--rows N]
    python -m gpu_provider.examples.train --data URI --out URI --epochs E [...]
    python -m gpu_provider.examples.evaluate --checkpoints URI --data URI --model URI --out URI [...]
    python -m gpu_provider.examples.infer --model URI --data URI --out URI

``evaluate`` runs next to ``train``: it evaluates each new checkpoint while training runs and stops
when training ends.

They need numpy (``pip install 'airflow-provider-gpu[examples]'``) and, of this package, only the
in-job runtime helper ``gpu_provider.runtime``; no Airflow. Nothing here is imported by a DAG file
or the operator, and this ``__init__`` imports nothing, so DAG parsing never pays for numpy.
"""
