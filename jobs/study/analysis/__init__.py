"""Analysing a study: the report (report, with report_facts, report_table, report_figure and
breakdown), studies compared (compare), the runs dir's history (history), the projection to
larger sizes (projection*), NVIDIA's published results (published), all drawn through plots. Reads
what jobs.study.running wrote, through its record module."""
