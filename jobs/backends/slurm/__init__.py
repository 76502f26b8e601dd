"""The Slurm backend: sbatch scripts (script), the client commands with their retries (commands),
the squeue/sacct/scontrol queries and their parsers (queries), Slurm's states mapped onto the
toolkit's (states), the one-call status poll (poll) and the Backend itself (backend)."""
