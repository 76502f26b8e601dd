"""A TensorFlow checkpoint's object graph with some variables left out: a sharded checkpoint's table
slices (and their optimizer slots), which each rank writes once, as row-chunked ``.npy`` files.

``tf.train.Checkpoint`` saves every variable it reaches from its root: a model-parallel rank's TF
checkpoint held its table shards a second time beside the files (19.1 GiB on rank 0 for Criteo 1TB
at 8 ranks, twice the disk per save; issue 47 item 9). :func:`without` rebuilds the path from the
root down to each left-out variable with stand-in nodes that list the same children under the same
names, minus those variables; every other node is the object itself. Keys stay what they were (a
dense weight is ``model/.../kernel`` in both), so the same view reads what it wrote, and the slots
of a Keras optimizer (lists indexed by variable: ``optimizer/_variables/N``) keep their indexes.
"""
from __future__ import annotations

from typing import Dict, Iterable

from tensorflow.python.trackable import base as trackable


class _Node(trackable.Trackable):
    """A stand-in for one node of the graph: its children, some left out."""

    def __init__(self, children: Dict[str, object]):
        self._children = children

    def _trackable_children(self, save_type=trackable.SaveType.CHECKPOINT, **kwargs):
        return dict(self._children)

    def _lookup_dependency(self, name, cached_dependencies=None):
        return self._children.get(name)


def _key(obj) -> int:
    """A variable and its mixed-precision wrapper (AutoCastVariable) are one variable."""
    return id(getattr(obj, "_variable", obj))


def without(root, variables: Iterable) -> Dict[str, object]:
    """The children of ``root`` (a ``tf.train.Checkpoint``) for a checkpoint without ``variables``:
    pass them to ``tf.train.Checkpoint(**children)``. Nodes whose subtree holds none of them are the
    objects themselves."""
    import tensorflow as tf

    skip = {_key(v) for v in variables}
    done: Dict[int, object] = {}

    def view(node):
        if id(node) in done:
            return done[id(node)]
        done[id(node)] = node                      # a cycle back to a node being built: the node itself
        kids = node._trackable_children(save_type=trackable.SaveType.CHECKPOINT)
        out, changed = {}, False
        for name, child in kids.items():
            if isinstance(child, tf.Variable):
                if _key(child) in skip:
                    changed = True
                    continue
                out[name] = child
                continue
            out[name] = view(child)
            changed |= out[name] is not child
        done[id(node)] = _Node(out) if changed else node
        return done[id(node)]

    out = {}
    for name, child in root._trackable_children(save_type=trackable.SaveType.CHECKPOINT).items():
        if not isinstance(child, tf.Variable):
            out[name] = view(child)
        elif _key(child) not in skip:
            out[name] = child
    return out
