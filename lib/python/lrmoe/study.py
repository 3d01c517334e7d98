"""lrmoe-study: does backward recalibration reach the same loss sooner?

Trains a tiny random-init Qwen3-MoE causal LM (Hugging Face transformers)
on byte-level text from the Debian fortunes packages, every MoE layer's
forward and backward in liblrmoe (lrmoe.torch.patch), for C0 (every pair
kept), C10, C20, C30 (percent of backward pairs dropped, the same
proportional per-expert quotas for every rule) x the selection rules
lrm-topk (the LRMoE paper's), lrm-sample (the unbiased draw), uniform-sample
and gradnorm-topk, and Megatron-Core's capacity-factor token dropping at
1.0 and 1.25, each with several seeds paired with C0 (same init and batches
per seed); then writes a TSV per run and seed, the tables (Markdown and
TSV) and loss-against-time figures (PNG, SVG).
Run it as `lrmoe-study` or `python3 -m lrmoe.study`; see lrmoe-study(1).
With --nproc N the same study runs under torchrun, one process per
expert-parallel rank (gloo, CPU; study_run's DistCapture) and reproduces
the single-process numbers.
"""
import argparse
import json
import os
import shlex
import sys
import time

PROG = "lrmoe-study"
METRICS = ["lrm", "gradnorm", "absgrad", "random", "uniform"]
SELECTS = ["topk", "sample"]
RULES = ["lrm-topk", "lrm-sample", "uniform-sample", "gradnorm-topk"]

# the default study is sized for <= 60 minutes on a shared 2-core machine
# (two worker processes of one thread each)
DEFAULTS = dict(layers=4, hidden=128, heads=4, experts=16, topk=4, ffn=64, seq=128, batch=8,
                steps=300, eval_every=10, val_batches=32, lr=3e-3, warmup=15, ranks=4,
                seeds=3)
QUICK = dict(layers=2, hidden=64, heads=2, experts=8, topk=2, ffn=32, seq=64, batch=4,
             steps=60, eval_every=10, val_batches=16, lr=3e-3, warmup=5, ranks=2, seeds=2)


class StudyError(Exception):
    pass


class _Formatter(argparse.RawDescriptionHelpFormatter):
    def add_usage(self, usage, actions, groups, prefix=None):
        super().add_usage(usage, actions, groups, "Usage: " if prefix is None else prefix)


def _size(v):
    """A budget for messages: bytes in adaptive binary units ("1.5 MiB", as
    liblrmoe prints them); a string (--hbm as given) as it is."""
    if isinstance(v, str):
        return v
    v, u = float(v), 0
    while abs(v) >= 1024 and u < 6:
        v, u = v / 1024, u + 1
    unit = ("B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB")[u]
    return f"{v:.0f} {unit}" if u == 0 or abs(v) >= 100 else f"{v:.3g} {unit}"


