"""Run directories and what they hold: the typed, versioned records (request.json, jobs.json,
status polls), the atomic writes that keep them whole, and the engine logs a finished job
leaves. Below planning and the backends, which write and read them."""
