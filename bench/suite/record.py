"""Appends one benchmark point to a records JSONL file.

    record.py RECORDS RC STDOUT STDERR METRICS CMD key=value...

A point is one `dynapipe plan --summary-json` (METRICS = "-") or one `dynapipe train
--metrics METRICS` run. Both are reduced to the same fields so that report.py can tabulate
either mode: tokens_per_s, iter_ms, est_iter_ms, padding_efficiency, planning_ms, and for
training the measured and estimated peak memory. A failed run records its error line.
"""
import json
import statistics
import sys


def from_summary(path):
    s = json.load(open(path))
    return dict(tokens_per_s=s["est_tokens_per_s"], iter_ms=s["mean_est_iteration_ms"],
                est_iter_ms=s["mean_est_iteration_ms"], padding_efficiency=s["padding_efficiency"],
                planning_ms=s["mean_planning_ms"], p99_planning_ms=s["p99_planning_ms"])


def from_metrics(path):
    steps = [json.loads(line) for line in open(path) if line.strip()]
    steps = [m for m in steps if not m.get("summary")]
    # Step 0 pays the warm-up (first allocations, the first plans): medians of the rest.
    timed = steps[1:] if len(steps) > 1 else steps

    def med(key):
        return statistics.median(m[key] for m in timed)

    real = sum(m["real_tokens"] for m in steps)
    padded = sum(m["padded_tokens"] for m in steps)
    return dict(tokens_per_s=med("tokens_per_s"), iter_ms=med("step_time_s") * 1e3,
                est_iter_ms=med("est_step_time_s") * 1e3,
                padding_efficiency=real / padded if padded else None,
                planning_ms=med("planning_ms"), peak_memory_bytes=med("peak_memory_bytes"),
                est_peak_memory_bytes=med("est_peak_memory_bytes"), steps=len(steps),
                # What training added on top of LibTorch, data and planner (0 from older builds).
                peak_memory_added_bytes=statistics.median(
                    m.get("peak_memory_above_start_bytes", 0) for m in timed),
                per_step=[{k: m[k] for k in ("step_time_s", "est_step_time_s", "peak_memory_bytes",
                                             "est_peak_memory_bytes")} for m in timed])


def main():
    records, rc, out, err, metrics, cmd = sys.argv[1:7]
    rec = {}
    for kv in sys.argv[7:]:
        k, v = kv.split("=", 1)
        rec[k] = int(v) if v.lstrip("-").isdigit() else v
    rec["cmd"] = cmd
    if rc != "0":
        lines = [l.strip() for l in open(err) if l.startswith("error")]
        rec["error"] = lines[-1] if lines else f"exit code {rc}"
    else:
        rec.update(from_metrics(metrics) if metrics != "-" else from_summary(out))
    with open(records, "a") as f:
        f.write(json.dumps(rec) + "\n")


if __name__ == "__main__":
    main()
