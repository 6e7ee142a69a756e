"""The Kubernetes target: every kind a job runs as on pods, and the image the pods run.

- :mod:`.options`: :class:`~.options.PodOptions` (image, namespace, resources, secrets, volumes,
  /dev/shm, elasticity, grace period) and the rules Kubernetes applies to them;
- :mod:`.template`: the pod template every kind shares (command, container, env, volumes, grace);
- :mod:`.pytorchjob`, :mod:`.trainjob`, :mod:`.mpijob`: Kubeflow's PyTorchJob (training-operator
  v1), TrainJob (Trainer v2) and MPIJob (MPI operator v2beta1); a PyTorchJob's and a TrainJob's
  ``render_objects`` is what ``shoal launch k8s`` applies, a fault-tolerant job's lighthouse included;
- :mod:`.fault_tolerance`: torchft's lighthouse as a Deployment and Service beside either;
- :mod:`.runai`: the Run:ai CLI's submit command, for each CLI generation;
- :mod:`.image`: a Dockerfile and a .dockerignore for the job's container image;
- :mod:`.manifest`: an object as YAML, and ``kubectl apply`` of it (the one submit).

Every renderer takes ``(spec, pods)`` and is pure: nothing read from the environment, the clock or
the file system, so ``--dry-run`` shows exactly what is applied and golden files pin it
(``tests/jobs/golden/k8s/``).
"""
