"""Scaling studies: a spec expanded into points (spec), its directory and the life of its points
(run), and the scaling table and plot (report); above them the comparison of studies (compare),
their history in the runs dir (history) and the node screen (screen). Built on jobs.submit and
jobs.status, like any program using the submission layer."""
