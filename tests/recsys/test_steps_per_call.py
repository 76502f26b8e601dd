"""Several training steps per compiled call (TrainConfig.steps_per_call) train what one step per call trains.

The same seed, data and flags are trained with 1 and with 8 steps per call, in this process on the real
engine (no Horovod: one rank): the per-step losses, the step records (the log interval), the weights and
the divergence guard's step must agree. Each assertion fails if the compiled loop skips, repeats or
reorders a step, ends a call past a log step, or trains on after a non-finite loss.
"""
import numpy as np
import pytest

from conftest import SMALL, in_process_task


def _engine(data, args, steps_per_call, log_path=None):
    import tensorflow as tf
    from recsys.engine import Engine
    tf.keras.utils.set_random_seed(0)
    config, task, dist, log = in_process_task(["--data-path", data, *args], log_path, steps_per_call=steps_per_call)
    return Engine(config, task, dist, log)


@pytest.mark.parametrize("model", ["dlrm", "wide_deep", "ncf"])
def test_eight_steps_per_call_match_one_step_per_call(model, tiny_data, tmp_path):
    """13 steps with --log-every 5: calls must end at steps 5, 10 and 13 (max steps); the step records,
    every logged loss and the final weights match one step per call."""
    from conftest import read_log, records
    args = ["--model", model, *SMALL[model], "--epochs", "1", "--max-steps", "13", "--log-every", "5"]
    runs = {}
    for spc in (1, 8):
        log = tmp_path / f"log-{spc}.jsonl"
        engine = _engine(tiny_data(model), args, spc, log)
        out = engine.train()
        steps = [(r["step"], r["loss"]) for r in records(read_log(log), "step")]
        weights = [v.numpy() for v in engine.model.weights]
        runs[spc] = (out, steps, weights, int(engine.global_step.numpy()))
    (one, steps1, w1, g1), (eight, steps8, w8, g8) = runs[1], runs[8]
    assert g1 == g8 == 13
    assert [s for s, _ in steps1] == [s for s, _ in steps8] == [5, 10, 13]
    np.testing.assert_allclose([l for _, l in steps8], [l for _, l in steps1], rtol=1e-4)
    assert (one["first_loss_step"], one["final_loss_step"]) == (eight["first_loss_step"], eight["final_loss_step"])
    np.testing.assert_allclose(eight["final_loss"], one["final_loss"], rtol=1e-4)
    for a, b in zip(w8, w1):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_divergence_guard_stops_at_the_same_step_with_no_step_after_it(tiny_data, tmp_path):
    """--lr 1e12 diverges: with 8 steps per call the guard names the step one step per call names,
    and the global step is that step (the compiled loop stopped at the non-finite loss)."""
    from recsys.errors import DivergedError
    args = ["--model", "dlrm", *SMALL["dlrm"], "--lr", "1e12", "--warmup-steps", "0", "--epochs", "1",
            "--log-every", "50"]
    found = {}
    for spc in (1, 8):
        engine = _engine(tiny_data("dlrm"), args, spc)
        with pytest.raises(DivergedError) as err:
            engine.train()
        found[spc] = (str(err.value).split(":")[0], int(engine.global_step.numpy()))
    assert found[8] == found[1], found
    step = int(found[1][0].split()[1])
    assert found[1][1] == step and step < 50       # diverged inside a call, not at its end
