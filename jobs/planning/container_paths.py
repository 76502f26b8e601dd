"""A container job's paths, checked on the login node before anything is submitted.

With a container profile the paths a job is given are container paths (jobs.profiles.mounts).
Here they are refused when no mount covers them (the job could not see them), when a job would
write under a read-only mount, or when the image declares (``container.provides``) that it lacks
the engine the job needs; and they are translated to host paths for whatever the login node or
the batch host looks at (the engine's existence checks, the requeue guard, the lead-time
warning). Without a container every path is its own host path and nothing here refuses.
"""

import os

from jobs.errors import RequestError
from jobs.profiles import mounts
from slurm import sparkrapids

from .argv import RunPath
from .engine_args import PATH_FLAGS, flag_value

# the engine flags a job writes to (the others it reads)
WRITTEN_FLAGS = ("--checkpoint-dir", "--log-path", "--predictions")


def host_path(profile, path, what):
    """The host path of a job's `path` (RunPaths, under the run dir, stay as they are);
    RequestError naming `what` when no mount of the container covers it."""
    if path is None or isinstance(path, RunPath) or profile.container is None:
        return path
    host = mounts.to_host(profile, str(path))
    if host is None:
        raise RequestError(f"{what} {path}: not inside the container of profile {profile.name} (no mount covers "
                           f"it; mounts: {mounts.describe(profile)}): give a path under a mount")
    return host


def _writable(profile, path, what):
    if profile.container is None or path is None or isinstance(path, RunPath):
        return
    mount = mounts.mount_of(profile, str(path))
    if mount is not None and mount.read_only:
        raise RequestError(f"{what} {path}: under the read-only mount {mount.host}:{mount.container}:ro of "
                           f"profile {profile.name}: the job cannot write there")


def host_argv(profile, argv, flags=PATH_FLAGS):
    """The argv with the values of the path `flags` translated to host paths (for checks on the
    host); a path no mount covers, or a written one under a read-only mount, is refused."""
    if profile.container is None:
        return list(argv)
    out, args = [], list(argv)
    for index, arg in enumerate(args):
        text = str(arg)
        if index and str(args[index - 1]) in flags:
            flag = str(args[index - 1])
            if flag in WRITTEN_FLAGS:
                _writable(profile, arg, flag)
            out.append(host_path(profile, arg, flag))
        elif "=" in text and text.split("=", 1)[0] in flags and not isinstance(arg, RunPath):
            flag, value = text.split("=", 1)
            if flag in WRITTEN_FLAGS:
                _writable(profile, value, flag)
            out.append(f"{flag}={host_path(profile, value, flag)}")
        else:
            out.append(arg)
    return out


def in_container_words(message, argv, host_args):
    """An engine check's line about host paths, told with the container paths the user gave:
    `--data-path /data/x (host path /lustre/x): ...`."""
    for given, host in zip(map(str, argv), map(str, host_args)):
        if given != host and host in message:
            message = message.replace(host, f"{given} (host path {host})", 1)
    return message


def _needs(profile, words, what):
    """Refuse a job whose image declares its contents without `words` (undeclared: unknown)."""
    provides = profile.container.provides if profile.container is not None else None
    if provides is None:
        return
    missing = [w for w in words if w not in provides]
    if missing:
        raise RequestError(f"{what}: the image of profile {profile.name} ({profile.container.image}) holds "
                           f"{', '.join(provides) or 'nothing declared'}, not {', '.join(missing)} "
                           "(container.provides): use a profile whose image has it (docs/dgx.md)")


def check_training(res):
    """A training/evaluation/benchmark job's image holds TensorFlow (and Horovod for several ranks)."""
    if res.engine == "recsys":
        _needs(res.profile, ["tensorflow"] + (["horovod"] if res.ranks > 1 else []),
               f"recsys-submit {res.request.kind}")


