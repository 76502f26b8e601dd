"""Where jobs run: the Backend interface and its dry-run value (base), and one package per
scheduler (slurm, local). The core reaches an implementation only through the scheduler
registry, jobs.schedulers, by name."""
