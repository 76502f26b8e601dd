"""The local backend (`--profile local`, scheduler: local): the same plan, no Slurm. submitit's
LocalExecutor starts the jobs (launch), their submitit records are read back as toolkit states
(states), and LocalBackend (backend) is the Backend that ties them together."""
