"""lrmoe-study's outputs from the per-run rows: the run TSVs, the two
tables (Markdown and TSV) and the loss figures (gnuplot, PNG and SVG).

Table 1 (the paper's Table 1 at small scale): two target validation
losses taken from C0's own curve (its value at the middle evaluation and
at the last one); per run, the first evaluated step whose validation loss
reaches the target, the cumulative measured MoE-layer seconds (forward +
backward of all patched layers) and modelled GPU seconds up to that step,
and the saving in those seconds against C0.

Table 2: per metric and C, the mean over the evaluated steps after step 0
of exp(val_loss) - exp(val_loss of C0) (perplexity per byte)."""
import math
import os
import shutil
import subprocess

from .study_run import FIELDS


def _fmt(v):
    if v is None or v == "":
        return ""
    if isinstance(v, float):
        return f"{v:.6g}"
    return str(v)


def write_tsv(path, header, rows):
    with open(path, "w") as f:
        f.write("\t".join(header) + "\n")
        for r in rows:
            f.write("\t".join(_fmt(r.get(h)) for h in header) + "\n")


def write_run(path, rows):
    write_tsv(path, FIELDS, rows)


def _evals(rows):
    return [(r["step"], r["val_loss"]) for r in rows if r.get("val_loss") is not None]


def _cum(rows, key):
    out, s = {}, 0.0
    for r in rows:
        s += r.get(key) or 0.0
        out[r["step"]] = s
    return out


