"""A point's measured figures read and printed the one way both sides of jobs.study show them:
the engine summary's step breakdown (docs/studies.md, "Where the step time goes"), which the node
screen (jobs.study.running.screen) and the report (jobs.study.analysis) both tabulate, and a
figure's text."""

from typing import Any, Optional

from jobs.runs.enginelog import number


# the engine summary's step breakdown (docs/studies.md, "Where the step time goes")
BREAKDOWN = "step_breakdown"
BREAKDOWN_PHASES = ("input_wait", "compute", "embedding_exchange", "gradient_exchange", "optimizer", "remainder")
EXCHANGES = ("embedding_exchange", "gradient_exchange")


def read_breakdown(point_id: str, data: Any) -> Optional[dict]:
    """A cell's step breakdown from one summary's `step_breakdown`: per phase ms and % of the step
    (mean over ranks, slowest rank), each exchange's bytes per step and achieved GB/s; None when
    absent or malformed."""
    if not isinstance(data, dict) or not isinstance(data.get("mean"), dict):
        return None
    step = number(data["mean"], "step_ms")
    if step is None or step <= 0:
        return None
    phases = [p for p in data.get("phases") or BREAKDOWN_PHASES if isinstance(p, str)]

    def side(values):
        if not isinstance(values, dict):
            return None
        step_ms = number(values, "step_ms")
        if step_ms is None or step_ms <= 0:
            return None
        out = {"step_ms": step_ms, "phases": {}}
        for phase in phases:
            ms = number(values, f"{phase}_ms")
            out["phases"][phase] = {"ms": ms, "pct": None if ms is None else 100.0 * ms / step_ms}
        out["phase_sum_ms"] = sum(v["ms"] for v in out["phases"].values() if v["ms"] is not None)
        if "rank" in values:
            out["rank"] = values["rank"]
        return out

    mean, slowest = side(data["mean"]), side(data.get("slowest_rank"))
    sent = data.get("bytes_per_step") if isinstance(data.get("bytes_per_step"), dict) else {}
    exchanges = {}
    for name in EXCHANGES:
        size = number(sent, name)

        def gbps(over):
            ms = over and over["phases"].get(name, {}).get("ms")
            return size / (ms / 1000.0) / 1e9 if size is not None and ms else None

        exchanges[name] = {"bytes": size, "gbps_mean": gbps(mean), "gbps_slowest": gbps(slowest)}
    # version 2 records the same run's timed step and split / timed (version 1: absent, None)
    return {"point": point_id, "version": data.get("version"), "steps": data.get("steps"),
            "method": data.get("method"), "phases": phases, "mean": mean, "slowest_rank": slowest,
            "exchanges": exchanges, "timed_step_ms": number(data, "timed_step_ms"),
            "split_over_timed": number(data, "split_over_timed")}


def fmt_number(value: Optional[float], digits: int = 0) -> str:
    """A figure as the report and compare print it: thousands separated, "-" for none."""
    if value is None:
        return "-"
    return f"{value:,.{digits}f}"