def _check_rapids_pair(profile, req, stage_args):
    """A --rapids-jar whose Spark versions (its Maven name's release, slurm/sparkrapids.py) do not
    include the job's Spark is refused in one line: the image's pair (a container that provides
    spark is the recipe's image), else this environment's pyspark (issue 47, item 5)."""
    jar = flag_value(stage_args, "--rapids-jar")
    if not jar or req.preprocess_engine != "spark":
        return
    if profile.container is not None:
        spark = sparkrapids.IMAGE_SPARK if "spark" in (profile.container.provides or []) else None
    else:
        spark = sparkrapids.installed_pyspark()
    line = sparkrapids.refusal(jar, spark) if spark else None
    if line:
        raise RequestError(line)


def check_preprocess(res, stage_args):
    """A preprocessing job's container paths: --input and --config visible, --output visible and
    writable, a --rapids-jar under a mount unless the image declares RAPIDS (its own jar), and an
    image that holds the engine. Pure: looks at no file (a script may be for another machine)."""
    profile, req = res.profile, res.request
    _check_rapids_pair(profile, req, stage_args)
    if profile.container is None:
        return
    _needs(profile, ["spark"] if req.preprocess_engine == "spark" else ["nvtabular"],
           f"recsys-submit preprocess --engine {req.preprocess_engine}")
    host_path(profile, os.path.abspath(req.input), "--input")
    host_path(profile, os.path.abspath(req.output), "--output")
    _writable(profile, os.path.abspath(req.output), "--output")
    config = flag_value(stage_args, "--config")
    if config:
        host_path(profile, config, "--config")
    jar = flag_value(stage_args, "--rapids-jar")
    if jar:
        provides = profile.container.provides or []
        if mounts.mount_of(profile, os.path.abspath(jar)) is None and "rapids" not in provides:
            raise RequestError(f"--rapids-jar {jar}: not inside the container of profile {profile.name} (no mount "
                               f"covers it; mounts: {mounts.describe(profile)}) and its image does not declare "
                               "rapids (container.provides): mount the jar's directory or use an image with it")


def is_image_file(image: str) -> bool:
    """A squashfs (or other enroot image file) path, as pyxis reads it, not a registry reference."""
    return image.startswith(("/", "./"))


def check_image_file(profile) -> None:
    """A profile's image file must be on this login node when a job is submitted: the login node
    and the compute nodes share the file system the site imports images to, and a missing file
    would fail every node's container start after the job waited in the queue."""
    container = profile.container
    if container is None or not is_image_file(container.image):
        return
    path = os.path.abspath(container.image)
    if not os.path.isfile(path):
        why = "not a file" if os.path.exists(path) else "no such file"
        raise RequestError(f"container.image {container.image} of profile {profile.name}: {why} on this host: "
                           "import the image there first (`enroot import -o FILE docker://REGISTRY#IMAGE`, "
                           "docs/dgx.md)")


def registry_image_warning(spec, profile):
    """One line when a multinode job's container image is a registry reference: pyxis then imports
    it on every node of every job (an NGC image is about 10 GB; the registry's credentials must be on
    the compute nodes). Sites import it once to a squashfs file on the shared file system and name
    that file; the line gives the `enroot import` command for this image."""
    container = profile.container
    if container is None or spec.nodes <= 1 or is_image_file(container.image):
        return None
    image = container.image.split("://", 1)[-1]
    first, _, rest = image.partition("/")
    # enroot's docker URI puts a registry host (a name with a dot or a port) before a '#'
    source = f"docker://{first}#{rest}" if rest and ("." in first or ":" in first) else f"docker://{image}"
    name = image.rsplit("/", 1)[-1].replace(":", "+")
    return (f"job {spec.key}: each of its {spec.nodes} nodes imports the registry image {container.image} "
            f"(about 10 GB for an NGC image; the registry's credentials on every node); import it once to the "
            f"shared file system, `enroot import -o /shared/images/{name}.sqsh {source}`, and name that file "
            f"as the profile's container.image")
