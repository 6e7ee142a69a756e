"""The hosts target: a job on a list of hosts, started from one of them (the head node).

- :mod:`.options`: :class:`~.options.HostsOptions` (hosts and slots, a hostfile, mpirun's -np, the
  rsh agent), :class:`~.options.Here` (the launching machine), host list and hostfile parsing;
- :mod:`.render`: pure renderers: ``mpirun`` (:func:`~.render.render_mpirun`), the per-node
  ``shoal run`` lines of a by-hand launch (:func:`~.render.render_manual`) and their SSH wrapping
  (:func:`~.render.render_ssh`);
- :mod:`.reach`: before anything starts, check that every host takes a password-less login;
- :mod:`.processes`: run what was rendered (mpirun, one launcher per host over SSH) and stop it;
- :mod:`.rank_status`: the wrapper that reports each mpirun rank's exit status.

This package imports none of its modules: ``python -m shoal.jobs.hosts.rank_status`` runs on
every rank and loads only what it needs.
"""
