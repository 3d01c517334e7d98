#!/usr/bin/env python3
"""Check every CUDA kernel's resources against the launch it gets.

    resources.py --table TABLE --ptxas REPORT... --src FILE.cu...

TABLE: the launch table (tests/gpu/launch-table, one row a kernel:
NAME THREADS DYNAMIC_SHARED_BYTES LOCAL_BUDGET_BYTES). REPORT: the ptxas
report (nvcc -Xptxas -v) of one .cu file, named FILE.ptxas. FILE.cu: the
sources whose launches and kernel definitions are linted.

A kernel FAILS when, on the architecture the report names,
  - its registers, allocated per warp in units of 256 (so a thread's count
    rounds up to 8), times the warps of its block exceed the registers of a
    block (the launch would fail with cudaErrorLaunchOutOfResources);
  - its block is above 1024 threads or not a multiple of 32;
  - its static shared memory plus the table's most dynamic shared memory
    exceed 48 KiB (the most a block gets without an opt-in, which nothing
    here asks for);
  - its stack frame or spill stores exceed the table's local budget;
  - it uses more than 16 named barriers;
and the check fails when a kernel has no table row, a row names no kernel,
a launch's block size is not KCU_THREADS(<that kernel>), a kernel's
__launch_bounds__ is not KCU_THREADS(<itself>), or a kernel whose block is
above 256 threads has no __launch_bounds__ (below that even 255 registers a
thread fit a block; above it only the bound makes ptxas fit them, and
today's count may not survive the next compiler). Kernels in a namespace
(CUB's) are launched by their library with its own __launch_bounds__; they
are listed, checked against the per-thread limits only.
Prints one line a kernel and a verdict; exit 0 when nothing fails.
"""
import argparse
import os
import re
import sys

# per-architecture limits that differ from the defaults below
REGS_PER_BLOCK = {"sm_53": 32768, "sm_62": 32768}
DEFAULT_REGS_PER_BLOCK = 65536
MAX_REGS_PER_THREAD = 255
MAX_THREADS = 1024
SHARED_PER_BLOCK = 48 * 1024
MAX_BARRIERS = 16
REG_UNIT = 256  # registers are allocated to a warp in units of 256
UNBOUNDED_MAX = 256  # 255 registers (256 allocated) x 256 threads = 65536


def kernel_name(mangled):
    """(base name, library?) of a kernel's symbol: _Z<len><name>... is a
    function at global scope (templates included), _ZN... is in a namespace
    or class, an unmangled symbol is extern "C"."""
    m = re.match(r"_Z(\d+)", mangled)
    if m:
        n = int(m.group(1))
        return mangled[m.end():m.end() + n], False
    if mangled.startswith("_Z"):
        return mangled, True
    return mangled, False


def lib_short(mangled):
    """A library kernel's short name: the last *Kernel among the
    length-prefixed names of its symbol (DeviceRadixSortOnesweepKernel)."""
    names, i = [], 0
    while i < len(mangled):
        m = re.match(r"(\d+)", mangled[i:])
        if not m:
            i += 1
            continue
        n, j = int(m.group(1)), i + m.end()
        word = mangled[j:j + n]
        if n and re.match(r"[A-Za-z_]\w*$", word):
            names.append(word)
            i = j + n
        else:
            i = j
    ks = [w for w in names if w.endswith("Kernel")]
    return ks[-1] if ks else (names[-1] if names else mangled)


