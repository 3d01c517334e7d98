"""lrmoe-study's outputs from the per-run, per-seed rows: the run TSVs, the
tables (Markdown and TSV, rounded for a report) and the loss-against-time
figures (gnuplot, PNG and SVG).

Every comparison with C0 is paired: a run's seed s is compared with C0's
seed s (same initial weights, same batches), then the paired differences
are summarised over the seeds as mean +- sample standard deviation.

Summary: per run, the final validation loss and its paired difference to
C0, the share of backward pairs kept, cumulative measured MoE-layer CPU
seconds and modelled GPU milliseconds (with the weight traffic's share)
and the fidelity split of the kept gradients (lrmoe-score --fidelity).

Table 1 (the LRMoE paper's Table 1 at small scale): two target validation
losses per seed from C0's own curve (its value at the middle evaluation,
"loose", and at the last one, "strict"); per run, in how many seeds it
reaches the target, at which step, and the paired saving in cumulative
MoE time (measured CPU and modelled GPU) against C0 at that target.

Table 2: per run, the mean over the evaluated steps after step 0 of
exp(val_loss) - exp(val_loss of C0) (perplexity per byte), paired."""
import decimal
import math
import os
import shutil
import subprocess

from .study_run import FIELDS

# the run TSVs: how many decimals a loss, rate or fidelity field keeps; every
# other float (the times, in seconds) keeps 4 significant digits, written
# without an exponent (0.00007229, not 7.229e-05). The report is computed
# from these rounded values, in the run as with --report-only.
_DIGITS = {"loss": 5, "val_loss": 5, "rho": 4, "grad_err": 4, "dw_down_cos": 5,
           "dw_down_bias": 4, "dx_err": 4, "dx_bias": 4}
_INTS = ("step", "kept", "pairs", "mem_peak_bytes")  # counts: every digit


def _fmt(v, key=None, exact=False):
    if v is None or v == "":
        return ""
    if isinstance(v, float):
        if exact and not (key in _INTS and v.is_integer()):
            return repr(v)  # every digit (lrmoe-study --exact)
        if key in _DIGITS:
            return f"{v:.{_DIGITS[key]}f}"
        if key in _INTS and v.is_integer():
            return str(int(v))
        if not math.isfinite(v):
            return f"{v}"
        return format(decimal.Decimal(f"{v:.4g}"), "f")
    return str(v)


def write_tsv(path, header, rows, exact=False):
    with open(path, "w") as f:
        f.write("\t".join(header) + "\n")
        for r in rows:
            f.write("\t".join(_fmt(r.get(h), h, exact) for h in header) + "\n")


def write_run(path, rows, exact=False):
    """A run's TSV; exact: every float with all its digits (repr), not rounded."""
    write_tsv(path, FIELDS, rows, exact)


def read_run(path):
    """The rows of a run TSV (write_run), as the report uses them."""
    rows = []
    with open(path) as f:
        head = f.readline().rstrip("\n").split("\t")
        for line in f:
            cells = line.rstrip("\n").split("\t")
            r = {}
            for k, v in zip(head, cells):
                if v == "" or k not in FIELDS:
                    continue
                r[k] = int(float(v)) if k in _INTS else float(v)
            rows.append(r)
    return rows


def _evals(rows):
    return [(r["step"], r["val_loss"]) for r in rows if r.get("val_loss") is not None]


def _cum_at(rows, keys):
    """{step: cumulative sum of the keys up to and including the step}."""
    out, s = {}, 0.0
    for r in rows:
        s += sum((r.get(k) or 0.0) for k in keys)
        out[r["step"]] = s
    return out


MOE_CPU = ("moe_fwd_cpu_s", "moe_bwd_cpu_s")


def mean_std(xs):
    xs = [x for x in xs if x is not None]
    if not xs:
        return None, None
    m = sum(xs) / len(xs)
    if len(xs) < 2:
        return m, None
    return m, math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))


def pm(m, s, fmt):
    if m is None:
        return ""
    return fmt.format(m) + ("" if s is None else " ± " + fmt.replace("+", "").format(s))


