"""Running a study: its points submitted and polled (run, parallel, record, watch), the study
directory and its frozen code and profile (frozen), all points in one allocation (allocation), the
node screen (screen), the example specs (examples) and the spec's JSON Schema (editor_schema).
Imports nothing of jobs.study.analysis (setup.cfg's jobs-study-sides contract)."""
