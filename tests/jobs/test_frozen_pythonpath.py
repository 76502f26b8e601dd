"""A study point runs its frozen copy with the job's PYTHONPATH kept behind it (issue 47, item 11):
the copy was exported as the whole PYTHONPATH, dropping a profile's or a module's entries (and, in
a container, the image's, since the name went into --container-env). The script's export lines are
run by bash; the local backend's environment is checked the same way."""
import os
import re
import subprocess

import pytest

from jobs.backends.local.launch import job_env as local_env
from jobs.backends.slurm.script import container_flags
from jobs.planning.plan import plan
from jobs.profiles import load_profile
from jobs.schedulers import backend_for
from jobs.study.running import run
from jobs.study.spec import StudySpec, expand

pytestmark = [pytest.mark.fast, pytest.mark.usefixtures("isolated_profile_search_path")]


def _point_specs(profile, code):
    spec = StudySpec.from_dict(dict(name="f", model="ncf", batch_size=512, steps=2, warmup_steps=1, gpus=[1]))
    _, specs = plan([run.point_request(expand(spec, profile)[0], spec, profile, code)], profile)
    return specs


def test_the_frozen_copy_goes_in_front_of_the_jobs_pythonpath(tmp_path):
    site = tmp_path / "site.yaml"
    site.write_text("extends: ci\nenv:\n  PYTHONPATH: /site/lib\n")
    profile = load_profile(str(site))
    code = {"dir": str(tmp_path / "code" / "abc"), "sha256": "abc"}
    specs = _point_specs(profile, code)
    text = backend_for(profile).dry_run(specs, str(tmp_path / "run"), check=False).text()
    exports = [line for line in text.splitlines() if re.match(r"export PYTHONPATH=", line)]
    out = subprocess.run(["bash", "-c", "\n".join(exports) + '\nprintf %s "$PYTHONPATH"'], capture_output=True,
                         text=True, env={"PATH": os.environ["PATH"], "PYTHONPATH": "/module/lib"}, timeout=30)
    assert out.stdout == f"{code['dir']}:/site/lib"          # the profile's value kept, the copy first
    out = subprocess.run(["bash", "-c", exports[-1] + '\nprintf %s "$PYTHONPATH"'], capture_output=True,
                         text=True, env={"PATH": os.environ["PATH"], "PYTHONPATH": "/module/lib"}, timeout=30)
    assert out.stdout == f"{code['dir']}:/module/lib"        # a module's value kept
    env = local_env(specs[0], str(tmp_path / "run"))
    assert env["PYTHONPATH"] == f"{code['dir']}{os.pathsep}/site/lib"


def test_in_a_container_the_images_pythonpath_is_not_replaced(tmp_path):
    profile = load_profile("dgxa100-pod")
    code = {"dir": str(tmp_path / "code" / "abc"), "sha256": "abc"}
    spec = _point_specs(profile, code)[0]
    flags = " ".join(container_flags(spec, str(tmp_path / "run")))
    names = re.search(r"--container-env=(\S+?)'?(\s|$)", flags)
    assert names is None or "PYTHONPATH" not in names.group(1).split(",")
