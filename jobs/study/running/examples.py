"""The example study specs shipped in the package (jobs/study/running/examples/*.yaml), so the
documented `study run SPEC` works from a pip install as from a checkout
(docs/studies/dlrm-strong.yaml is a link to the packaged copy): `recsys-submit study init NAME`
writes one where the user works."""
from __future__ import annotations

import difflib
import os
from importlib import resources
from typing import Dict, List

from jobs.errors import RequestError
from slurm.common import atomicfile

SUFFIX = ".yaml"


def _folder():
    return resources.files("jobs.study.running") / "examples"


def names() -> List[str]:
    """The shipped examples' names, sorted."""
    return sorted(p.name[:-len(SUFFIX)] for p in _folder().iterdir() if p.name.endswith(SUFFIX))


def text(name: str) -> str:
    """The example spec `name` as shipped; an unknown name is one line naming the known ones."""
    if name not in names():
        close = difflib.get_close_matches(name, names(), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise RequestError(f"study init: no example {name!r}{hint}; examples: {', '.join(names())}")
    return (_folder() / f"{name}{SUFFIX}").read_text(encoding="utf-8")


def descriptions() -> Dict[str, str]:
    """{name: its `description:` line} of every example."""
    out = {}
    for name in names():
        found = [line.split(":", 1)[1].strip() for line in text(name).splitlines() if line.startswith("description:")]
        out[name] = found[0] if found else ""
    return out


def write(name: str, path: str) -> str:
    """Write example `name` to `path` (never over an existing file); the path written."""
    content, tmp = text(name), None
    try:
        tmp = atomicfile.stage(path, content)     # the tree's one temporary scheme (slurm/common/atomicfile.py)
        os.link(tmp, path)          # whole or not at all, and never over a file that appeared meanwhile
    except FileExistsError:
        raise RequestError(f"study init: {path} exists; give another --out or remove it") from None
    except OSError as exc:
        raise RequestError(f"study init: cannot write {path}: {exc.strerror}") from None
    finally:
        if tmp is not None:
            os.unlink(tmp)
    return path