def parse_ptxas(path):
    """[{sym, arch, regs, smem, stack, spill_st, spill_ld, barriers}] of the
    entry functions in one ptxas -v report."""
    out, cur, props_for = [], None, None
    for line in open(path, errors="replace"):
        m = re.search(r"Compiling entry function '([^']+)' for '(\w+)'", line)
        if m:
            cur = {"sym": m.group(1), "arch": m.group(2), "regs": None, "smem": 0,
                   "stack": 0, "spill_st": 0, "spill_ld": 0, "barriers": 0}
            out.append(cur)
            props_for = None
            continue
        m = re.search(r"Function properties for (\S+)", line)
        if m:
            props_for = m.group(1)
            continue
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads",
                      line)
        if m and cur and props_for == cur["sym"]:
            cur["stack"], cur["spill_st"], cur["spill_ld"] = map(int, m.groups())
            continue
        m = re.search(r"Used (\d+) registers", line)
        if m and cur and cur["regs"] is None:
            cur["regs"] = int(m.group(1))
            b = re.search(r"used (\d+) barriers", line)
            s = re.search(r"(\d+) bytes smem", line)
            cur["barriers"] = int(b.group(1)) if b else 0
            cur["smem"] = int(s.group(1)) if s else 0
    for k in out:
        if k["regs"] is None:
            raise SystemExit("resources: %s: no register count for %s" % (path, k["sym"]))
    return out


def strip_comments(src):
    src = re.sub(r"/\*.*?\*/", lambda m: re.sub(r"[^\n]", " ", m.group(0)), src, flags=re.S)
    return re.sub(r"//[^\n]*", "", src)


def balanced(src, i):
    """src[i] == '(' ... index after its matching ')'."""
    depth = 0
    for j in range(i, len(src)):
        if src[j] == "(":
            depth += 1
        elif src[j] == ")":
            depth -= 1
            if depth == 0:
                return j + 1
    raise ValueError("unbalanced parentheses")


def split_top(s):
    """s split at commas outside parentheses, brackets and angle brackets."""
    parts, depth, cur = [], 0, ""
    for ch in s:
        if ch in "([{<":
            depth += 1
        elif ch in ")]}>":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur.strip())
            cur = ""
        else:
            cur += ch
    parts.append(cur.strip())
    return parts


