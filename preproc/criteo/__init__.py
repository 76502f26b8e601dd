"""Criteo 1TB click logs -> DLRM split-binary dataset (NVIDIA's reference semantics, docs/criteo.md).

``cli`` (the stages on the command line) runs the Spark stages ``dictionary``,
``transform`` and ``finalize`` one job each, or chained by ``pipeline``, or the
NVTabular engine ``nvt``. All follow ``layout`` (what the input and output look
like, pure Python); the Spark stages parse day files with ``read``. ``generate``
writes small raw day files.
"""
