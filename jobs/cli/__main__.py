"""`python -m jobs.cli`: the same as `recsys-submit`."""
import sys

from . import main

sys.exit(main())
