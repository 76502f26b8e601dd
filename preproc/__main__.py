"""``python -m preproc <dataset> <stage> [flags]`` (see preproc.cli); on an install without the
[preproc] extra, one line naming it (preproc.entry)."""
from preproc.entry import main

main()
