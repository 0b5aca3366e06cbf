"""Turns a family's records.jsonl into PREFIX.md (tables) and PREFIX.svg (one panel per group).

Records are grouped by --group keys (one table and one chart panel each); rows are the
distinct --x values, columns the --series values, cells the --y field. A failed point
shows as "infeasible" and its error line is listed under the table. --ratio A/B (repeatable) adds a
column y(A) / y(B) per row. Every command that produced a record is listed at the end.
"""
import argparse
import datetime
import json
import os

import svgplot


def fmt(v, spec):
    return "—" if v is None else format(v, spec)


def key_of(rec, keys):
    return tuple(str(rec.get(k, "")) for k in keys)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", required=True)
    ap.add_argument("--out", required=True, help="path prefix: PREFIX.md, PREFIX.svg")
    ap.add_argument("--mode", required=True)
    ap.add_argument("--title", required=True)
    ap.add_argument("--x", required=True)
    ap.add_argument("--xlabel", required=True)
    ap.add_argument("--series", default="strategy")
    ap.add_argument("--y", required=True)
    ap.add_argument("--ylabel", required=True)
    ap.add_argument("--fmt", default=".0f", help="format spec of the cells")
    ap.add_argument("--group", default="model", help="comma list of record keys")
    ap.add_argument("--ratio", action="append", default=[],
                    help="A/B: add a column y(A) / y(B); repeatable")
    ap.add_argument("--chart", choices=["line", "bar"], default="line")
    ap.add_argument("--log-x", action="store_true")
    ap.add_argument("--note", action="append", default=[], help="a line under the title")
    a = ap.parse_args()

    recs = [json.loads(l) for l in open(a.records) if l.strip()]
    group_keys = a.group.split(",")
    groups = {}
    for r in recs:
        groups.setdefault(key_of(r, group_keys), []).append(r)

    md = [f"# {a.title}", "",
          f"Mode: **{a.mode}**. Cells: `{a.y}`. Generated {datetime.date.today()} on "
          f"{os.cpu_count()} cores; the command of every point is in the Commands block of " + os.path.basename(a.out) + ".md."]
    md += [""] + a.note if a.note else []
    panels = []
    for gkey, rs in groups.items():
        xs = sorted({r[a.x] for r in rs}, key=lambda v: (isinstance(v, str), v))
        # With several --y fields each series gets one column per field.
        y_fields = a.y.split(",")
        series = [(s, y) for s in dict.fromkeys(r[a.series] for r in rs) for y in y_fields]
        label = {sy: sy[0] if len(y_fields) == 1 else f"{sy[0]} {sy[1]}" for sy in series}
        cell = {(r[a.x], r[a.series]): r for r in rs}
        name = " ".join(gkey)
        md += ["", f"## {name}", ""]
        head = [a.x, "setting"] + [label[sy] for sy in series] + [r.replace("/", " ÷ ") for r in a.ratio]
        md.append("| " + " | ".join(head) + " |")
        md.append("|" + "---|" * 2 + "---:|" * (len(head) - 2))
        errors = []
        ys = {label[sy]: [] for sy in series}
        for x in xs:
            row_recs = [cell[(x, s)] for s, _ in series if (x, s) in cell]
            setting = ", ".join(dict.fromkeys(
                f"{r['memory_gib']} GiB {r['cost_model']}" if "memory_gib" in r else r.get("cost_model", "")
                for r in row_recs))
            cells = []
            for s, y in series:
                r = cell.get((x, s))
                v = None if r is None or "error" in r else r.get(y)
                ys[label[(s, y)]].append(v)
                if r is not None and "error" in r:
                    if y == y_fields[0]:
                        errors.append(f"> {a.x} {x}, {s}: {r['error']}")
                    cells.append("infeasible")
                else:
                    cells.append(fmt(v, a.fmt))
            for ratio in a.ratio:
                num, den = ratio.split("/")
                vn, vd = (ys[num][-1] if num in ys else None), (ys[den][-1] if den in ys else None)
                cells.append(f"{vn / vd:.2f}x" if vn is not None and vd else "—")
            md.append(f"| {x} | {setting} | " + " | ".join(cells) + " |")
        if errors:
            md += [""] + [e + "  " for e in errors]
        if a.chart == "line" and all(isinstance(x, (int, float)) for x in xs):
            panels.append(svgplot.line_chart(f"{a.title}: {name}", a.xlabel, a.ylabel, xs, ys,
                                             log_x=a.log_x))
        else:
            panels.append(svgplot.bar_chart(f"{a.title}: {name}", a.xlabel, a.ylabel,
                                            [str(x) for x in xs], ys))
    md += ["", "<details><summary>Commands</summary>", ""]
    md += [f"    {r['cmd']}" for r in recs]
    md += ["", "</details>", ""]
    open(a.out + ".md", "w").write("\n".join(md))
    open(a.out + ".svg", "w").write(svgplot.stack(panels))


if __name__ == "__main__":
    main()