def targets(c0rows):
    ev = _evals(c0rows)
    if len(ev) < 3:
        return []
    return [("loose", ev[len(ev) // 2][1]), ("strict", ev[-1][1])]


def reach(rows, target):
    """(step, cumulative MoE-layer CPU s, cumulative modelled GPU s) at the
    first evaluation reaching target, or None. The MoE time is the calling
    thread's CPU seconds of the patched layers' forward and backward (with
    one thread all of their work; wall time on a shared machine counts the
    other jobs too)."""
    moe, gpu = _cum_at(rows, MOE_CPU), _cum_at(rows, ("gpu_model_s",))
    for step, v in _evals(rows):
        if v <= target:
            return step, moe[step], gpu[step]
    return None


def _seeds(runs):
    c0 = runs.get("C0")
    return sorted(c0["seeds"]) if c0 else sorted(next(iter(runs.values()))["seeds"])


# ---------------------------------------------------------------- tables

def summary(runs, order):
    """One row per run: seed means (and the paired differences to C0)."""
    c0 = runs.get("C0")
    out = []
    for rn in order:
        per = []
        for sd, rows in sorted(runs[rn]["seeds"].items()):
            ev = _evals(rows)
            d = {"val": ev[-1][1] if ev else None}
            if c0 and sd in c0["seeds"] and ev:
                d["dval"] = ev[-1][1] - _evals(c0["seeds"][sd])[-1][1]
            if rows and rows[0].get("pairs"):
                n = len(rows)
                d["kept"] = sum(r["kept"] for r in rows) / sum(r["pairs"] for r in rows)
                d["moe"] = sum(r["moe_fwd_cpu_s"] + r["moe_bwd_cpu_s"] for r in rows)
                d["gpu"] = 1e3 * sum(r["gpu_model_s"] for r in rows)
                tw = sum(r.get("t_weights_s") or 0.0 for r in rows)
                d["tw"] = 100.0 * tw / max(1e-30, sum(r["gpu_model_s"] for r in rows))
                for k in ("grad_err", "dw_down_cos", "dw_down_bias", "dx_err", "dx_bias"):
                    d[k] = sum(r.get(k) or 0.0 for r in rows) / n
            per.append(d)
        row = {"run": rn, "seeds": len(per), "rule": runs[rn]["spec"].get("rule", "")}
        for k in ("val", "dval", "kept", "moe", "gpu", "tw", "grad_err", "dw_down_cos",
                  "dw_down_bias", "dx_err", "dx_bias"):
            row[k] = mean_std([d.get(k) for d in per])
        out.append(row)
    return out


def table1(runs, order):
    """Rows (dicts) of Table 1, per target and run, paired over seeds."""
    c0 = runs.get("C0")
    if c0 is None:
        return []
    out = []
    for ti, tname in enumerate(("loose", "strict")):
        for rn in order:
            n, steps, moe_sv, gpu_sv, moe_s, gpu_ms, tv = 0, [], [], [], [], [], []
            seeds = sorted(runs[rn]["seeds"])
            for sd in seeds:
                if sd not in c0["seeds"]:
                    continue
                tg = targets(c0["seeds"][sd])
                if len(tg) <= ti:
                    continue
                target = tg[ti][1]
                tv.append(target)
                base = reach(c0["seeds"][sd], target)
                r = reach(runs[rn]["seeds"][sd], target)
                if r is None:
                    continue
                n += 1
                steps.append(r[0])
                moe_s.append(r[1])
                gpu_ms.append(1e3 * r[2])
                if base and base[1] > 0:
                    moe_sv.append(100.0 * (1 - r[1] / base[1]))
                if base and base[2] > 0:
                    gpu_sv.append(100.0 * (1 - r[2] / base[2]))
            out.append({"target": tname, "target_loss": mean_std(tv)[0], "run": rn,
                        "reached": f"{n}/{len(seeds)}", "step": mean_std(steps),
                        "moe_cpu_s": mean_std(moe_s), "moe_saving_pct": mean_std(moe_sv),
                        "gpu_model_ms": mean_std(gpu_ms), "gpu_saving_pct": mean_std(gpu_sv)})
    return out


def table2(runs, order):
    """{run: (mean, std) over seeds of the mean delta-PPL against C0}."""
    c0 = runs.get("C0")
    if c0 is None:
        return {}
    out = {}
    for rn in order:
        if rn == "C0":
            continue
        vals = []
        for sd, rows in runs[rn]["seeds"].items():
            if sd not in c0["seeds"]:
                continue
            base = dict(_evals(c0["seeds"][sd]))
            d = [math.exp(v) - math.exp(base[s]) for s, v in _evals(rows) if s > 0 and s in base]
            if d:
                vals.append(sum(d) / len(d))
        out[rn] = mean_std(vals)
    return out


def _md(header, rows):
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in rows:
        lines.append("| " + " | ".join(str(r.get(h, "")) for h in header) + " |")
    return "\n".join(lines) + "\n"


def _tsv_cells(v, fmt):
    """(mean, std) -> two rounded cells."""
    if isinstance(v, tuple):
        return [fmt.format(v[0]) if v[0] is not None else "",
                fmt.replace("+", "").format(v[1]) if v[1] is not None else ""]
    return [str(v)]


SUMMARY = [("run", None), ("rule", None), ("seeds", None), ("val", "{:.4f}"),
           ("dval", "{:+.4f}"), ("kept", "{:.3f}"), ("moe", "{:.2f}"), ("gpu", "{:.2f}"),
           ("tw", "{:.1f}"), ("grad_err", "{:.3f}"), ("dw_down_cos", "{:.4f}"),
           ("dw_down_bias", "{:.3f}"), ("dx_err", "{:.3f}"), ("dx_bias", "{:.3f}")]
SUMMARY_NAMES = {"val": "val_loss_final", "dval": "delta_val_vs_C0", "kept": "kept_share",
                 "moe": "moe_cpu_s", "gpu": "gpu_model_ms", "tw": "t_weights_pct",
                 "grad_err": "dw_down_rel_err", "dw_down_cos": "dw_down_cosine",
                 "dx_err": "dx_rel_err"}
T1 = [("target", None), ("target_loss", "{:.4f}"), ("run", None), ("reached", None),
      ("step", "{:.0f}"), ("moe_cpu_s", "{:.2f}"), ("moe_saving_pct", "{:+.1f}"),
      ("gpu_model_ms", "{:.2f}"), ("gpu_saving_pct", "{:+.1f}")]


def _write_table(path, cols, rows, names=None):
    names = names or {}
    head = []
    for k, fmt in cols:
        n = names.get(k, k)
        head += [n] if fmt is None else [n, n + "_std"]
    with open(path, "w") as f:
        f.write("\t".join(head) + "\n")
        for r in rows:
            cells = []
            for k, fmt in cols:
                v = r.get(k)
                if fmt is None:
                    cells.append("" if v is None else str(v))
                elif isinstance(v, tuple):
                    cells += _tsv_cells(v, fmt)
                else:
                    cells += [fmt.format(v) if v is not None else "", ""]
            f.write("\t".join(cells) + "\n")


def _md_rows(cols, rows, names=None):
    names = names or {}
    out = []
    for r in rows:
        d = {}
        for k, fmt in cols:
            v = r.get(k)
            n = names.get(k, k)
            if fmt is None:
                d[n] = "" if v is None else v
            elif isinstance(v, tuple):
                d[n] = pm(v[0], v[1], fmt)
            else:
                d[n] = "" if v is None else fmt.format(v)
        out.append(d)
    return [names.get(k, k) for k, _ in cols], out


# ---------------------------------------------------------------- figures

def _curve(runs, rn, xkey):
    """Per evaluated step: mean x (cumulative time), mean, min and max of
    the validation loss over the run's seeds."""
    seeds = runs[rn]["seeds"]
    pts = {}
    for sd, rows in seeds.items():
        cum = _cum_at(rows, xkey)
        for step, v in _evals(rows):
            pts.setdefault(step, []).append((cum[step], v))
    out = []
    for step in sorted(pts):
        p = pts[step]
        if len(p) != len(seeds):
            continue
        xs, ys = [a for a, _ in p], [b for _, b in p]
        out.append((sum(xs) / len(xs), sum(ys) / len(ys), min(ys), max(ys)))
    return out


# one dash pattern per series (no two alike: the figures stay readable in
# greyscale), beside each series' own colour and point type
_DT = ("1", "2", "3", "4", "5", "(16,5)", "(2,7)", "(11,4,2,4,2,4)")


def figure(outdir, base, title, names, runs, tgs):
    """base.png and base.svg: validation loss (mean over seeds, band from
    the lowest to the highest seed) against cumulative modelled GPU time and
    against cumulative measured MoE CPU time, the targets as lines."""
    dat = os.path.join(outdir, "plot-data")
    os.makedirs(dat, exist_ok=True)
    panels = [(("gpu_model_s",), 1e3, "modelled GPU time of the MoE layers (ms, cumulative)"),
              (MOE_CPU, 1.0, "measured MoE-layer CPU time (s, cumulative)")]
    plots = []
    for pi, (xkey, scale, xlabel) in enumerate(panels):
        band, line = [], []
        for i, n in enumerate(names):
            p = os.path.join(dat, f"{base}.{n}.{pi}.dat")
            with open(p, "w") as f:
                for x, m, lo, hi in _curve(runs, n, xkey):
                    f.write(f"{x * scale:.6g}\t{m:.6g}\t{lo:.6g}\t{hi:.6g}\n")
            lc = f"lc {i + 1}"
            band.append(f"'{p}' using 1:3:4 with filledcurves {lc} fs transparent solid 0.15 "
                        "noborder notitle")
            line.append(f"'{p}' using 1:2 with linespoints {lc} dt {_DT[i % len(_DT)]} pt {i + 4} "
                        f"pi 4 ps 0.8 lw 2 title '{n}'")
        tl = [f"{v:.6g} with lines lc rgb 'gray40' dt 3 lw 1 title '{t} target'"
              for t, v in tgs]
        plots.append((xlabel, band + line + tl))
    # the part where the runs differ: from above the loose target down past
    # the strict one (the first steps, from 5.5 nats down, would squeeze it)
    yr = []
    if len(tgs) == 2:
        lo, hi = sorted(v for _, v in tgs)
        yr = [f"set yrange [{lo - 0.5 * (hi - lo):.4f}:{hi + 2.0 * (hi - lo):.4f}]"]
    script = []
    for term, ext in (("pngcairo size 1200,520 font 'sans,10'", "png"),
                      ("svg size 1200,520 dynamic font 'sans,10'", "svg")):
        script += [f"set terminal {term}", f"set output '{os.path.join(outdir, base)}.{ext}'",
                   "set multiplot layout 1,2 title '" + title + "'", "set grid",
                   "set key top right box opaque font ',9'",
                   "set ylabel 'validation loss (nats/byte)'"] + yr
        for xlabel, pl in plots:
            script += [f"set xlabel '{xlabel}'", "plot " + ", ".join(pl)]
        script += ["unset multiplot", "set output"]
    gp = os.path.join(dat, base + ".gp")
    with open(gp, "w") as f:
        f.write("\n".join(script) + "\n")
    r = subprocess.run(["gnuplot", gp], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"gnuplot {gp}: {r.stderr.strip()}")
    return [base + ".png", base + ".svg"]


def _zoomed_targets(runs):
    """The two targets, mean over C0's seeds (drawn in the figures)."""
    c0 = runs.get("C0")
    if not c0:
        return []
    ts = [targets(rows) for rows in c0["seeds"].values()]
    ts = [t for t in ts if len(t) == 2]
    if not ts:
        return []
    return [(name, sum(t[i][1] for t in ts) / len(ts)) for i, name in enumerate(("loose", "strict"))]


def load_runs(outdir, specs):
    """The runs a finished study wrote (runs/seed*/NAME.tsv) for the given
    specs, as study() holds them, for --report-only."""
    runs = {}
    base = os.path.join(outdir, "runs")
    if not os.path.isdir(base):
        raise RuntimeError(f"{base}: no runs to report (run the study first)")
    for d in sorted(os.listdir(base)):
        if not d.startswith("seed"):
            continue
        sd = int(d[4:])
        for spec in specs:
            p = os.path.join(base, d, spec["name"] + ".tsv")
            if not os.path.exists(p):
                continue
            rows = read_run(p)
            runs.setdefault(spec["name"], {"spec": spec, "seeds": {}})["seeds"][sd] = rows
    return runs


def report(outdir, runs, order, rules, drops, caps, params, command):
    """Write summary, tables, figures and report.md; return report.md's path."""
    summ = summary(runs, order)
    _write_table(os.path.join(outdir, "summary.tsv"), SUMMARY, summ, SUMMARY_NAMES)
    t1 = table1(runs, order)
    _write_table(os.path.join(outdir, "table1.tsv"), T1, t1)
    t2 = table2(runs, order)
    with open(os.path.join(outdir, "table2.tsv"), "w") as f:
        f.write("run\tdelta_ppl\tdelta_ppl_std\n")
        for rn in order:
            if rn in t2:
                m, s = t2[rn]
                f.write(f"{rn}\t{'' if m is None else f'{m:.4f}'}\t"
                        f"{'' if s is None else f'{s:.4f}'}\n")
    if shutil.which("gnuplot") is None:
        raise RuntimeError("gnuplot not found (Debian package gnuplot-nox)")
    figs, tgs = [], _zoomed_targets(runs)
    if "C0" in runs:
        for c in drops:
            names = ["C0"] + [f"C{c}-{r}" for r in rules if f"C{c}-{r}" in runs]
            if len(names) > 1:
                figs += figure(outdir, f"loss-C{c}", f"C0 and C{c} per selection rule "
                               f"(mean of {len(_seeds(runs))} seeds, band: min-max)",
                               names, runs, tgs)
        capn = [n for n in order if n.startswith("cap")]
        best = [f"C{c}-lrm-sample" for c in drops if f"C{c}-lrm-sample" in runs]
        if capn:
            figs += figure(outdir, "loss-capacity", "C0, capacity-factor dropping and lrm-sample",
                           ["C0"] + capn + best, runs, tgs)
    hdr, rows = _md_rows(SUMMARY, summ, SUMMARY_NAMES)
    md = ["# lrmoe-study report", "", "Command: `" + command + "`", "",
          "Parameters: " + ", ".join(f"{k}={v}" for k, v in params.items()), "",
          "Every figure is mean ± sample standard deviation over the seeds; differences to "
          "C0 are paired by seed (same initial weights and batches).", "",
          "## Runs", "",
          "val_loss_final: validation loss at the last step; delta_val_vs_C0: paired "
          "difference (negative = better than C0); kept_share: backward pairs kept; "
          "moe_cpu_s: measured CPU seconds of the patched MoE layers (forward + backward, "
          "one thread), whole run; gpu_model_ms: lrmoe's cost model of the same plans "
          "(lrmoe_cost_eval), whole run, t_weights_pct of it moving weights and their "
          "gradients; dw_down_rel_err, dw_down_cosine, dw_down_bias, dx_rel_err, dx_bias: the "
          "kept (weighted) gradients against every pair's, mean over steps and layers "
          "(bias: ||E[estimate] - G|| / ||G||, lrmoe-score(1) --fidelity).", "",
          _md(hdr, rows)]
    hdr, rows = _md_rows(T1, t1)
    md += ["## Table 1: steps and cumulative MoE-layer time to a target validation loss", "",
           "Targets per seed from C0's curve: loose = its validation loss at the middle "
           "evaluation, strict = at the last one (C0 reaches it at its last step by "
           "definition). reached: seeds in which the run reaches it; step and times: mean "
           "over those seeds; saving: paired against C0 at the same target (positive = "
           "less time).", "", _md(hdr, rows)]
    md += ["## Table 2: mean delta-PPL (per byte) against C0", "",
           "Mean over the evaluated steps after step 0 of exp(val_loss) - exp(val_loss of "
           "C0), paired by seed; lower is better.", "",
           _md(["run", "delta_ppl"], [{"run": rn, "delta_ppl": pm(*t2[rn], "{:+.3f}")}
                                      for rn in order if rn in t2])]
    md += ["## Figures", ""] + [f"![{f}]({f})" for f in figs if f.endswith(".png")] + [""]
    path = os.path.join(outdir, "report.md")
    with open(path, "w") as f:
        f.write("\n".join(md))
    return path
