"""Per-step fault tolerance on torchft: the whole feature in one room (docs/FAULT_TOLERANCE.md).

A fault-tolerant job is N replica groups that train one model beside torchft's lighthouse; a group
that fails is restarted alone and heals from a live one while the others train on. The room, in
the order a job meets it:

- :mod:`~shoal.train.ft.job`: the job seen from the process that starts it: its plan (groups'
  size, device, GPUs, start method), decided once, then this node's groups;
- :mod:`~shoal.train.ft.supervisor`: starting this node's groups and restarting each that fails,
  beside a supervised lighthouse (:mod:`~shoal.train.ft.lighthouse`; its process
  :mod:`~shoal.train.ft.lighthouse_main`; one for groups another program starts:
  :mod:`~shoal.train.ft.serve_lighthouse`);
- :mod:`~shoal.train.ft.watch`: the supervisor's watch over its groups (deaths, hangs, stragglers);
- :mod:`~shoal.train.ft.loop`: one group's training loop, in the group's process;
- :mod:`~shoal.train.ft.events`: ``RUN_DIR/replicas.jsonl``, written by the groups and the watch,
  read torch-free by ``shoal status``.

Satellites, each where the layer that needs it sits (the core does not know this room):

- ``shoal.distributed.fault_tolerance``: :class:`Replicas` (torchft's manager, the comm hook that
  drops a failed step and frees the other groups, the average across groups of several), behind
  ``Context.replicas`` for a user's own loop;
- ``shoal.env.replica``: a group's coordinates from its environment, the lighthouse's settings;
- ``shoal.jobs.slurm_fault_tolerance`` and ``shoal.jobs.kubernetes.fault_tolerance``: the
  renderers of a fault-tolerant job for Slurm and Kubernetes;
- ``shoal.doctor.lighthouse``: the doctor's row for a lighthouse.

Nothing here is imported at ``import shoal.train.ft``: ``shoal status`` reads the events torch-free.
"""