def parser():
    p = argparse.ArgumentParser(
        prog=PROG, formatter_class=_Formatter,
        usage=f"{PROG} [options]",
        description="Train a tiny Qwen3-MoE LM through liblrmoe for C0/C10/C20/C30 x "
                    "selection rules and the capacity-factor baseline, several seeds paired "
                    "with C0; write per-run TSVs, tables and loss-against-time figures into "
                    "--out.",
        epilog="Exit status: 0 success, 1 failure (bad corpus, training or plotting "
               "error, --check-hf mismatch), 2 usage.  See lrmoe-study(1).")
    a = p.add_argument
    a("-o", "--out", default="lrmoe-study-out", help="output directory (default %(default)s)")
    a("--quick", action="store_true",
      help="the small study (2 layers, 60 steps, 2 seeds: a few minutes)")
    a("-c", "--corpus", action="append", metavar="PATH",
      help="text file or directory (repeatable; default /usr/share/games/fortunes)")
    a("--runs", metavar="LIST",
      help="comma-separated subset of runs: C0, C<n>-<metric>-<select>, cap<F>, "
           "hbm-<metric>-<select>, hf")
    a("--drops", default="10,20,30", metavar="LIST",
      help="percent of backward pairs dropped, comma-separated (default %(default)s)")
    a("--rules", default=",".join(RULES), metavar="LIST",
      help="selection rules <metric>-<select>: metric lrm, gradnorm, absgrad, random or "
           "uniform, select topk or sample (default %(default)s)")
    a("--metrics", metavar="LIST",
      help="old form of --rules: each metric with topk")
    a("--capacity", default="1.0,1.25", metavar="LIST",
      help="capacity factors of the Megatron-Core token-dropping baseline, or 'none' "
           "(default %(default)s)")
    a("--quota", default="proportional", metavar="POLICY",
      help="per-expert quota policy of the dropped runs (lrmoe-plan -q; default "
           "%(default)s: the same quotas for every rule)")
    a("--seeds", type=int, metavar="N", help="seeds per run, paired with C0's (default 3; "
      "--quick 2): --seed, --seed+1, ...")
    a("-j", "--jobs", type=int, metavar="N",
      help=f"runs trained at once, in worker processes (default {min(2, os.cpu_count() or 1)}; "
           "1 with --nproc)")
    a("--nproc", type=int, metavar="N",
      help="train each run under torchrun with N processes, one expert-parallel rank each "
           "(lrmoe.torch.patch(group=); gloo, CPU): the dense layers run on the whole batch "
           "in every process, each MoE layer's tokens and experts are split over them; the "
           "same numbers as a study in one process with --ranks N (the default --ranks "
           "then); rank 0 writes --out")
    a("--hbm-run", metavar="RULE", nargs="?", const="lrm-sample",
      help="add the memory-pressure run with this rule (default lrm-sample)")
    a("--hbm", metavar="BYTES",
      help="per-rank budget of the memory-pressure run (default: --hbm-frac of C0's "
           "modelled peak at step 0)")
    a("--hbm-frac", type=float, default=0.9, metavar="F",
      help="fraction of C0's modelled peak for the budget (default %(default)s)")
    a("--no-hbm", action="store_true", help=argparse.SUPPRESS)  # the 0.4 default, now off
    for k in ("layers", "hidden", "heads", "experts", "topk", "ffn", "seq", "batch",
              "steps", "ranks"):
        a(f"--{k}", type=int, metavar="N", help=f"model/training size (default {DEFAULTS[k]}; "
          f"--quick {QUICK[k]})")
    a("--eval-every", type=int, metavar="N", help="validation every N steps (default 10; "
      "--quick 10)")
    a("--val-batches", type=int, metavar="N", help="validation windows (default 32; --quick 16)")
    a("--lr", type=float, metavar="X", help="peak AdamW learning rate (default 3e-3)")
    a("--warmup", type=int, metavar="N", help="linear warm-up steps (default 15)")
    a("--clip", type=float, default=1.0, metavar="X", help="gradient-norm clip (default 1)")
    a("--seed", type=int, default=0, metavar="N", help="first seed: model init, selection and "
      "batch order of seed i are --seed+i and --data-seed+i (default 0)")
    a("--data-seed", type=int, default=0, metavar="N", help="first batch-order seed (default 0)")
    a("--threads", type=int, default=1, metavar="N", help="torch and liblrmoe threads "
      "(default 1)")
    a("--aux-loss", type=float, default=0.0, metavar="X",
      help="Switch-style auxiliary balance loss coefficient (default 0: none)")
    a("--bias-rate", type=float, default=0.0, metavar="X",
      help="auxiliary-loss-free balance: per-step router bias update (default 0: off)")
    a("--report-only", action="store_true",
      help="write the tables and figures again from the run TSVs already in --out")
    a("--check-hf", type=int, default=0, metavar="N",
      help="only check: N steps of C0 through lrmoe against the unpatched model; exit 1 if "
           "the training loss differs by more than --tol")
    a("--tol", type=float, default=1e-4, metavar="X",
      help="relative tolerance of --check-hf (default %(default)s)")
    a("--exact", action="store_true",
      help="write every number of the run TSVs with all its digits, not rounded (to compare "
           "two studies bit for bit, e.g. --nproc against one process)")
    a("-V", "--version", action="store_true", help="print the version and exit")
    return p


