"""Which Pythons and machines each engine extra installs on (issue 48 item 3).

setup.cfg's environment markers keep an extra's requirements off a Python or machine its pinned
stack has no wheels for (TensorFlow 2.15 is cp39-cp311 and x86_64 only; pandas 1.5 stops at
cp311), so ``pip install 'recsys-submit[train]'`` there installs no TensorFlow rather than
failing deep in a source build. This module is the same table in words: the engine entry points
(:mod:`recsys.entry`, :mod:`preproc.entry`) use it to refuse in one line, naming what is
supported, when the extra's modules are missing on such a Python or machine
(tests/test_packaging.py holds it equal to setup.cfg's markers).

Standard library only: it runs before anything of the extras is imported.
"""
from __future__ import annotations

import platform
import sys
from typing import NamedTuple, Optional, Sequence, Tuple

Version = Tuple[int, int]


class Support(NamedTuple):
    """An extra's supported Pythons (oldest, newest minor) and Linux machines (``uname -m``)."""
    oldest: Version
    newest: Version
    machines: Tuple[str, ...]


# The engine extras of setup.cfg. [train] and [gpu]: TensorFlow 2.12-2.15 wheels (Keras 2 as tf.keras
# by itself) exist for CPython 3.9-3.11 on x86_64 only; aarch64 nodes run an NGC TensorFlow container.
# [preproc] and [nvtabular]: pandas 1.5 has wheels up to 3.11, for x86_64 and aarch64.
EXTRAS = {
    "train": Support((3, 9), (3, 11), ("x86_64",)),
    "gpu": Support((3, 9), (3, 11), ("x86_64",)),
    "preproc": Support((3, 9), (3, 11), ("x86_64", "aarch64")),
    "nvtabular": Support((3, 9), (3, 11), ("x86_64", "aarch64")),
}
SYSTEM = "Linux"


class Host(NamedTuple):
    """What this interpreter runs on: (major, minor), ``platform.system()``, ``platform.machine()``."""
    python: Version
    system: str
    machine: str


def this_host() -> Host:
    """The running interpreter's Python, system and machine."""
    return Host((sys.version_info[0], sys.version_info[1]), platform.system(), platform.machine())


def supported(extra: str) -> str:
    """'Python 3.9-3.11 on Linux x86_64': what README's table and the refusals say of ``extra``."""
    s = EXTRAS[extra]
    return (f"Python {s.oldest[0]}.{s.oldest[1]}-{s.newest[0]}.{s.newest[1]} on {SYSTEM} "
            f"{' or '.join(s.machines)}")


def outside(extra: str, host: Host) -> Optional[str]:
    """None where ``extra`` installs on ``host``, else what is outside ('Python 3.13', 'Linux aarch64')."""
    s = EXTRAS[extra]
    parts = []
    if not s.oldest <= host.python <= s.newest:
        parts.append(f"Python {host.python[0]}.{host.python[1]}")
    if host.system != SYSTEM or host.machine not in s.machines:
        parts.append(f"{host.system} {host.machine}")
    return " on ".join(parts) or None


def refusal(script: str, extras: Sequence[str], host: Host, remedy: str) -> Optional[str]:
    """The one-line error for ``script`` whose ``extras`` (alternatives with the same support) do
    not install on ``host``, else None. Called only when the extra's modules are missing: an image
    that brings its own TensorFlow (an NGC container on aarch64 or Python 3.12) is not refused."""
    what = outside(extras[0], host)
    if what is None:
        return None
    names = " or ".join(f"[{e}]" for e in extras)
    they = "neither installs" if len(extras) > 1 else "it does not install"
    return (f"{script}: error: no {names} extra in this install, and {they} on {what} "
            f"(supported: {supported(extras[0])}): {remedy}")
