"""Graph functions traced as written, without AutoGraph.

AutoGraph rewrites a traced function, and every function and Keras layer it calls, from source
(parse, convert, compile) in every process: about a fifth of a small run's time on a CPU rank
(docs/benchmarks.md, "What an engine process costs"). The engine's step, prediction, guard and
input functions have no control flow on tensors (they branch with tf.cond), so they need none of
it. ``tf.function(autograph=False)`` alone is not enough: Keras still converts each layer's
``call`` unless the conversion status is disabled, which ``do_not_convert`` sets.
"""
from __future__ import annotations

from typing import Any, Callable


def as_written(fn: Callable) -> Callable:
    """``fn`` with AutoGraph disabled for it and everything it calls (layers included)."""
    import tensorflow as tf
    return tf.autograph.experimental.do_not_convert(fn)


def graph_function(fn: Callable, **options: Any) -> Callable:
    """``tf.function(fn, **options)`` traced as written (no AutoGraph pass, here or below)."""
    import tensorflow as tf
    return tf.function(as_written(fn), autograph=False, **options)