def config(args):
    base = dict(QUICK if args.quick else DEFAULTS)
    if args.nproc is not None:
        if args.nproc < 1:
            raise UsageError("--nproc must be >= 1")
        if args.ranks is not None and args.ranks != args.nproc:
            raise UsageError(f"--ranks {args.ranks} and --nproc {args.nproc}: one process per "
                             "rank (leave --ranks out or make them equal)")
        if args.check_hf or args.report_only:
            raise UsageError("--nproc trains the study's runs; --check-hf and --report-only "
                             "are single-process")
        if args.jobs is not None and args.jobs != 1:
            raise UsageError("--jobs and --nproc: under --nproc the runs train one at a time")
        base["ranks"] = args.nproc
    for k in list(base):
        v = getattr(args, k, None)
        if v is not None:
            base[k] = v
    for k in ("clip", "seed", "data_seed", "threads", "aux_loss", "bias_rate"):
        base[k] = getattr(args, k)
    cfg = argparse.Namespace(**base)
    for k in ("layers", "hidden", "heads", "experts", "topk", "ffn", "seq", "batch", "steps",
              "ranks", "eval_every", "val_batches", "threads", "seeds"):
        if getattr(cfg, k) < 1:
            raise UsageError(f"--{k.replace('_', '-')} must be >= 1")
    if cfg.hidden % cfg.heads:
        raise UsageError("--hidden must be a multiple of --heads")
    if cfg.experts % cfg.ranks:
        raise UsageError(f"--experts {cfg.experts} do not split over --ranks {cfg.ranks}")
    if cfg.topk > cfg.experts:
        raise UsageError("--topk must not exceed --experts")
    return cfg


class UsageError(Exception):
    pass


def _list(s, what):
    out = [x.strip() for x in s.split(",") if x.strip()]
    if not out:
        raise UsageError(f"--{what}: empty list")
    return out


def _rule(r, what):
    m, _, sel = r.partition("-")
    if m not in METRICS or sel not in SELECTS:
        raise UsageError(f"--{what}: unknown rule '{r}' (<metric>-<select>: metric "
                         f"{', '.join(METRICS)}; select topk or sample)")
    return m, sel


def run_specs(args):
    """The runs of one seed, C0 first; (specs, rules, drops, capacities)."""
    rules = ([f"{m}-topk" for m in _list(args.metrics, "metrics")] if args.metrics
             else _list(args.rules, "rules"))
    for r in rules:
        _rule(r, "metrics" if args.metrics else "rules")
    drops = []
    for d in _list(args.drops, "drops"):
        try:
            c = int(d)
        except ValueError:
            raise UsageError(f"--drops: '{d}' is not an integer percent") from None
        if not 0 < c < 100:
            raise UsageError(f"--drops: {c} is outside (0,100)")
        drops.append(c)
    caps = []
    if args.capacity.strip().lower() not in ("none", ""):
        for v in _list(args.capacity, "capacity"):
            try:
                f = float(v)
            except ValueError:
                raise UsageError(f"--capacity: '{v}' is not a number") from None
            if not f > 0:
                raise UsageError(f"--capacity: {v} must be > 0")
            caps.append(f)
    specs = [dict(name="C0", patched=True, rate=1.0, metric="lrm", select="topk")]
    for c in drops:
        for r in rules:
            m, sel = _rule(r, "rules")
            specs.append(dict(name=f"C{c}-{r}", patched=True, rate=1 - c / 100, metric=m,
                              select=sel, quota=args.quota, drop=c, rule=r))
    for f in caps:
        specs.append(dict(name=f"cap{f:g}", patched=True, rate=None, metric="lrm",
                          select="topk", capacity=f, rule=f"capacity {f:g}"))
    if args.hbm_run:
        m, sel = _rule(args.hbm_run, "hbm-run")
        specs.append(dict(name=f"hbm-{args.hbm_run}", patched=True, rate=None, metric=m,
                          select=sel, hbm=args.hbm, hbm_run=True, rule=args.hbm_run))
    specs.append(dict(name="hf", patched=False))
    if args.runs:
        want = _list(args.runs, "runs")
        known = {s["name"] for s in specs}
        for w in want:
            if w not in known:
                raise UsageError(f"--runs: unknown run '{w}' (one of {', '.join(sorted(known))})")
        specs = [s for s in specs if s["name"] in want]
    else:
        specs = [s for s in specs if s["name"] != "hf"]
    return specs, rules, drops, caps


