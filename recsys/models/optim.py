"""Learning-rate schedules and optimizer construction (with loss scaling under AMP)."""
from __future__ import annotations

import tensorflow as tf


class WarmupPolyDecay(tf.keras.optimizers.schedules.LearningRateSchedule):
    """Linear warm-up to ``base_lr`` over ``warmup_steps``, constant until ``decay_start_step``,
    then polynomial decay of power ``power`` to ``end_lr`` over ``decay_steps`` (DLRM's schedule;
    with ``decay_steps=0`` it is warm-up then constant, as W&D's deep part uses)."""

    def __init__(self, base_lr, warmup_steps=0, decay_start_step=None, decay_steps=0, power=2.0, end_lr=0.0):
        super().__init__()
        self.base_lr = float(base_lr)
        self.warmup_steps = int(warmup_steps or 0)
        self.decay_start_step = int(decay_start_step if decay_start_step is not None else 0)
        self.decay_steps = int(decay_steps or 0)
        self.power = float(power)
        self.end_lr = float(end_lr)

    def __call__(self, step):
        step = tf.cast(step, tf.float32)
        lr = tf.constant(self.base_lr, tf.float32)
        if self.warmup_steps > 0:
            lr = tf.where(step < self.warmup_steps, self.base_lr * (step + 1.0) / self.warmup_steps, lr)
        if self.decay_steps > 0:
            start = float(max(self.decay_start_step, self.warmup_steps))
            frac = tf.clip_by_value((step - start) / self.decay_steps, 0.0, 1.0)
            decayed = (self.base_lr - self.end_lr) * (1.0 - frac) ** self.power + self.end_lr
            lr = tf.where(step >= start, decayed, lr)
        return lr

    def zero_from_step(self):
        """First step whose learning rate is 0 (the decay ended at end_lr 0), or None if it never is."""
        if self.decay_steps > 0 and self.end_lr == 0:
            return max(self.decay_start_step, self.warmup_steps) + self.decay_steps
        return None

    def get_config(self):
        return dict(base_lr=self.base_lr, warmup_steps=self.warmup_steps,
                    decay_start_step=self.decay_start_step, decay_steps=self.decay_steps,
                    power=self.power, end_lr=self.end_lr)


class SGD(tf.keras.optimizers.SGD):
    """Keras SGD whose plain (momentum 0) form keeps no state and applies sparse gradients sparsely.

    Keras 2.15's SGD allocates a momentum slot the size of every variable even with momentum 0,
    and applies an embedding gradient (IndexedSlices) as ``m = m * 0; m += g; var += m``: a
    second copy of every table plus full-table temporaries and a full-table update each step
    (a replicated rank peaked at about 5x its table bytes). Here momentum 0 means no slot and
    ``var.scatter_sub(lr * g)`` (dense gradients: ``var -= lr * g``, as Keras does); a
    non-zero momentum is Keras's own update.

    At momentum 0 a sparse gradient also skips Keras's deduplication (``tf.unique`` and an
    ``unsorted_segment_sum`` per table before the update): the scatter adds the rows of a
    repeated id one after the other, the same sum (docs/benchmarks.md: on DLRM's 26 tables the
    deduplication was 3.7 ms of a 22 ms step).
    """

    def _deduplicate_sparse_grad(self, grads):
        if self.momentum != 0:
            return super()._deduplicate_sparse_grad(grads)
        return list(grads)

    def build(self, var_list):
        if self.momentum != 0:
            return super().build(var_list)
        tf.keras.optimizers.Optimizer.build(self, var_list)
        if getattr(self, "_built", False):
            return
        self.momentums = []
        self._built = True

    def update_step(self, gradient, variable):
        if self.momentum != 0:
            return super().update_step(gradient, variable)
        lr = tf.cast(self.learning_rate, variable.dtype)
        if isinstance(gradient, tf.IndexedSlices):
            variable.scatter_sub(tf.IndexedSlices(gradient.values * lr, gradient.indices, gradient.dense_shape))
        else:
            variable.assign_sub(gradient * lr)


class Adam(tf.keras.optimizers.Adam):
    """Keras Adam whose update is TensorFlow's fused ``ResourceApplyAdam`` kernel, one op per variable.

    Keras 2.15 spells the update as about ten ops per variable (scalar powers, ``m``, ``v`` and the
    variable each updated through their own temporaries), and an embedding gradient (IndexedSlices)
    first goes through ``tf.unique`` and ``unsorted_segment_sum`` and is then applied as full-table
    passes anyway (``m -= m * (1 - beta_1)``, then a scatter; the same for ``v``; then the whole table).
    Here a sparse gradient is summed into a dense one (repeated ids add up, as Keras's deduplication
    makes them) and every variable is updated by the fused kernel, whose formula is Keras's dense one
    (``m += (g - m)(1 - beta_1)``, ``v += (g^2 - v)(1 - beta_2)``,
    ``var -= m alpha / (sqrt(v) + epsilon)``, ``alpha = lr sqrt(1 - beta_2^t) / (1 - beta_1^t)``).
    The slots are Keras's own ``m`` and ``v`` (checkpoints are unchanged). AMSGrad is Keras's update.
    """

    def _deduplicate_sparse_grad(self, grads):
        if self.amsgrad:
            return super()._deduplicate_sparse_grad(grads)
        return list(grads)

    def update_step(self, gradient, variable):
        if self.amsgrad:
            return super().update_step(gradient, variable)
        dtype = variable.dtype
        index = self._index_dict[self._var_key(variable)]
        step = tf.cast(self.iterations + 1, dtype)
        beta1, beta2 = tf.cast(self.beta_1, dtype), tf.cast(self.beta_2, dtype)
        if isinstance(gradient, tf.IndexedSlices):
            gradient = tf.math.unsorted_segment_sum(gradient.values, gradient.indices, tf.shape(variable)[0])
        tf.raw_ops.ResourceApplyAdam(
            var=variable.handle, m=self._momentums[index].handle, v=self._velocities[index].handle,
            beta1_power=tf.pow(beta1, step), beta2_power=tf.pow(beta2, step),
            lr=tf.cast(self.learning_rate, dtype), beta1=beta1, beta2=beta2,
            epsilon=tf.cast(self.epsilon, dtype), grad=gradient)


def make_optimizer(name, learning_rate, **kw):
    """A Keras (2.15, non-legacy) optimizer by name: sgd, adagrad, adam, rmsprop, ftrl."""
    name = name.lower()
    if name == "sgd":
        return SGD(learning_rate, momentum=kw.get("momentum", 0.0))
    if name == "adagrad":
        return tf.keras.optimizers.Adagrad(learning_rate, initial_accumulator_value=kw.get("initial_accumulator", 0.0) or 1e-8)
    if name == "adam":
        return Adam(learning_rate, beta_1=kw.get("beta1", 0.9), beta_2=kw.get("beta2", 0.999),
                    epsilon=kw.get("eps", 1e-8))
    if name == "rmsprop":
        # W&D reference: rho 0.5, no momentum.
        return tf.keras.optimizers.RMSprop(learning_rate, rho=kw.get("rho", 0.5), momentum=0.0,
                                           epsilon=kw.get("eps", 1e-7))
    if name == "ftrl":
        return tf.keras.optimizers.Ftrl(learning_rate)
    raise ValueError(f"--optimizer: unknown optimizer {name!r} (sgd, adagrad, adam, rmsprop, ftrl)")


OPTIMIZERS = ("sgd", "adagrad", "adam", "rmsprop", "ftrl")
