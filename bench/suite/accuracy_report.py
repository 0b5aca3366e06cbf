"""accuracy_report.py RECORDS PREFIX MODE: PREFIX.md and PREFIX.svg for bench/suite/accuracy.sh.

measured: per run |est - measured| / measured of the median step time and of peak memory,
then the median and worst of those per cost model. simulated: nothing is measured, so the
two cost models' iteration-time estimates of the same settings are compared instead.
"""
import datetime
import json
import statistics
import sys

import svgplot


def short(cm):
    return "profile" if cm.endswith(".json") else cm


def rel(est, meas):
    return abs(est - meas) / meas if est is not None and meas else None


def measured(recs, md):
    md += ["| model | pp | cost model | step ms | est. ms | time err | worst step err | peak MiB added by training | "
           "est. MiB | memory err |", "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    errs = {}
    groups, series = [], {}
    for r in recs:
        cm = short(r["cost_model"])
        if "error" in r:
            md.append(f"| {r['model']} | {r['pp']} | {cm} | failed: {r['error']} ||||||| |")
            continue
        t = rel(r["est_iter_ms"], r["iter_ms"])
        # Compare the estimate with what training added to each rank's memory, not with
        # the whole process (LibTorch itself is a few hundred MiB of RSS).
        measured_mem = r.get("peak_memory_added_bytes") or r["peak_memory_bytes"]
        m = rel(r["est_peak_memory_bytes"], measured_mem)
        worst = max(rel(s["est_step_time_s"], s["step_time_s"]) for s in r["per_step"])
        errs.setdefault(cm, []).append((t, m))
        md.append(f"| {r['model']} | {r['pp']} | {cm} | {r['iter_ms']:.0f} | {r['est_iter_ms']:.0f} | "
                  f"{t:.0%} | {worst:.0%} | {measured_mem / 2**20:.0f} | "
                  f"{r['est_peak_memory_bytes'] / 2**20:.0f} | {m:.0%} |")
        g = f"{r['model']} pp{r['pp']}"
        if g not in groups:
            groups.append(g)
        series.setdefault(f"time err {cm}", {})[g] = 100 * t
        series.setdefault(f"memory err {cm}", {})[g] = 100 * m
    md += ["", "| cost model | runs | time err median | time err worst | memory err median | "
           "memory err worst |", "|---|---:|---:|---:|---:|---:|"]
    for cm, e in errs.items():
        ts, ms = [x[0] for x in e], [x[1] for x in e]
        md.append(f"| {cm} | {len(e)} | {statistics.median(ts):.0%} | {max(ts):.0%} | "
                  f"{statistics.median(ms):.0%} | {max(ms):.0%} |")
    return svgplot.bar_chart("Cost-model error vs measured (CPU)", "model, pipeline stages",
                             "|est - measured| / measured, %", groups,
                             {k: [v.get(g) for g in groups] for k, v in series.items()})


def simulated(recs, md):
    md += ["Nothing is measured in this mode: the columns are the plan's estimated iteration time "
           "under each CPU cost model for the same global batches.", "",
           "| model | pp | analytic:cpu est. ms | profile est. ms | analytic ÷ profile |",
           "|---|---:|---:|---:|---:|"]
    by = {}
    for r in recs:
        by.setdefault((r["model"], r["pp"]), {})[short(r["cost_model"])] = r
    groups, series = [], {"analytic:cpu": [], "profile": []}
    for (model, pp), d in by.items():
        a, p = d.get("analytic:cpu", {}), d.get("profile", {})
        ea, ep = a.get("est_iter_ms"), p.get("est_iter_ms")
        ratio = f"{ea / ep:.2f}" if ea and ep else "—"
        cells = [f"{e:.1f}" if e else d_.get("error", "—") for e, d_ in ((ea, a), (ep, p))]
        md.append(f"| {model} | {pp} | {cells[0]} | {cells[1]} | {ratio} |")
        groups.append(f"{model} pp{pp}")
        series["analytic:cpu"].append(ea)
        series["profile"].append(ep)
    return svgplot.bar_chart("Estimated iteration time by CPU cost model", "model, pipeline stages",
                             "est. ms per iteration", groups, series)


def main():
    records, prefix, mode = sys.argv[1:4]
    recs = [json.loads(l) for l in open(records) if l.strip()]
    md = ["# Cost-model accuracy", "",
          f"Mode: **{mode}**. Generated {datetime.date.today()}; the command of every point is in the Commands block of accuracy.md. "
          "`profile` = assets/profiles/MODEL.cpu.measured.json.", ""]
    chart = measured(recs, md) if mode == "measured" else simulated(recs, md)
    md += ["", "<details><summary>Commands</summary>", ""] + [f"    {r['cmd']}" for r in recs]
    md += ["", "</details>", ""]
    open(prefix + ".md", "w").write("\n".join(md))
    open(prefix + ".svg", "w").write(svgplot.stack([chart]))


if __name__ == "__main__":
    main()
