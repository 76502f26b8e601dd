"""Reading back what recsys/monitoring/tensorboard.py writes, with TensorBoard's own loader and the XSpace proto
that ships with TensorFlow (tests/recsys/test_tensorboard.py, test_step_breakdown.py)."""
from __future__ import annotations

import glob
import os


def accumulator(path):
    """TensorBoard's EventAccumulator over one run directory, every event kept, orphans purged."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    acc = EventAccumulator(str(path), size_guidance={"scalars": 0})     # 0: keep every event
    acc.Reload()
    return acc


def series(acc, tag):
    return [(e.step, e.value) for e in acc.Scalars(tag)]


def traces(run_dir):
    return sorted(glob.glob(os.path.join(str(run_dir), "plugins", "profile", "*", "*.xplane.pb")))


def markers(xplane_path):
    """Step numbers of the ``train`` step markers in a trace, and the names of its planes."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2
    space = xplane_pb2.XSpace()
    with open(xplane_path, "rb") as handle:
        space.ParseFromString(handle.read())
    steps = []
    for plane in space.planes:
        names = {k: m.name for k, m in plane.event_metadata.items()}
        stats = {k: m.name for k, m in plane.stat_metadata.items()}
        for line in plane.lines:
            for event in line.events:
                if names.get(event.metadata_id) == "train":
                    steps += [s.int64_value for s in event.stats if stats.get(s.metadata_id) == "step_num"]
    return sorted(steps), [p.name for p in space.planes]
