"""What a checkpoint holds, whatever its layout (replicated, or sharded over ranks): whole tables and
dense weights by name, for tests and tools that compare a model-parallel run with a replicated one."""
from __future__ import annotations

import os

from recsys.checkpoints.atomic import PREFIX
from recsys.checkpoints.pieces import assemble, rank_dir, saved_pieces
from recsys.checkpoints.sharded import is_sharded, read_meta


def checkpoint_weights(path):
    """{name: ndarray} of a checkpoint's model weights, whatever its layout: ``table:<group>/<t>`` is a
    whole table (slices joined), ``dense:<key>`` a dense weight. Lets tests and tools compare a
    model-parallel run with a replicated one."""
    import re

    import numpy as np
    import tensorflow as tf
    sharded = is_sharded(path)
    reader = tf.train.load_checkpoint(os.path.join(rank_dir(path, 0) if sharded else path, PREFIX))
    out = {}
    table_re = re.compile(r"^model/([^/]+)/tables/(\d+)/embeddings/")
    for key in reader.get_variable_to_shape_map():
        if not key.startswith("model/") or "OPTIMIZER_SLOT" in key:
            continue
        m = table_re.match(key)
        if m and not sharded:
            out[f"table:{m.group(1)}/{int(m.group(2))}"] = reader.get_tensor(key)
        elif not m and "/_mp/" not in key and "/de_world" not in key:
            out[f"dense:{key}"] = reader.get_tensor(key)
    if sharded:
        meta = read_meta(path)
        saved = saved_pieces(path, meta)
        for group, info in meta["groups"].items():
            for t, (rows, dim) in enumerate(zip(info["cardinalities"], info["dims"])):
                out[f"table:{group}/{t}"] = assemble(saved.get((group, t, None), []), 0, dim, (rows, dim), np)
    return out


def checkpoint_table_slots(path):
    """{``<group>/<table>/<slot>``: whole array} of the tables' optimizer slots in a sharded checkpoint."""
    import numpy as np
    meta = read_meta(path)
    out = {}
    for (group, t, slot), pieces in saved_pieces(path, meta).items():
        if slot is not None:
            info = meta["groups"][group]
            shape = (info["cardinalities"][t], info["dims"][t])
            out[f"{group}/{t}/{slot}"] = assemble(pieces, 0, shape[1], shape, np)
    return out
