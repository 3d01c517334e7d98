#!/usr/bin/env python3
"""The layer rule of liblrmoe (lib/LAYERS), checked on the compiled objects.

  layers.py check [OBJDIR [KERNDIR]]   every call edge between modules goes to a
                                       lower layer; modules and table agree
  layers.py edges [OBJDIR [KERNDIR]]   print every edge: caller -> callee (symbols)
  layers.py man                        the roff module map of lrmoe(7)
  layers.py update PAGE                rewrite that map in PAGE between its markers

OBJDIR holds lib/*.c's objects (default build/lib), KERNDIR the CUDA
backend's (default build/kernels; absent in a CPU-only build). An edge is a
symbol one object leaves undefined (nm U) and another defines (T, D, B, R,
V, W). kernels/module.o, the CUDA module's boundary, is left out: it defines
the library functions the kernels call as forwards to the loading liblrmoe.
Exit 1 with one line per violation, naming the edge and its symbols.
"""
import collections
import glob
import os
import re
import subprocess
import sys

TOP = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
TABLE = os.path.join(TOP, "lib", "LAYERS")
BEGIN = ".\\\" BEGIN module map (tests/helpers/layers.py update: from lib/LAYERS)"
END = ".\\\" END module map"


def table():
    """[(number, name, [modules])] from lib/LAYERS, bottom first"""
    layers = []
    with open(TABLE) as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            m = re.match(r"(\d+) ([^:]+): (.+)$", line)
            if not m:
                sys.exit(f"{TABLE}:{n}: not 'NUMBER NAME: MODULES'")
            layers.append((int(m.group(1)), m.group(2), m.group(3).split()))
    return layers


def symbols(path):
    out = subprocess.run(["nm", path], capture_output=True, text=True, check=True).stdout
    defined, undefined = set(), set()
    for line in out.splitlines():
        p = line.split()
        if len(p) == 3 and p[1] in "TDBRVW":
            defined.add(p[2])
        elif len(p) == 2 and p[0] == "U":
            undefined.add(p[1])
    return defined, undefined


def objects(objdir, kerndir):
    mods = {}
    for o in sorted(glob.glob(os.path.join(objdir, "*.o"))):
        mods[os.path.basename(o)[:-2]] = symbols(o)
    if kerndir and os.path.isdir(kerndir):
        for o in sorted(glob.glob(os.path.join(kerndir, "*.o"))):
            name = os.path.basename(o)[:-2]
            # module.o: the CUDA module's boundary; cuda.o: the others
            # partially linked for liblrmoe.a (Makefile)
            if name not in ("module", "cuda"):
                mods["kernels/" + name] = symbols(o)
    return mods


def edges(mods):
    """{(caller, callee): [symbols]}; a library object's call resolves in
    the library first (liblrmoe.so has the CUDA loader's entry points, not
    the kernels')"""
    owner = {}
    for m, (d, _) in mods.items():
        for s in d:
            owner.setdefault(s, []).append(m)
    out = collections.defaultdict(list)
    for m, (_, u) in mods.items():
        for s in sorted(u):
            cands = [c for c in owner.get(s, []) if c != m]
            if not cands:
                continue
            lib = [c for c in cands if not c.startswith("kernels/")]
            callee = (lib or cands)[0] if not m.startswith("kernels/") else \
                ([c for c in cands if c.startswith("kernels/")] or cands)[0]
            out[(m, callee)].append(s)
    return out


def check(objdir, kerndir):
    layers = table()
    level, bad = {}, []
    for n, _, ms in layers:
        for m in ms:
            if m in level:
                bad.append(f"lib/LAYERS: {m} is in layer {level[m]} and layer {n}")
            level[m] = n
    mods = objects(objdir, kerndir)
    if not mods:
        sys.exit(f"layers: no objects in {objdir} (build first: make)")
    for m in sorted(mods):
        if m not in level:
            bad.append(f"{m}: a module without a layer (add it to lib/LAYERS)")
    have_cuda = any(m.startswith("kernels/") for m in mods)
    for m in sorted(level):
        if m not in mods and (have_cuda or not m.startswith("kernels/")):
            bad.append(f"lib/LAYERS: {m} names no object in the build")
    for (a, b), syms in sorted(edges(mods).items()):
        if a in level and b in level and level[a] <= level[b]:
            what = "its own layer" if level[a] == level[b] else f"layer {level[b]}, above it"
            bad.append(f"{a} (layer {level[a]}) calls {b} ({what}): {', '.join(syms)}")
    for line in bad:
        print(line)
    nedges = len(edges(mods))
    if bad:
        print(f"layers: {len(bad)} problem(s) in {len(mods)} modules, {nedges} edges")
        return 1
    print(f"layers: {len(mods)} modules, {nedges} edges, every call goes down a layer")
    return 0


def man():
    lines = [BEGIN]
    for n, name, ms in reversed(table()):
        lines.append(".TP")
        lines.append(f".B \"{n} \\(em {name}\"")
        text, line = [], ""
        for m in ms:  # roff source lines under 80 bytes
            item = m + ("," if m != ms[-1] else "")
            if line and len(line) + 1 + len(item) > 72:
                text.append(line)
                line = item
            else:
                line = f"{line} {item}" if line else item
        lines.extend(text + [line])
    lines.append(END)
    return "\n".join(lines) + "\n"


def update(page):
    s = open(page).read()
    i, j = s.find(BEGIN), s.find(END)
    if i < 0 or j < 0:
        sys.exit(f"{page}: no module map markers")
    new = s[:i] + man() + s[j + len(END) + 1:]
    if new != s:
        open(page, "w").write(new)
        print(f"{page}: module map rewritten")


def main(argv):
    if len(argv) >= 2 and argv[1] in ("check", "edges"):
        objdir = argv[2] if len(argv) > 2 else os.path.join(TOP, "build", "lib")
        kerndir = argv[3] if len(argv) > 3 else os.path.join(os.path.dirname(objdir), "kernels")
        if argv[1] == "check":
            return check(objdir, kerndir)
        for (a, b), syms in sorted(edges(objects(objdir, kerndir)).items()):
            print(f"{a} -> {b}: {', '.join(syms)}")
        return 0
    if len(argv) == 2 and argv[1] == "man":
        sys.stdout.write(man())
        return 0
    if len(argv) == 3 and argv[1] == "update":
        update(argv[2])
        return 0
    sys.stderr.write(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
