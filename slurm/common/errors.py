"""The one base class of every error the toolkit raises on purpose (a bad flag, key, file or
request; a refused submission; bad data), whatever layer raises it: a program that drives
recsys-submit, the engine or the preprocessing catches ``ToolkitError`` and knows the message is
one line meant for a person. Each layer's own classes derive from it (jobs.errors,
jobs.profiles.ProfileError, preproc.errors, recsys.errors, slurm.common.yamlfile.YamlFileError) and keep
their builtin base (ValueError, RuntimeError) for callers that catch those. In the shared leaf,
because every layer imports it and none may import another."""
from __future__ import annotations


class ToolkitError(Exception):
    """An error the toolkit raised on purpose, with a one-line message."""
