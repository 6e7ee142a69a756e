"""``shoal doctor``: what is wrong with a node, or a cluster, before a job finds out.

- :mod:`.model`: a check's verdict and a node's report (plain data);
- :mod:`.settings`: what the checks are made against (:class:`DoctorSettings`, the CLI's flags);
- :mod:`.software`, :mod:`.resources`, :mod:`.network`: the checks of one node, by area;
- :mod:`.node`: all of them in order (:func:`node_report`);
- :mod:`.probes`: bounded probes between the nodes of a running job (links, all-reduce, storage);
- :mod:`.cluster`: what every rank does, and rank 0's report; :mod:`.verdicts` judges the measurements;
- :mod:`.report`: the JSON document and its text; :mod:`.schema`: the document's JSON schema;
- :mod:`.run`: which of them a command runs (:func:`doctor`).

Nothing here imports torch at import time: ``shoal doctor --help`` stays light.
"""

from shoal.doctor.run import doctor, one_node
from shoal.doctor.settings import DoctorSettings

__all__ = ["DoctorSettings", "doctor", "one_node"]
