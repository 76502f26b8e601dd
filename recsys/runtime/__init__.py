"""The machine a rank runs on: the Python and platform check, the TensorFlow version check, the
GPUs a rank expects and sees, and the Horovod world the ranks form.

``platforms`` is standard library only and ``tfcompat`` and ``devices`` import no TensorFlow, so
``python -m recsys.runtime.tfcompat`` and ``python -m recsys.runtime.devices`` run on a node before
(or without) TensorFlow; ``distributed`` wraps Horovod, or a one-rank stand-in without it.
"""
