"""The TensorFlow / Keras version rule (recsys.runtime.tfcompat): what the engine does on each stack.

Pure logic on version strings; the real stacks are run by tests/compat/run.sh (docs/testing.md).
"""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from recsys.runtime import tfcompat
from recsys.runtime.tfcompat import ALLOW_ENV, LEGACY_ENV, Installed, decide

pytestmark = pytest.mark.fast
REPO = Path(__file__).resolve().parents[2]


def found(tf, keras=None, tf_keras=None, dist="tensorflow-cpu", others=()):
    return Installed(tensorflow=tf, keras=keras, tf_keras=tf_keras, distribution=dist, others=others)


@pytest.mark.parametrize("tf,keras", [("2.12.1", "2.12.0"), ("2.13.1", "2.13.1"), ("2.14.1", "2.14.0"),
                                      ("2.15.1", "2.15.0"), ("2.14.0+nv23.12", "2.14.0")])
def test_keras2_releases_run_as_they_are(tf, keras):
    d = decide(found(tf, keras), {})
    assert d.ok and dict(d.env) == {} and d.notes == () and d.keras == f"keras {keras}"


@pytest.mark.parametrize("tf,tf_keras", [("2.16.2", "2.16.0"), ("2.17.1", "2.17.0"), ("2.17.0rc1", "2.17.0")])
def test_newer_releases_use_tf_keras_when_installed(tf, tf_keras):
    d = decide(found(tf, "3.4.1", tf_keras), {})
    assert d.ok and dict(d.env) == {LEGACY_ENV: "1"} and d.notes == ()
    assert d.keras == f"tf-keras {tf_keras}"


def test_a_false_legacy_setting_is_replaced_with_a_note():
    d = decide(found("2.17.1", "3.4.1", "2.17.0"), {LEGACY_ENV: "0"})
    assert d.ok and dict(d.env) == {LEGACY_ENV: "1"}
    assert len(d.notes) == 1 and "TF_USE_LEGACY_KERAS=0 replaced by 1" in d.notes[0]


@pytest.mark.parametrize("tf,keras", [("2.16.2", "3.3.3"), ("2.17.1", "3.4.1"), ("2.17.1", None)])
@pytest.mark.parametrize("env", [{}, {LEGACY_ENV: "1"}])
def test_keras3_without_tf_keras_is_refused_with_the_pip_command(tf, keras, env):
    d = decide(found(tf, keras), env)
    assert not d.ok and "\n" not in d.error
    assert f"TensorFlow {tf} comes with" in d.error
    assert d.error.endswith(f"pip install --no-deps 'tf-keras=={tf[:4]}.*'")


def test_tf_keras_of_another_release_is_refused():
    d = decide(found("2.17.1", "3.4.1", "2.16.0"), {})
    assert d.error == "tf-keras 2.16.0 does not match TensorFlow 2.17.1: pip install --no-deps 'tf-keras==2.17.*'"


@pytest.mark.parametrize("tf", ["2.12.1", "2.15.1"])
@pytest.mark.parametrize("value", ["1", "True", "0"])
def test_legacy_setting_is_unset_on_keras2_releases(tf, value):
    # without tf_keras, TF 2.15 with TF_USE_LEGACY_KERAS=1 fails with "Keras cannot be imported"
    d = decide(found(tf, tf[:4] + ".0"), {LEGACY_ENV: value})
    assert d.ok and dict(d.env) == {LEGACY_ENV: None}
    assert d.notes == (f"{LEGACY_ENV}={value} unset for this run: TensorFlow {tf}'s tf.keras is Keras 2 "
                       f"(keras {tf[:4]}.0) already",)


def test_keras3_installed_next_to_a_keras2_release_is_refused():
    # TF 2.15's lazy loader takes an installed Keras 3 as tf.keras
    d = decide(found("2.15.1", "3.4.1"), {})
    assert d.error == ("TensorFlow 2.15.1 finds Keras 3.4.1 for tf.keras; the engine needs Keras 2: "
                       "pip install 'keras==2.15.*'")


@pytest.mark.parametrize("tf,dist,word,tail", [
    ("2.11.1", "tensorflow-cpu", "older", ""),
    ("2.21.0", "tensorflow", "newer", f" (or set {ALLOW_ENV}=1 to try it anyway)"),
    ("2.22.0.dev20260101", "tf-nightly", "newer", f" (or set {ALLOW_ENV}=1 to try it anyway)"),
])
def test_versions_outside_the_range_are_refused(tf, dist, word, tail):
    d = decide(found(tf, "2.11.0" if word == "older" else "3.6.0", "2.21.0", dist=dist), {})
    pip_name = {"tf-nightly": "tensorflow"}.get(dist, dist)
    assert d.error == (f"TensorFlow {tf} is {word} than the engine supports (2.12 to 2.20): "
                       f"pip install {pip_name}==2.15.1{tail}")


def test_a_newer_release_runs_when_allowed():
    d = decide(found("2.21.0", "3.6.0", "2.21.0"), {ALLOW_ENV: "1"})
    assert d.ok and dict(d.env) == {LEGACY_ENV: "1"}
    assert d.notes == (f"TensorFlow 2.21.0 is outside the supported 2.12 to 2.20; running anyway because "
                       f"{ALLOW_ENV} is set",)


