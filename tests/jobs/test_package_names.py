"""The names the jobs package gives a program, in a fresh interpreter (where nothing else has
been imported first): its submodules are modules, its lazy re-exports are jobs.api's, and the
API's status operations reach the status module. No cluster: the fast tier."""

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.fast

CODE = """
import json, tempfile, types
from jobs import status, submit
import jobs, jobs.api
out = {"status": isinstance(status, types.ModuleType), "submit": isinstance(submit, types.ModuleType),
       "watch": jobs.watch is jobs.api.watch, "render": jobs.render is jobs.api.render}
try:
    jobs.api.watch(tempfile.mkdtemp(), timeout=0)      # not a run: a one-line error, after status loads
except jobs.api.RequestError as exc:
    out["watch_error"] = str(exc)
print(json.dumps(out))
"""


@pytest.mark.parametrize("first", ["", "import jobs.api\n"])
def test_submodules_and_re_exports_do_not_depend_on_import_order(first):
    proc = subprocess.run([sys.executable, "-c", first + CODE], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["status"] and out["submit"] and out["watch"] and out["render"], out
    assert "jobs.json" in out["watch_error"], out
