"""``python -m preproc <dataset> <stage> [flags]`` (see preproc.cli)."""
import sys

from preproc.cli import main

sys.exit(main())
