#!/usr/bin/env python3
"""The memory-bound kernels carry no integer division (issue 39 item 4).

  divfree.py --ptx FILE.ptx...      (tests/gpu/check-resources.sh: the PTX
                                     nvcc -keep leaves beside each cubin)
  divfree.py --sass OBJ_OR_CUBIN... (cuobjdump -sass; tests/gpu/device-check.sh)

For every kernel named in KERNELS (each template instantiation on its own)
it fails on an integer division or remainder: in PTX a div/rem on an
integer type, or a call (64-bit division can be a called subroutine); in
SASS the reciprocal that integer division is built on (MUFU.RCP*, after an
I2F.*.RP) or a CALL. Division by a constant (a multiply-high) is not one.
Each name must be found at least once, so a renamed kernel fails instead of
passing unchecked. Exit 0 when all are clean, 1 otherwise, 2 on a usage or
tool error.
"""
import re
import subprocess
import sys

KERNELS = ["k_gather", "k_gather_scaled", "k_gather_scaled_bf16", "k_unpack", "k_combine",
           "k_widen"]

PTX_BAD = re.compile(r"^\s*(?:@!?%p\d+\s+)?((?:div|rem)\.[su](?:16|32|64)|call(?:\.uni)?)\b", re.M)
SASS_BAD = re.compile(r"\b(MUFU\.RCP\w*|I2F[.\w]*\.RP|CALL[.\w]*)\b")


def base_name(mangled):
    """_Z8k_gatherI5uint4EvPKl... -> k_gather; a plain C name stays."""
    m = re.match(r"_Z(\d+)(\w+)", mangled)
    if not m:
        return mangled
    return m.group(2)[: int(m.group(1))]


def ptx_functions(text):
    """(mangled name, body) of every .entry in a PTX file."""
    out = []
    heads = list(re.finditer(r"^\.(?:visible |weak )?\.entry\s+(\w+)\(", text, re.M))
    for i, h in enumerate(heads):
        # the body runs to the next .entry/.func (or the end)
        nxt = re.compile(r"^\.(?:visible |weak |extern )?\.(?:entry|func)\s", re.M)
        m = nxt.search(text, h.end())
        out.append((h.group(1), text[h.end(): m.start() if m else len(text)]))
    return out


def sass_functions(text):
    out = []
    parts = re.split(r"^\s*Function : (\S+)\s*$", text, flags=re.M)
    for i in range(1, len(parts) - 1, 2):
        out.append((parts[i], parts[i + 1]))
    return out


def main(argv):
    if len(argv) < 3 or argv[1] not in ("--ptx", "--sass"):
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    mode, files = argv[1][2:], argv[2:]
    funcs = []
    for f in files:
        if mode == "ptx":
            with open(f) as fh:
                funcs += [(f, n, b) for n, b in ptx_functions(fh.read())]
        else:
            try:
                r = subprocess.run(["cuobjdump", "-sass", f], capture_output=True, text=True)
            except OSError as e:
                print(f"divfree: cuobjdump: {e}", file=sys.stderr)
                return 2
            if r.returncode != 0 or "Function :" not in r.stdout:
                print(f"divfree: cuobjdump -sass {f} failed: {(r.stderr or r.stdout).strip()}",
                      file=sys.stderr)
                return 2
            funcs += [(f, n, b) for n, b in sass_functions(r.stdout)]
    bad_re = PTX_BAD if mode == "ptx" else SASS_BAD
    problems, seen, checked = 0, set(), 0
    for f, mangled, body in funcs:
        name = base_name(mangled)
        if name not in KERNELS:
            continue
        seen.add(name)
        checked += 1
        hits = sorted({m.group(1) for m in bad_re.finditer(body)})
        if hits:
            problems += 1
            n = len(bad_re.findall(body))
            print(f"FAIL {name} ({mangled}, {mode}): {n} integer division instruction(s): "
                  + ", ".join(hits))
        else:
            print(f"ok   {name} ({mangled}, {mode}): no integer division")
    for k in KERNELS:
        if k not in seen:
            problems += 1
            print(f"FAIL {k}: not found in {mode} of {' '.join(files)}")
    print(f"check-divfree: {checked} memory-bound kernel instantiations checked ({mode}), "
          f"{problems} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