def targets(c0):
    ev = _evals(c0)
    if len(ev) < 3:
        return []
    return [("loose", ev[len(ev) // 2][1]), ("strict", ev[-1][1])]


def reach(rows, target):
    """(step, cumulative MoE-layer CPU s, cumulative modelled GPU s) at the
    first evaluation reaching target, or None. The MoE time is the calling
    thread's CPU seconds of the patched layers' forward and backward (with
    one thread all of their work; wall time on a shared machine counts the
    other jobs too)."""
    moe = {}
    s = 0.0
    for r in rows:
        s += (r.get("moe_fwd_cpu_s") or 0.0) + (r.get("moe_bwd_cpu_s") or 0.0)
        moe[r["step"]] = s
    gpu = _cum(rows, "gpu_model_s")
    for step, v in _evals(rows):
        if v <= target:
            return step, moe[step], gpu[step]
    return None


def table1(runs, order):
    """Rows of Table 1 (dicts) for every run, both targets."""
    c0 = runs.get("C0")
    if c0 is None:
        return [], []
    tg = targets(c0["rows"])
    out = []
    for name, target in tg:
        base = reach(c0["rows"], target)
        for rn in order:
            r = reach(runs[rn]["rows"], target)
            row = {"target": name, "target_loss": target, "run": rn}
            if r is None:
                row.update(steps="not reached")
            else:
                row.update(steps=r[0], moe_cpu_s=r[1], gpu_model_s=r[2])
                if base and base[1] > 0:
                    row["moe_saving_pct"] = 100.0 * (1 - r[1] / base[1])
                if base and base[2] > 0:
                    row["gpu_saving_pct"] = 100.0 * (1 - r[2] / base[2])
            out.append(row)
    return tg, out


T1 = ["target", "target_loss", "run", "steps", "moe_cpu_s", "moe_saving_pct", "gpu_model_s",
      "gpu_saving_pct"]


def table2(runs, metrics, drops):
    """{(metric, C): mean delta-PPL against C0} over the common evaluations."""
    c0 = runs.get("C0")
    if c0 is None:
        return {}
    base = dict(_evals(c0["rows"]))
    out = {}
    for m in metrics:
        for c in drops:
            r = runs.get(f"C{c}-{m}")
            if r is None:
                continue
            d = [math.exp(v) - math.exp(base[s]) for s, v in _evals(r["rows"])
                 if s > 0 and s in base]
            if d:
                out[(m, c)] = sum(d) / len(d)
    return out


def summary(runs, order):
    out = []
    for rn in order:
        rows = runs[rn]["rows"]
        ev = _evals(rows)
        tail = rows[-min(10, len(rows)):]
        s = {"run": rn, "steps": len(rows),
             "train_loss_last10": sum(r["loss"] for r in tail) / len(tail),
             "val_loss_final": ev[-1][1] if ev else None}
        if rows and rows[0].get("pairs"):
            s["rho_mean"] = sum(r["rho"] for r in rows) / len(rows)
            s["kept_share"] = sum(r["kept"] for r in rows) / sum(r["pairs"] for r in rows)
            s["grad_err_mean"] = sum(r["grad_err"] for r in rows) / len(rows)
            s["moe_s"] = sum(r["moe_fwd_s"] + r["moe_bwd_s"] for r in rows)
            s["moe_cpu_s"] = sum(r["moe_fwd_cpu_s"] + r["moe_bwd_cpu_s"] for r in rows)
            s["moe_bwd_cpu_s"] = sum(r["moe_bwd_cpu_s"] for r in rows)
            s["lib_s"] = sum(r["lib_fwd_s"] + r["lib_bwd_s"] for r in rows)
            s["gpu_model_s"] = sum(r["gpu_model_s"] for r in rows)
        out.append(s)
    return out


SUMMARY = ["run", "steps", "train_loss_last10", "val_loss_final", "rho_mean", "kept_share",
           "grad_err_mean", "moe_s", "moe_cpu_s", "moe_bwd_cpu_s", "lib_s", "gpu_model_s"]


def _md(header, rows):
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in rows:
        lines.append("| " + " | ".join(_fmt(r.get(h)) for h in header) + " |")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- figures

def _series(path, rows, key, smooth=1):
    """step, value (a trailing moving mean over `smooth` steps) to path."""
    with open(path, "w") as f:
        buf = []
        for r in rows:
            v = r.get(key)
            if v is None:
                continue
            buf.append(v)
            buf = buf[-smooth:]
            f.write(f"{r['step']}\t{sum(buf) / len(buf):.6g}\n")


def figure(outdir, base, title, names, runs, smooth):
    """base.png and base.svg: training loss (moving mean) of the named
    runs over the whole run, and their validation loss from the first
    fifth of the run on (where the runs differ), two panels."""
    zoom = len(runs[names[0]]["rows"]) // 5
    dat = os.path.join(outdir, "plot-data")
    os.makedirs(dat, exist_ok=True)
    plots = {"loss": [], "val_loss": []}
    for n in names:
        for key in plots:
            p = os.path.join(dat, f"{n}.{key}.dat")
            _series(p, runs[n]["rows"], key, smooth if key == "loss" else 1)
            plots[key].append(f"'{p}' using 1:2 with lines lw 2 title '{n}'")
    script = []
    for term, ext in (("pngcairo size 1200,500 font 'sans,10'", "png"),
                      ("svg size 1200,500 dynamic font 'sans,10'", "svg")):
        script += [f"set terminal {term}", f"set output '{os.path.join(outdir, base)}.{ext}'",
                   "set multiplot layout 1,2 title '" + title + "'",
                   "set grid", "set key top right", "set xlabel 'step'",
                   "set ylabel 'loss (nats/byte)'",
                   f"set title 'training loss (mean of last {smooth} steps)'",
                   "plot " + ", ".join(plots["loss"]),
                   f"set title 'validation loss (from step {zoom})'",
                   f"set xrange [{zoom}:*]", "plot " + ", ".join(plots["val_loss"]),
                   "set xrange [*:*]",
                   "unset multiplot", "set output"]
    gp = os.path.join(dat, base + ".gp")
    with open(gp, "w") as f:
        f.write("\n".join(script) + "\n")
    r = subprocess.run(["gnuplot", gp], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"gnuplot {gp}: {r.stderr.strip()}")
    return [base + ".png", base + ".svg"]


def report(outdir, runs, order, metrics, drops, params, command):
    """Write summary, tables, figures and report.md; return report.md's path."""
    write_tsv(os.path.join(outdir, "summary.tsv"), SUMMARY, summary(runs, order))
    tg, t1 = table1(runs, order)
    write_tsv(os.path.join(outdir, "table1.tsv"), T1, t1)
    t2 = table2(runs, metrics, drops)
    with open(os.path.join(outdir, "table2.tsv"), "w") as f:
        f.write("metric\t" + "\t".join(f"C{c}" for c in drops) + "\n")
        for m in metrics:
            f.write(m + "\t" + "\t".join(_fmt(t2.get((m, c))) for c in drops) + "\n")
    figs = []
    if shutil.which("gnuplot") is None:
        raise RuntimeError("gnuplot not found (Debian package gnuplot-nox)")
    smooth = max(1, min(10, len(next(iter(runs.values()))["rows"]) // 10))
    if "C0" in runs:
        for c in drops:
            names = ["C0"] + [f"C{c}-{m}" for m in metrics if f"C{c}-{m}" in runs]
            if len(names) > 1:
                figs += figure(outdir, f"loss-C{c}", f"C0 and C{c} per selection metric",
                               names, runs, smooth)
        for m in metrics:
            names = ["C0"] + [f"C{c}-{m}" for c in drops if f"C{c}-{m}" in runs] + \
                    [n for n in order if n.startswith("hbm-") and n.endswith(m)]
            if len(names) > 1:
                figs += figure(outdir, f"loss-{m}", f"{m}: C0, C" + "/C".join(map(str, drops))
                               + " and the memory-pressure run", names, runs, smooth)
    md = ["# lrmoe-study report", "", "Command: `" + command + "`", "",
          "Parameters: " + ", ".join(f"{k}={v}" for k, v in params.items()), "",
          "## Runs", "", _md(SUMMARY, summary(runs, order))]
    md += ["## Table 1: steps and cumulative MoE-layer time to a target validation loss", "",
           "Targets from C0's curve: " + ", ".join(f"{n} = {v:.4f}" for n, v in tg) +
           ". moe_cpu_s: measured CPU seconds of the patched MoE layers' forward and "
           "backward on this machine (one thread), cumulative to the step; gpu_model_s: "
           "lrmoe's cost model of the same plans (lrmoe_cost_eval, default H100-class "
           "bandwidth and FLOP/s). saving: against C0 (positive = less time).", "",
           _md(T1, t1)]
    md += ["## Table 2: mean delta-PPL (per byte) against C0", "",
           "Mean over the evaluated steps after step 0 of exp(val_loss) - "
           "exp(val_loss of C0); lower is better.", "",
           _md(["metric"] + [f"C{c}" for c in drops],
               [dict({"metric": m}, **{f"C{c}": t2.get((m, c)) for c in drops})
                for m in metrics])]
    md += ["## Figures", ""] + [f"![{f}]({f})" for f in figs if f.endswith(".png")] + [""]
    path = os.path.join(outdir, "report.md")
    with open(path, "w") as f:
        f.write("\n".join(md))
    return path