_RANK = [0]  # this process's rank under --nproc


def log(msg):
    if _RANK[0] == 0:
        print(f"{PROG}: {msg}", file=sys.stderr, flush=True)


def load_corpus(args, cfg):
    from .study_data import DEFAULT_CORPUS, Corpus
    paths = args.corpus or [DEFAULT_CORPUS]
    need_train = 4 * cfg.batch * (cfg.seq + 1)
    need_val = cfg.val_batches * (cfg.seq + 1)
    c = Corpus(paths, need_train=need_train, need_val=need_val)
    # what a worker process needs to load the same corpus (study -j)
    c.default, c.need_train, c.need_val = DEFAULT_CORPUS, need_train, need_val
    return c


def check_hf(args, cfg, corpus):
    from .study_run import train
    cfg.steps = args.check_hf
    cfg.eval_every = cfg.steps + 1
    hf = train(cfg, corpus, dict(name="hf", patched=False))
    lr = train(cfg, corpus, dict(name="C0", patched=True, rate=1.0, metric="lrm"))
    worst = 0.0
    for a, b in zip(hf, lr):
        rel = abs(a["loss"] - b["loss"]) / max(abs(a["loss"]), 1e-30)
        worst = max(worst, rel)
        print(f"{a['step']}\t{a['loss']:.8g}\t{b['loss']:.8g}\t{rel:.3g}")
    ok = worst <= args.tol
    log(f"check-hf: {cfg.steps} steps, largest relative training-loss difference "
        f"{worst:.3g} (tolerance {args.tol:g}): {'ok' if ok else 'MISMATCH'}")
    return 0 if ok else 1


def _job(cfg, corpus_args, spec, seed, data_seed):
    """One (run, seed) in a worker process: its per-step rows."""
    import argparse as _a
    from .study_run import train
    c = _a.Namespace(**vars(cfg))
    c.seed, c.data_seed = seed, data_seed
    corpus = corpus_args if not isinstance(corpus_args, tuple) else _load(*corpus_args)
    t0 = time.time()
    rows = train(c, corpus, spec)
    return rows, time.time() - t0


_CORPUS = {}


def _load(paths, need_train, need_val):
    key = (tuple(paths), need_train, need_val)
    if key not in _CORPUS:
        from .study_data import Corpus
        _CORPUS[key] = Corpus(list(paths), need_train=need_train, need_val=need_val)
    return _CORPUS[key]


