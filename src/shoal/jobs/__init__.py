"""Pure renderers: one :class:`~shoal.launch.spec.JobSpec` in, a launcher's command, script or object out.

- :mod:`.hosts`: ``mpirun`` (:func:`render_mpirun`), the per-node ``shoal run`` lines of a by-hand
  launch (:func:`render_manual`) and their SSH wrapping (:func:`render_ssh`);
- :mod:`.sbatch`: an sbatch script (:func:`render_sbatch`);
- :mod:`.pytorchjob`, :mod:`.trainjob`, :mod:`.mpijob`: Kubeflow's PyTorchJob (training-operator
  v1), TrainJob (Trainer v2) and MPIJob (MPI operator v2beta1), sharing the pod of :mod:`.pod`;
- :mod:`.runai`: the Run:ai CLI's submit command, for each CLI generation;
- :mod:`.image`: a Dockerfile and a .dockerignore for the job's container image.

No function here reads the environment, the clock or the file system: what they depend on is in
their arguments, so ``--dry-run`` shows exactly what runs and golden files pin it
(``tests/launch/golden/``).
"""

from shoal.launch.render.hosts import MPIRUN_FLAGS, render_manual, render_mpirun, render_ssh
from shoal.launch.render.sbatch import SBATCH_MARKER, render_sbatch

__all__ = ["MPIRUN_FLAGS", "SBATCH_MARKER", "render_manual", "render_mpirun", "render_sbatch", "render_ssh"]
