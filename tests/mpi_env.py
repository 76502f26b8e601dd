"""Open MPI's settings for ranks on this one host, shared by every test that starts ranks
(mpirun directly, or srun --mpi=pmix on the emulated nodes)."""
from __future__ import annotations

MPI_ENV = {
    # TCP over loopback only; root allowed (mpirun needs --allow-run-as-root too)
    "OMPI_MCA_btl": "self,tcp",
    "OMPI_MCA_btl_tcp_if_include": "lo",
    "OMPI_MCA_oob_tcp_if_include": "lo",
    "OMPI_ALLOW_RUN_AS_ROOT": "1",
    "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
    # PMIx's plain hash-table data store (the root fixtures' setting since the first cluster tests;
    # mpirun-only runs do not read it)
    "PMIX_MCA_gds": "hash",
    # the ranks share 2 cores (with each other, their TensorFlow threads, the other runs of a test):
    # a waiting rank yields instead of spinning. Measured, a 2-rank Wide & Deep run (restore test
    # flags), 3 interleaved pairs of two runs side by side: 93 / 72 / 36 s spinning, 46 / 30 / 29 s
    # yielding; system CPU 12-19 s a run against 2-4 s. `--oversubscribe` alone does not set it.
    "OMPI_MCA_mpi_yield_when_idle": "1",
}
