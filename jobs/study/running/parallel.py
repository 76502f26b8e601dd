"""Submitting a study's independent points from a few threads: each sbatch waits on the
controller, not on this process, so a new study of many points goes in at the pace of a few
submissions at a time (bench/bench_study.py measures it)."""

import queue
import threading

from jobs.errors import RequestError, SlurmCommandError, StorageError, SubmitError

# sbatch calls in flight at once (bench/bench_study.py compares 1 and this)
SUBMIT_THREADS = 8


def submit_parallel(record, todo, submit_point, submitted, runs):
    """Submit independent points from a few threads (each sbatch waits on the controller, not on
    this process). Each point's run dir reaches study.json before its job is submitted
    (submit_point). A point that could not be submitted does not stop the others; the first
    error is raised at the end, saying what went in (a re-run resumes with the missing points).
    Interrupted, no further point is started, and the ones in flight finish first."""
    landed = queue.Queue()
    pending = iter(todo)
    take = threading.Lock()
    stop = threading.Event()

    def worker():
        while not stop.is_set():
            with take:
                point = next(pending, None)
            if point is None:
                return
            try:
                landed.put((point, submit_point(point), None))
            except BaseException as exc:    # reported (or re-raised, for a bug) by the main thread
                landed.put((point, None, exc))

    threads = [threading.Thread(target=worker, name=f"recsys-submit-{i}")
               for i in range(min(SUBMIT_THREADS, len(todo)))]
    errors = []

    def take_landed(batch):
        for point, run_record, exc in batch:
            if exc is not None:
                errors.append((point.id, exc))
                continue
            runs[point.id] = run_record
            submitted.append(point.id)

    try:
        for thread in threads:
            thread.start()
        while len(submitted) + len(errors) < len(todo):
            batch = [landed.get()]
            while True:                 # everything else that landed meanwhile
                try:
                    batch.append(landed.get_nowait())
                except queue.Empty:
                    break
            take_landed(batch)
    except BaseException:
        stop.set()
        for thread in threads:
            if thread.is_alive():
                thread.join()
        batch = []
        while not landed.empty():
            batch.append(landed.get_nowait())
        take_landed(batch)
        raise
    for thread in threads:
        thread.join()
    order = {p.id: i for i, p in enumerate(todo)}
    submitted.sort(key=order.get)
    errors.sort(key=lambda e: order[e[0]])
    for point_id, exc in errors:
        if not isinstance(exc, (RequestError, SubmitError, SlurmCommandError, StorageError)):
            raise exc               # a bug, not a refused submission: its traceback
    if errors:
        point_id, exc = errors[0]
        raise SubmitError(f"point {point_id} not submitted: {exc}; {len(errors)} point(s) failed to submit, "
                          f"{len(submitted)} submitted; `recsys-submit study run` again submits the missing "
                          f"ones (study {record.study_dir})")
