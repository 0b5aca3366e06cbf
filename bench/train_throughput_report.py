"""The tables of bench/train_throughput.sh, from the metrics JSONL its runs wrote.

    train_throughput_report.py DIR ROUNDS LABEL...

DIR/r<k>/<LABEL>.jsonl holds round k's run of LABEL (`dynapipe train --metrics`). Every
label trains the same global batches, so step s holds the same samples in every run: a
ratio of two labels' step times is paired, batch for batch.

First table, one row per label: tokens/s by median step (after warm-up step 0) and over
the timed steps together, medians over the rounds. With more than one round, a second
table: each label's speed over the base label's, per round (Σ base step time ÷ Σ its
step time over the steps both timed) and the median of the paired step ratios over every
round and step. The script's rounds run the labels in rotated orders, so the drift of a
shared machine within a round falls on every label alike; the per-round values show how
far apart the rounds are, which a single ratio hides.

Prints to stdout; exits 1 with one line on stderr where no label trained.
"""
import json
import statistics
import sys


def read_steps(path):
    """The step records of one run (the summary line left out); None if it wrote none."""
    try:
        with open(path) as f:
            steps = [json.loads(line) for line in f if line.strip()]
    except FileNotFoundError:
        return None
    steps = [m for m in steps if not m.get("summary")]
    return steps or None


def timed(steps):
    """Step 0 includes warm-up (first allocations, the first plans): the rest, if any."""
    return steps[1:] if len(steps) > 1 else steps


def run_row(steps):
    t = timed(steps)
    real = sum(m["real_tokens"] for m in steps)
    padded = sum(m["padded_tokens"] for m in steps)
    return dict(
        tps=statistics.median(m["tokens_per_s"] for m in t),
        # Steps hold different batches: the whole timed run's rate weighs them by time.
        total_tps=sum(m["real_tokens"] for m in t) / sum(m["step_time_s"] for m in t),
        step=statistics.median(m["step_time_s"] for m in t),
        est=statistics.median(m["est_step_time_s"] for m in t),
        eff=real / padded if padded else 0.0,
        peak=max(m["peak_memory_above_start_bytes"] for m in steps) / 2**20,
        loss=steps[-1]["loss"])


def paired(base_steps, steps):
    """Per step both timed: base step time ÷ this run's (> 1: this one is faster), and the
    ratio of their sums over those steps."""
    base_time = {m["step"]: m["step_time_s"] for m in timed(base_steps)}
    pairs = [(base_time[m["step"]], m["step_time_s"]) for m in timed(steps) if m["step"] in base_time]
    if not pairs:
        return [], None
    return [b / t for b, t in pairs], sum(b for b, _ in pairs) / sum(t for _, t in pairs)


def report(directory, rounds, labels, out=sys.stdout):
    runs = {}  # label -> [steps of round k, ...] (None where that run wrote nothing)
    for label in labels:
        per_round = [read_steps(f"{directory}/r{k}/{label}.jsonl") for k in range(rounds)]
        if any(per_round):
            runs[label] = per_round
    if not runs:
        print("error: no strategy trained (see the errors above)", file=sys.stderr)
        return 1
    # The ratios are to packing, or to the first label that trained without it.
    base_name = "packing" if "packing" in runs else next(iter(runs))
    rows = {}
    for label, per_round in runs.items():
        per_run = [run_row(steps) for steps in per_round if steps]
        rows[label] = {key: statistics.median(r[key] for r in per_run)
                       for key in ("tps", "total_tps", "step", "est", "eff")}
        rows[label]["peak"] = max(r["peak"] for r in per_run)
        rows[label]["loss"] = per_run[-1]["loss"]
    base = rows[base_name]["tps"]
    over = " (medians over rounds)" if rounds > 1 else ""
    print(f"| strategy | tokens/s (median step){over} | vs {base_name} | step s (median) | est. step s "
          f"| padding eff. | peak MiB above start | final loss | tokens/s (timed steps together) |", file=out)
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|", file=out)
    for label, r in rows.items():
        print(f"| {label} | {r['tps']:.0f} | {r['tps'] / base:.2f}x | {r['step']:.2f} | {r['est']:.2f} "
              f"| {r['eff']:.3f} | {r['peak']:.0f} | {r['loss']:.4f} | {r['total_tps']:.0f} |", file=out)
    if rounds == 1:
        return 0
    print(file=out)
    print(f"Paired with {base_name}, batch for batch (> 1: faster than {base_name}):", file=out)
    print(file=out)
    print(f"| strategy | ÷ {base_name} per round (timed steps together) | median of rounds "
          f"| median step ratio (rounds × steps) | steps paired |", file=out)
    print("|---|---|---:|---:|---:|", file=out)
    for label, per_round in runs.items():
        if label == base_name:
            continue
        round_ratios, step_ratios = [], []
        for base_steps, steps in zip(runs[base_name], per_round):
            if not base_steps or not steps:
                continue
            ratios, together = paired(base_steps, steps)
            if together is not None:
                round_ratios.append(together)
                step_ratios += ratios
        if not round_ratios:
            continue
        listed = ", ".join(f"{r:.2f}" for r in round_ratios)
        print(f"| {label} | {listed} | {statistics.median(round_ratios):.3f}x "
              f"| {statistics.median(step_ratios):.3f}x | {len(step_ratios)} |", file=out)
    return 0


def main(argv):
    if len(argv) < 4:
        print("usage: train_throughput_report.py DIR ROUNDS LABEL...", file=sys.stderr)
        return 2
    try:
        rounds = int(argv[2])
    except ValueError:
        rounds = 0
    if rounds < 1:
        print(f"error: ROUNDS must be a whole number >= 1, got '{argv[2]}'", file=sys.stderr)
        return 2
    return report(argv[1], rounds, argv[3:])


if __name__ == "__main__":
    sys.exit(main(sys.argv))
