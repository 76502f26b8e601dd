"""Which TensorFlow and Keras this process will run on, decided before TensorFlow is imported.

The engine is written against Keras 2 as ``tf.keras``. That holds by default on TensorFlow
2.12 to 2.15; from 2.16 on ``tf.keras`` is Keras 3 unless the tf-keras package (Keras 2) is
installed *and* ``TF_USE_LEGACY_KERAS`` is true when ``tensorflow`` is first imported
(tensorflow/__init__.py reads it once, to pick the package behind ``tf.keras``).

:func:`decide` is the pure rule, from the installed versions and the environment
(``python -m recsys.runtime.tfcompat`` prints it for this Python, for checking a container);
:func:`prepare` applies it to this process (``recsys.train.run`` calls it before its first
TensorFlow import): it sets or unsets ``TF_USE_LEGACY_KERAS``, returns the one-line notes to
log, or raises :class:`~recsys.errors.EngineError` (one line, exit 2) naming the version
found and the pip command that fixes it. Versions are read from the installed distributions'
metadata (``importlib.metadata``) and ``importlib.util.find_spec``: nothing is imported.
docs/engine.md, "Supported TensorFlow versions".
"""
from __future__ import annotations

import dataclasses
import importlib.metadata
import importlib.util
import os
import re
from typing import Mapping, Optional, Tuple

from recsys.errors import EngineError

# The TensorFlow releases the engine runs on (tests/compat/run.sh checks both ends).
OLDEST = (2, 12)
NEWEST = (2, 20)
# The TensorFlow install/constraints.txt pins for the [train] extra (the fix offered for a version outside the range).
PINNED = "2.15.1"
LEGACY_ENV = "TF_USE_LEGACY_KERAS"
# Set to 1 to run on a TensorFlow outside OLDEST..NEWEST anyway (one warning instead of a refusal).
ALLOW_ENV = "RECSYS_ALLOW_UNSUPPORTED_TF"
# Distributions that install the ``tensorflow`` package, in the order they are looked up.
TF_DISTRIBUTIONS = ("tensorflow", "tensorflow-cpu", "tensorflow-gpu", "tf-nightly", "tf-nightly-cpu",
                    "tensorflow-intel", "tensorflow-macos", "tensorflow-aarch64", "intel-tensorflow")
# What TensorFlow's own check accepts as true (tensorflow/__init__.py, python/util/lazy_loader.py).
_TRUE = ("true", "True", "1")


@dataclasses.dataclass(frozen=True)
class Installed:
    """What is installed, as read without importing it. None: not installed."""
    tensorflow: Optional[str]                 # "": importable, version unknown
    keras: Optional[str]
    tf_keras: Optional[str]
    distribution: str = "tensorflow-cpu"      # the distribution that provides ``tensorflow``
    others: Tuple[str, ...] = ()              # further TensorFlow distributions installed ("name version")


@dataclasses.dataclass(frozen=True)
class Decision:
    """``error`` set: refuse with that line. Else ``env``: variables to set (a value) or unset
    (None) before ``import tensorflow``; ``notes``: one line each for the log; ``keras``: what
    ``tf.keras`` will be ("keras 2.15.0", "tf-keras 2.17.0")."""
    error: Optional[str] = None
    env: Mapping[str, Optional[str]] = dataclasses.field(default_factory=dict)
    notes: Tuple[str, ...] = ()
    keras: Optional[str] = None

    @property
    def ok(self) -> bool:
        return self.error is None


def minor(version: Optional[str]) -> Optional[Tuple[int, int]]:
    """'2.17.1' / '2.16.0rc0' / '2.14.0+nv23.12' / '2.17.0.dev20240501' -> (2, 17); None if unreadable."""
    match = re.match(r"\s*v?(\d+)\.(\d+)", version or "")
    return (int(match.group(1)), int(match.group(2))) if match else None


def _fmt(mm) -> str:
    return f"{mm[0]}.{mm[1]}"


def _pip_name(distribution: str) -> str:
    """The distribution to reinstall: a nightly's stable counterpart, else the one installed."""
    return {"tf-nightly": "tensorflow", "tf-nightly-cpu": "tensorflow-cpu"}.get(distribution, distribution)


