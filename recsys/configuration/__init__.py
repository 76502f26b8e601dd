"""The run's configuration, resolved and checked before TensorFlow starts.

* ``flags``: recsys-train's command line (the parser the submission layer also checks with);
* ``train_config``: TrainConfig, the flags resolved against the model's defaults, the data and the
  placement, and every check made on them;
* ``checks``: the small value and path checks TrainConfig makes, each one line naming its flag;
* ``slow``: which flag combinations make a run slow, said before it starts;
* ``predictions``: what ``--run-mode predict`` writes and where it may write it.

Pure Python: nothing here imports TensorFlow, Horovod or Keras.
"""
