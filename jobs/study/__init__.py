"""Scaling studies: a spec expanded into points (spec); running a study, its directory and the life
of its points (running); analysing one: the scaling table and plots, the comparison of studies,
their history and the projection (analysis), which reads what running wrote, never the reverse;
what both show of a point's measurements (measures). Built on jobs.submit and jobs.status, like
any program using the submission layer."""
