"""The process helpers: finding and starting ranks (ranks), the cores and CPU quota a
host gives them (cores), stale shared-memory files (shm_leftovers), ending a job when a
rank fails (faults) and emulating a slow host (slowdown).  The network-path settings of
each MPI family stay in ``asapmpi.launchers``."""