@pytest.mark.parametrize("tf,needle", [(None, "TensorFlow is not installed"), ("banana", "cannot read the version")])
def test_missing_or_unreadable_tensorflow(tf, needle):
    d = decide(found(tf, "2.15.0"), {})
    assert needle in d.error and "pip install" in d.error


def test_two_tensorflow_distributions_are_noted():
    d = decide(found("2.17.1", "3.4.1", "2.17.0", others=("tensorflow 2.17.1",)), {})
    assert d.ok and len(d.notes) == 1 and "tensorflow-cpu 2.17.1, tensorflow 2.17.1" in d.notes[0]


@pytest.mark.parametrize("text,expected", [("2.17.1", (2, 17)), ("2.14.0+nv23.12", (2, 14)),
                                           ("2.16.0rc0", (2, 16)), ("", None), (None, None), ("x", None)])
def test_minor(text, expected):
    assert tfcompat.minor(text) == expected


def test_prepare_sets_and_unsets_the_environment(monkeypatch):
    env = {LEGACY_ENV: "1"}
    monkeypatch.setattr(tfcompat, "detect", lambda: found("2.15.1", "2.15.0"))
    assert len(tfcompat.prepare(env)) == 1 and LEGACY_ENV not in env
    monkeypatch.setattr(tfcompat, "detect", lambda: found("2.17.1", "3.4.1", "2.17.0"))
    assert tfcompat.prepare(env) == () and env[LEGACY_ENV] == "1"
    monkeypatch.setattr(tfcompat, "detect", lambda: found("2.17.1", "3.4.1"))
    with pytest.raises(tfcompat.EngineError) as err:
        tfcompat.prepare(env)
    assert err.value.exit_code == 2


def test_detect_reads_this_environment_without_importing_tensorflow():
    code = ("import sys; from recsys.runtime import tfcompat; f = tfcompat.detect(); "
            "assert not {'tensorflow', 'keras', 'tf_keras'} & set(sys.modules), sorted(sys.modules); print(f)")
    res = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    from importlib.metadata import version
    try:
        tf = version("tensorflow-cpu")
    except Exception:
        pytest.skip("no tensorflow-cpu in this venv")
    assert f"tensorflow='{tf}'" in res.stdout


def test_train_refuses_in_one_line_before_importing_tensorflow(tmp_path):
    # recsys-train on a Keras 3 stack without tf-keras: one line, exit 2, TensorFlow never imported
    code = ("import sys; from recsys import train\nfrom recsys.runtime import tfcompat\n"
            "tfcompat.detect = lambda: tfcompat.Installed('2.17.1', '3.4.1', None)\n"
            "try:\n    train.main(sys.argv[1:])\n"
            "finally:\n    assert 'tensorflow' not in sys.modules\n")
    res = subprocess.run([sys.executable, "-c", code, "--model", "ncf", "--synthetic",
                          "--checkpoint-dir", str(tmp_path / "ck")], cwd=REPO, capture_output=True, text=True,
                         timeout=60, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert res.returncode == 2, res.stderr
    assert res.stderr.strip().splitlines() == [
        "recsys-train: error: TensorFlow 2.17.1 comes with Keras 3.4.1 as tf.keras and tf-keras is not installed; "
        "the engine needs Keras 2: pip install --no-deps 'tf-keras==2.17.*'"]


def test_module_command_says_whether_this_python_is_supported(monkeypatch, capsys):
    monkeypatch.setattr(tfcompat, "detect", lambda: found("2.17.1", "3.4.1", "2.17.0"))
    assert tfcompat.main() == 0
    assert capsys.readouterr().out == ("TensorFlow 2.17.1 (tensorflow-cpu), tf.keras = tf-keras 2.17.0: supported "
                                       "(recsys-train sets TF_USE_LEGACY_KERAS=1 itself)\n")
    monkeypatch.setattr(tfcompat, "detect", lambda: found("2.17.1", "3.4.1"))
    assert tfcompat.main() == 2
    assert capsys.readouterr().out.startswith("recsys-train: error: TensorFlow 2.17.1 comes with Keras 3.4.1")


def test_a_tensorflow_without_metadata_is_not_checked_but_noted():
    d = decide(found(""), {})
    assert d.ok and dict(d.env) == {} and "could not be read" in d.notes[0]


def test_several_ranks_without_horovod_stop_in_one_line(monkeypatch):
    # no Horovod (TF 2.19 / 2.20 with Horovod 0.28.1 as released): the engine's one line, not a traceback
    from recsys.runtime.distributed import Distributed
    monkeypatch.setitem(sys.modules, "horovod", None)        # import horovod.tensorflow -> ModuleNotFoundError
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "2")
    with pytest.raises(tfcompat.EngineError) as err:
        Distributed(True)
    line = str(err.value)
    assert "\n" not in line and err.value.exit_code == 2
    assert line.startswith("2 ranks need Horovod built against this TensorFlow (")
    assert "ModuleNotFoundError" in line and "up to 2.18 as released" in line and line.endswith("or run one rank")