def study(args, cfg, corpus):
    from .study_report import read_run, report, write_run
    specs, rules, drops, caps = run_specs(args)
    out = args.out
    seeds = [(args.seed + i, args.data_seed + i) for i in range(cfg.seeds)]
    nproc = getattr(cfg, "nproc", None)
    writer = _RANK[0] == 0  # under --nproc rank 0 writes, the others train alongside
    for sd, _ in seeds if writer else []:
        os.makedirs(os.path.join(out, "runs", f"seed{sd}"), exist_ok=True)
    runs, t_all = {}, time.time()
    log(f"corpus: {len(corpus.files)} files, {corpus.train.size} training and "
        f"{corpus.val.size} validation bytes; {len(specs)} runs x {len(seeds)} seeds of "
        f"{cfg.steps} steps, {args.jobs} at a time -> {out}")
    # C0 first (the memory-pressure run's budget and every target come from it)
    first = [s for s in specs if not s.get("hbm_run")]
    later = [s for s in specs if s.get("hbm_run")]
    cargs = (tuple(args.corpus or [corpus.default]), corpus.need_train, corpus.need_val)
    done = [0]
    total = len(specs) * len(seeds)

    def finish(spec, sd, rows, secs):
        path = os.path.join(out, "runs", f"seed{sd}", spec["name"] + ".tsv")
        if writer:
            write_run(path, rows, args.exact)
            rows = read_run(path)  # the report from what the TSV holds, as --report-only
        if nproc:  # every rank goes on with rank 0's rows (the hbm budget comes from them)
            import torch.distributed as dist
            box = [rows, secs]
            dist.broadcast_object_list(box, src=0)
            rows, secs = box
        runs.setdefault(spec["name"], {"spec": spec, "seeds": {}})["seeds"][sd] = rows
        done[0] += 1
        ev = [r["val_loss"] for r in rows if r.get("val_loss") is not None]
        log(f"[{done[0]}/{total}] {spec['name']} seed {sd}: {secs:.0f} s, final train loss "
            f"{rows[-1]['loss']:.4f}, validation {ev[-1]:.4f}")

    def run_batch(batch):
        if args.jobs <= 1:
            for spec, sd, ds in batch:
                if nproc and not spec["patched"] and not writer:
                    rows, secs = None, 0.0  # nothing to split: rank 0 trains it alone
                else:
                    rows, secs = _job(cfg, corpus, spec, sd, ds)
                finish(spec, sd, rows, secs)
            return
        import concurrent.futures as cf
        import multiprocessing as mp
        with cf.ProcessPoolExecutor(args.jobs, mp_context=mp.get_context("spawn")) as ex:
            futs = {ex.submit(_job, cfg, cargs, spec, sd, ds): (spec, sd) for spec, sd, ds in batch}
            for fu in cf.as_completed(futs):
                spec, sd = futs[fu]
                rows, secs = fu.result()
                finish(spec, sd, rows, secs)

    if not args.report_only:
        run_batch([(s, sd, ds) for s in first for sd, ds in seeds])
    for spec in later if not args.report_only else []:
        batch = []
        for sd, ds in seeds:
            sp = dict(spec)
            if sp.get("hbm") is None:
                if "C0" not in runs:
                    raise StudyError("the memory-pressure run needs --hbm BYTES when C0 is "
                                     "not run")
                sp["hbm"] = int(args.hbm_frac * runs["C0"]["seeds"][sd][0]["mem_peak_bytes"])
            sp["rates"] = "1,0.95,0.9,0.85,0.8,0.75,0.7,0.65,0.6,0.55,0.5"
            batch.append((sp, sd, ds))
        run_batch(batch)
    if args.report_only:
        from .study_report import load_runs
        runs = load_runs(out, specs)
        if not runs:
            raise StudyError(f"{out}: none of the runs' TSVs is there")
    if not writer:
        return 0
    params = dict(vars(cfg))
    params.pop("rank", None)
    params["jobs"] = args.jobs
    params["quota"] = args.quota
    params["seeds"] = ",".join(str(sd) for sd, _ in seeds)
    params["corpus"] = ",".join(args.corpus or [corpus.default])
    order = [s["name"] for s in specs if s["name"] in runs]
    path = report(out, runs, order, rules, drops, caps, params,
                  " ".join(shlex.quote(a) for a in [PROG] + sys.argv[1:]))
    log(f"done in {time.time() - t_all:.0f} s: {path}")
    return 0


_WORKER = "LRMOE_STUDY_NPROC"  # set for the processes torchrun starts
# what each process runs (lrmoe-study's own boot: torch before lrmoe); the
# arguments come in the environment (torchrun would parse --nproc itself)
_BOOT = ("import json, os, runpy, sys\n"
         "try:\n    import torch\nexcept ImportError:\n    pass\n"
         "import lrmoe\n"
         "sys.argv = ['lrmoe-study'] + json.loads(os.environ['LRMOE_STUDY_ARGV'])\n"
         "runpy.run_module('lrmoe.study', run_name='__main__', alter_sys=True)\n")


