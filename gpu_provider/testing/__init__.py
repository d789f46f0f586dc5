"""Test your own GPU pipelines offline: emulators, simulated interruptions and DAG-run helpers.

``pip install 'airflow-provider-gpu[testing]'`` brings what the emulators need (moto with its server,
boto3, the amazon and cncf-kubernetes providers, pytest). The pytest plugin
(:mod:`gpu_provider.testing.plugin`, registered through pytest's ``pytest11`` entry point) gives the
fixtures ``gpu_local``, ``gpu_aws``, ``gpu_kubernetes`` and ``run_gpu_dag``;
``python -m gpu_provider.testing.check`` checks a job program's side of the contract.

* :mod:`gpu_provider.testing.emulators` - AWS Batch, SageMaker, EC2 spot signals and a Kubernetes API
  server, each jobs' commands run as local processes (needs the ``[testing]`` extra).
* :mod:`gpu_provider.testing.dagrun` - run a DAG with ``dag.test()`` in a child process and read what
  each task did (base install).
  Its child's side is :mod:`gpu_provider.testing.dagchild`; :mod:`gpu_provider.testing.warm` forks the
  children from a server that imported Airflow once.
* :mod:`gpu_provider.testing.check` - the job-program checker (base install).

Importing this package (or the plugin) imports no moto, boto3 or emulator: only a fixture that needs
one does, and without the extra it fails with :class:`~gpu_provider.extras.MissingExtraError` naming
``airflow-provider-gpu[testing]``.
"""
