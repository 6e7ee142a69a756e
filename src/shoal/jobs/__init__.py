"""Describing a multi-node job and handing it to a target; nothing here starts a worker.

The split is TorchX's: a generic job description plus per-target options, one module per target
holding its options, its pure renderers and its submit.

- :mod:`.spec`: :class:`~.spec.JobSpec`, the job as every target sees it (the command, nodes,
  processes per node, rendezvous, variables, name, directory), and the ``--env`` parsing;
- :mod:`.hosts`: a list of hosts from the head node: ``mpirun`` or one ``shoal run`` per host over
  SSH (:class:`~.hosts.options.HostsOptions`), the by-hand lines, and running and stopping them;
- :mod:`.slurm`: an sbatch script (:class:`~.slurm.SlurmOptions`), submitted with sbatch;
- :mod:`.kubernetes`: PyTorchJob, TrainJob, MPIJob, Run:ai, the image
  (:class:`~.kubernetes.options.PodOptions`), applied with kubectl;
- :mod:`.programs`: the programs a target hands its job to, found on PATH.

No renderer reads the environment, the clock or the file system: what they depend on is in their
arguments, so ``--dry-run`` shows exactly what runs and golden files pin it
(``tests/jobs/golden/``). ``shoal launch`` (:mod:`shoal.cli.launch`) is the only caller. The one
piece of :mod:`shoal.launch` used here is :mod:`shoal.launch.as_torchrun`, the per-rank shim every
rendered mpirun and srun line runs; :mod:`shoal.launch` never imports this package.
"""