def _check_dist():
    """--nproc needs torch.distributed with gloo and torchrun."""
    try:
        import torch.distributed as dist
        ok = dist.is_available() and dist.is_gloo_available()
    except ImportError as e:
        raise StudyError(f"--nproc: torch.distributed does not import ({e})") from None
    if not ok:
        raise StudyError("--nproc: this torch has no torch.distributed with the gloo backend")
    import importlib.util
    if importlib.util.find_spec("torch.distributed.run") is None:
        raise StudyError("--nproc: torch.distributed.run (torchrun) is missing from this torch")


def launch(n, argv, cfg):
    """--nproc N: exec torchrun (python -m torch.distributed.run of this
    interpreter) --standalone --nproc-per-node N, each process this study
    with the same arguments."""
    env = dict(os.environ)
    env[_WORKER] = str(n)
    env["LRMOE_STUDY_ARGV"] = json.dumps(list(argv))
    env.setdefault("OMP_NUM_THREADS", str(cfg.threads))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc-per-node={n}", "--no-python", sys.executable, "-c", _BOOT]
    log(f"--nproc {n}: torchrun --standalone --nproc-per-node {n} (gloo, CPU)")
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, cmd, env)


def _init_group(n, cfg):
    """This process's rank of the torchrun job (gloo)."""
    import datetime
    import torch.distributed as dist
    t = float(os.environ.get("LRMOE_STUDY_TIMEOUT", "600"))
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=t))
    if dist.get_world_size() != n:
        raise StudyError(f"--nproc {n}, but torchrun started {dist.get_world_size()} processes")
    _RANK[0] = dist.get_rank()
    cfg.nproc, cfg.rank = n, _RANK[0]


def _end_group():
    """Every rank waits for rank 0's report, then the group closes and its
    gloo threads end before the interpreter does (a rank leaving early can
    abort gloo in a peer; a gloo worker still running when Python exits can
    abort this process: lrmoe.dist.shutdown)."""
    from . import dist as ldist
    try:
        ldist.shutdown()
    except ldist.Error as e:
        raise StudyError(str(e)) from None


def main(argv=None):
    p = parser()
    try:
        args = p.parse_args(argv)
    except SystemExit as e:
        return int(e.code or 0)
    if args.version:
        from . import __version__
        print(f"{PROG} (lrmoe) {__version__}")
        return 0
    try:
        cfg = config(args)
        if args.jobs is None:
            args.jobs = 1 if args.nproc else min(2, os.cpu_count() or 1)
        if args.jobs < 1:
            raise UsageError("--jobs must be >= 1")
        if not args.check_hf:
            run_specs(args)  # a bad list fails before any training
    except UsageError as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return 2
    try:
        from .study_data import CorpusError
        try:
            corpus = load_corpus(args, cfg)
        except CorpusError as e:
            raise StudyError(f"corpus: {e}") from None
        if args.nproc and os.environ.get(_WORKER) != str(args.nproc):
            _check_dist()
            os.makedirs(args.out, exist_ok=True)  # a bad --out: one error, before torchrun
            return launch(args.nproc, sys.argv[1:] if argv is None else argv, cfg)
        if args.nproc:
            _init_group(args.nproc, cfg)
            rc = study(args, cfg, corpus)
            _end_group()
            return rc
        return check_hf(args, cfg, corpus) if args.check_hf else study(args, cfg, corpus)
    except UsageError as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # a path error reads "PATH: why", not "[Errno N] ..."
        where = e.filename if e.filename is not None else ""
        print(f"{PROG}: {where}{': ' if where else ''}{e.strerror or e}", file=sys.stderr)
        return 1
    except (StudyError, RuntimeError, ImportError) as e:
        who = f"rank {_RANK[0]}: " if args.nproc and _RANK[0] else ""
        print(f"{PROG}: {who}{e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
