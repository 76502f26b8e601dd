"""All-or-nothing files: every record and script the submission layer writes goes through here
(temporary name, then rename), so a crash never leaves one half-written."""

import json
import os


def write_json(path, data):
    """Write JSON atomically (temporary name, then rename)."""
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w") as handle:
        json.dump(data, handle, indent=2, sort_keys=False)
        handle.write("\n")
    os.replace(tmp, path)


def write_text(path, text):
    """Write a text file atomically (temporary name, then rename)."""
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w") as handle:
        handle.write(text)
    os.replace(tmp, path)


def read_json(path):
    with open(path) as handle:
        return json.load(handle)