def decide(found: Installed, env: Mapping[str, str]) -> Decision:
    """The rule (pure): run as is, run with TF_USE_LEGACY_KERAS set or unset, or refuse."""
    tf_mm = minor(found.tensorflow)
    dist = _pip_name(found.distribution)
    if found.tensorflow is None:
        return Decision(error=f"TensorFlow is not installed in this Python environment: "
                              f"pip install tensorflow-cpu=={PINNED} (or the [train] extra of recsys-submit)")
    if found.tensorflow == "":
        return Decision(notes=(f"TensorFlow's version could not be read (no package metadata): not checked; "
                               f"the engine supports {_fmt(OLDEST)} to {_fmt(NEWEST)} with Keras 2",))
    if tf_mm is None:
        return Decision(error=f"cannot read the version of the installed TensorFlow ({found.tensorflow!r}): "
                              f"pip install --force-reinstall {dist}=={PINNED}")
    notes = []
    if found.others:
        notes.append(f"more than one TensorFlow distribution is installed ({found.distribution} "
                     f"{found.tensorflow}, {', '.join(found.others)}): they share one tensorflow/ directory; "
                     f"keep one (pip uninstall both, then pip install {dist}=={found.tensorflow})")
    supported = f"{_fmt(OLDEST)} to {_fmt(NEWEST)}"
    if not OLDEST <= tf_mm <= NEWEST:
        if env.get(ALLOW_ENV, "") not in _TRUE:
            older = tf_mm < OLDEST
            return Decision(error=f"TensorFlow {found.tensorflow} is {'older' if older else 'newer'} than the "
                                  f"engine supports ({supported}): pip install {dist}=={PINNED}"
                                  f"{'' if older else f' (or set {ALLOW_ENV}=1 to try it anyway)'}")
        notes.append(f"TensorFlow {found.tensorflow} is outside the supported {supported}; "
                     f"running anyway because {ALLOW_ENV} is set")
    legacy_set = env.get(LEGACY_ENV)
    if tf_mm < (2, 16):
        # tf.keras is the keras package (Keras 2) of the same release. TF_USE_LEGACY_KERAS would
        # route it to tf_keras instead: without tf_keras installed, TF 2.15 then fails on
        # the first tf.keras access with "ImportError: Keras cannot be imported"
        # (tensorflow/python/util/lazy_loader.py, KerasLazyLoader._initialize).
        env_change = {}
        if legacy_set is not None:
            env_change[LEGACY_ENV] = None
            notes.append(f"{LEGACY_ENV}={legacy_set} unset for this run: TensorFlow {found.tensorflow}'s "
                         f"tf.keras is Keras 2 (keras {found.keras}) already")
        k_mm = minor(found.keras)
        if k_mm is None or k_mm[0] != 2:
            what = f"Keras {found.keras}" if found.keras else "no keras package"
            return Decision(error=f"TensorFlow {found.tensorflow} finds {what} for tf.keras; the engine needs "
                                  f"Keras 2: pip install 'keras=={_fmt(tf_mm)}.*'")
        return Decision(env=env_change, notes=tuple(notes), keras=f"keras {found.keras}")
    # TensorFlow >= 2.16: Keras 2 only through tf-keras, of the same minor release.
    fix = f"pip install --no-deps 'tf-keras=={_fmt(tf_mm)}.*'"
    if found.tf_keras is None:
        what = f"Keras {found.keras}" if found.keras else "no Keras 2"
        return Decision(error=f"TensorFlow {found.tensorflow} comes with {what} as tf.keras and tf-keras is not "
                              f"installed; the engine needs Keras 2: {fix}")
    if minor(found.tf_keras) != tf_mm:
        return Decision(error=f"tf-keras {found.tf_keras} does not match TensorFlow {found.tensorflow}: {fix}")
    if legacy_set is not None and legacy_set not in _TRUE:
        notes.append(f"{LEGACY_ENV}={legacy_set} replaced by 1: the engine needs tf-keras (Keras 2) "
                     f"as tf.keras")
    return Decision(env={LEGACY_ENV: "1"}, notes=tuple(notes), keras=f"tf-keras {found.tf_keras}")


def _version(*names) -> Optional[str]:
    for name in names:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def _importable(module) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def detect() -> Installed:
    """The installed TensorFlow, keras and tf_keras, read from metadata without importing them.
    A distribution counts only when its package is importable (metadata can outlive files)."""
    importable = _importable("tensorflow")
    names = list(TF_DISTRIBUTIONS)
    if importable and hasattr(importlib.metadata, "packages_distributions"):     # Python >= 3.10
        names += [n for n in importlib.metadata.packages_distributions().get("tensorflow", []) if n not in names]
    tf_found = [(name, _version(name)) for name in names] if importable else []
    tf_found = [(name, version) for name, version in tf_found if version]
    # importable without any metadata (a build from source): "" = version unknown
    first = tf_found[0] if tf_found else ("tensorflow", "" if importable else None)
    return Installed(
        tensorflow=first[1],
        keras=_version("keras") if _importable("keras") else None,
        tf_keras=(_version("tf-keras", "tf_keras") or "unknown") if _importable("tf_keras") else None,
        distribution=first[0],
        others=tuple(f"{name} {version}" for name, version in tf_found[1:]))


def prepare(environ=None) -> Tuple[str, ...]:
    """Apply :func:`decide` to this process before TensorFlow is imported: set or unset the
    environment it needs, return its notes; raise EngineError (exit 2) when it refuses."""
    environ = os.environ if environ is None else environ
    decision = decide(detect(), environ)
    if not decision.ok:
        raise EngineError(decision.error)
    for name, value in decision.env.items():
        if value is None:
            environ.pop(name, None)
        else:
            environ[name] = value
    return decision.notes


def describe(found: Installed, decision: Decision) -> str:
    """One line: what this environment would run on, or why not."""
    if not decision.ok:
        return f"recsys-train: error: {decision.error}"
    if decision.keras is None:                 # version unknown: not checked
        return "; ".join(decision.notes)
    line = f"TensorFlow {found.tensorflow} ({found.distribution}), tf.keras = {decision.keras}: supported"
    if decision.env.get(LEGACY_ENV):
        line += f" (recsys-train sets {LEGACY_ENV}=1 itself)"
    return "; ".join([line, *decision.notes])


def main() -> int:
    """``python -m recsys.runtime.tfcompat``: would recsys-train run on this Python's TensorFlow? (exit 0 / 2)"""
    found = detect()
    decision = decide(found, os.environ)
    print(describe(found, decision))
    return 0 if decision.ok else EngineError.exit_code


if __name__ == "__main__":
    raise SystemExit(main())
