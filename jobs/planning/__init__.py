"""From what a user asks to what a backend launches: the request and its validation against a
profile (request), the plan of jobs a chain becomes (plan), the one reader of the training
engine's flags (engine_args) and the requeue progress guard (requeue). Pure: no scheduler is
asked, nothing is written."""