def lint(path, table, problems):
    """Kernels defined and launched in one source, with their problems."""
    src = strip_comments(open(path).read())
    rel = os.path.basename(path)
    defined, launched = set(), set()
    for m in re.finditer(r"__global__\s+void\s+", src):
        i, bound = m.end(), None
        if src.startswith("__launch_bounds__", i):
            j = src.index("(", i)
            k = balanced(src, j)
            bound = re.sub(r"\s+", "", src[j + 1:k - 1])
            i = k
        n = re.match(r"\s*(\w+)\s*\(", src[i:])
        if not n:
            continue
        name = n.group(1)
        defined.add(name)
        line = src.count("\n", 0, m.start()) + 1
        threads = table[name]["threads"] if name in table else 0
        if bound is None and threads > UNBOUNDED_MAX:
            problems.append("%s:%d: kernel %s: %d threads a block and no "
                            "__launch_bounds__(KCU_THREADS(%s))" % (rel, line, name, threads, name))
        elif bound is not None and bound != "KCU_THREADS(%s)" % name:
            problems.append("%s:%d: kernel %s: __launch_bounds__(%s), not KCU_THREADS(%s)"
                            % (rel, line, name, bound, name))
    for m in re.finditer(r"\b(\w+)\s*(<[^<>;]*>)?\s*<<<(.*?)>>>", src, flags=re.S):
        name, cfg = m.group(1), split_top(m.group(3))
        launched.add(name)
        line = src.count("\n", 0, m.start()) + 1
        block = re.sub(r"\s+", "", cfg[1]) if len(cfg) > 1 else ""
        if block != "KCU_THREADS(%s)" % name:
            problems.append("%s:%d: launch of %s: block size '%s', not KCU_THREADS(%s)"
                            % (rel, line, name, cfg[1] if len(cfg) > 1 else "", name))
    return defined, launched


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--table", required=True)
    ap.add_argument("--ptxas", nargs="+", required=True)
    ap.add_argument("--src", nargs="*", default=[])
    a = ap.parse_args()

    table = {}
    for line in open(a.table):
        f = line.split()
        if len(f) != 4:
            raise SystemExit("resources: %s: bad row: %r" % (a.table, line))
        table[f[0]] = {"threads": int(f[1]), "dsmem": int(f[2]), "local": int(f[3])}
    if not table:
        raise SystemExit("resources: %s: empty launch table" % a.table)

    problems, seen, lib, unlisted = [], set(), [], set()
    defined, launched = set(), set()
    for s in a.src:
        d, l = lint(s, table, problems)
        defined |= d
        launched |= l

    print("%-22s %-10s %5s %4s %13s %12s %11s  %s"
          % ("kernel", "file", "block", "regs", "regs/block", "smem B", "stack/spill", "verdict"))
    for rep in a.ptxas:
        fname = os.path.basename(rep).replace(".ptxas", ".cu")
        for k in parse_ptxas(rep):
            name, is_lib = kernel_name(k["sym"])
            arch = k["arch"]
            bad = []
            if k["regs"] > MAX_REGS_PER_THREAD:
                bad.append("%d registers a thread > %d" % (k["regs"], MAX_REGS_PER_THREAD))
            if is_lib:
                if k["smem"] > SHARED_PER_BLOCK:
                    bad.append("static shared %d B > %d B" % (k["smem"], SHARED_PER_BLOCK))
                lib.append((k, bad))
                print("%-22s %-10s %5s %4d %13s %5d+%-6s %5d/%-5d  %s"
                      % (lib_short(k["sym"])[:22], fname, "-",
                         k["regs"], "-", k["smem"], "-", k["stack"], k["spill_st"],
                         "FAIL" if bad else "ok (library)"))
                if bad:
                    problems.append("%s: library kernel %s: %s" % (fname, k["sym"], "; ".join(bad)))
                continue
            row = table.get(name)
            if row is None:
                unlisted.add(name)
                problems.append("%s: kernel %s has no row in the launch table (kernels/kcu_launch.h)"
                                % (fname, name))
                continue
            seen.add(name)
            t = row["threads"]
            warps = (t + 31) // 32
            per_warp = -(-k["regs"] * 32 // REG_UNIT) * REG_UNIT
            rpb = warps * per_warp
            limit = REGS_PER_BLOCK.get(arch, DEFAULT_REGS_PER_BLOCK)
            if t > MAX_THREADS or t < 32 or t % 32:
                bad.append("block of %d threads (1..%d, a multiple of 32)" % (t, MAX_THREADS))
            if rpb > limit:
                bad.append("%d registers x %d threads = %d a block > %d on %s"
                           % (k["regs"], t, rpb, limit, arch))
            smem = k["smem"] + row["dsmem"]
            if smem > SHARED_PER_BLOCK:
                bad.append("shared %d B static + %d B dynamic > %d B"
                           % (k["smem"], row["dsmem"], SHARED_PER_BLOCK))
            loc = max(k["stack"], k["spill_st"])
            if loc > row["local"]:
                bad.append("local memory %d B stack frame, %d B spill stores > budget %d B"
                           % (k["stack"], k["spill_st"], row["local"]))
            if k["barriers"] > MAX_BARRIERS:
                bad.append("%d barriers > %d" % (k["barriers"], MAX_BARRIERS))
            print("%-22s %-10s %5d %4d %6d/%-6d %5d+%-6d %5d/%-5d  %s"
                  % (name, fname, t, k["regs"], rpb, limit, k["smem"], row["dsmem"], k["stack"],
                     k["spill_st"], "FAIL" if bad else "ok"))
            if bad:
                problems.append("%s: kernel %s: %s" % (fname, name, "; ".join(bad)))
    for name in sorted(set(table) - seen):
        problems.append("launch table row %s names no compiled kernel" % name)
    for name in sorted((launched | defined) - set(table) - unlisted):
        problems.append("kernel %s (defined or launched in the sources) has no launch table row"
                        % name)
    for p in problems:
        print("FAIL " + p)
    print("check-resources: %d kernels of the launch table checked, %d library (CUB) kernels "
          "checked per thread only, %d problem(s)" % (len(seen), len(lib), len(problems)))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
