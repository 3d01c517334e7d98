#!/usr/bin/env python3
"""lrmoe(7)'s table of every option of every tool, against the tools' --help.

  options_table.py rows BIN...          print the table rows (tbl source)
  options_table.py check PAGE BIN...    compare the table in PAGE with each
                                        BIN's --help both ways; exit 1 with
                                        one line per difference
  options_table.py update PAGE BIN...   rewrite the table in PAGE from the
                                        --help of each BIN

An option of --help is an indented line "-X, --long ARG  meaning" or
"--long ARG  meaning" (argparse: "-X ARG, --long ARG"); the meaning may go
on over more deeply indented lines. The table lies between the comments
options-table-begin and options-table-end of PAGE: one row per option, tab
separated: tool, short (-X or empty), long, argument (empty: none), meaning
(a T{ ... T} block)."""
import os
import re
import subprocess
import sys

OPT = re.compile(r"^ {1,8}(?:-(?P<s>[A-Za-z0-9@])(?: (?P<sa>[A-Z\[][^\s,]*))?, )?"
                 r"--(?P<l>[a-z0-9][a-z0-9-]*)(?:[ =](?P<a>[A-Z\[][^\s]*))?(?:\s+(?P<d>.*))?$")


def help_options(binary):
    """[(short, long, arg, meaning)] in --help order."""
    text = subprocess.run([binary, "--help"], capture_output=True, text=True, check=True).stdout
    rows, last = [], None
    for line in text.split("\n"):
        m = OPT.match(line)
        if m:
            last = [m.group("s") or "", m.group("l"), m.group("a") or m.group("sa") or "",
                    (m.group("d") or "").strip()]
            rows.append(last)
        elif last is not None and re.match(r"^ {16,}\S", line):
            last[3] = (last[3] + " " + line.strip()).strip()
        else:
            last = None
    return rows


def esc(s):
    return s.replace("\\", "\\e").replace("-", "\\-")


def unesc(s):
    return s.replace("\\-", "-").replace("\\e", "\\").replace("\\&", "")


def meaning(d):
    d = d.strip()
    while d.count("(") > d.count(")"):  # a parenthesis the first lines left open
        d = d[:d.rindex("(")].rstrip()
    d = d.rstrip(";,:")
    return ("\\&" if d[:1] in ".'" else "") + esc(d)


def rows(binaries):
    out = []
    for b in binaries:
        t = os.path.basename(b)
        for s, l, a, d in help_options(b):
            out.append("\t".join([esc(t), esc("-" + s) if s else "", esc("--" + l), esc(a),
                                  "T{\n" + meaning(d) + "\nT}"]) + "\n")
    return "".join(out)


def update(page, binaries):
    src = open(page).read()
    i = src.index("\n_\n", src.index("options-table-begin")) + 3
    j = src.index(".TE\n", i)
    open(page, "w").write(src[:i] + rows(binaries) + src[j:])


def page_options(page):
    """{tool: {(short, long, takes_arg)}} from PAGE's table."""
    src = open(page).read()
    i = src.index("options-table-begin")
    j = src.index("options-table-end")
    body = src[i:j].split("\n")
    # drop the tbl preamble: up to the header's underline
    k = body.index("_")
    out = {}
    for line in body[k + 1:]:
        if "\t" not in line or line.startswith("."):
            continue  # meaning text, T} and the closing .TE
        f = [unesc(x) for x in line.split("\t")]
        if len(f) < 5 or not f[2].startswith("--"):
            raise SystemExit(f"{page}: bad table row: {line!r}")
        out.setdefault(f[0], set()).add((f[1][1:] if f[1] else "", f[2][2:], bool(f[3])))
    return out


def check(page, binaries):
    table = page_options(page)
    bad = []
    tools = set()
    for b in binaries:
        t = os.path.basename(b)
        tools.add(t)
        helped = {(s, l, bool(a)) for s, l, a, _ in help_options(b)}
        listed = table.get(t, set())
        for o in sorted(helped - listed):
            bad.append(f"{t}: {'-' + o[0] + ', ' if o[0] else ''}--{o[1]}"
                       f"{' ARG' if o[2] else ''} is in --help but not in the table of {page}")
        for o in sorted(listed - helped):
            bad.append(f"{t}: {'-' + o[0] + ', ' if o[0] else ''}--{o[1]}"
                       f"{' ARG' if o[2] else ''} is in the table of {page} but not in --help")
    for t in sorted(set(table) - tools):
        bad.append(f"{t}: in the table of {page} but no such tool was given")
    # one letter, one meaning: a short letter names the same long option everywhere,
    # or one of the long options the letter summary allows for it
    letters = {}
    for t, opts in table.items():
        for s, l, _ in opts:
            if s:
                letters.setdefault(s, set()).add(l)
    for s, longs in sorted(letters.items()):
        if len(longs) > 2 or (len(longs) == 2 and longs not in ALLOWED_PAIRS):
            bad.append(f"-{s} means {', '.join('--' + l for l in sorted(longs))} in different tools")
    for line in bad:
        print(line)
    return 1 if bad else 0


# one meaning, two long names in different tools (lrmoe(7), "One letter, one
# meaning"): -p names one planner or a list, -j how many run at once, -o the
# output (lrmoe-study's is a directory)
ALLOWED_PAIRS = [{"planner", "planners"}, {"jobs", "rank-threads"}, {"output", "out"}]

if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "rows":
        sys.stdout.write(rows(sys.argv[2:]))
    elif len(sys.argv) >= 4 and sys.argv[1] == "update":
        update(sys.argv[2], sys.argv[3:])
    elif len(sys.argv) >= 4 and sys.argv[1] == "check":
        sys.exit(check(sys.argv[2], sys.argv[3:]))
    else:
        sys.exit(__doc__)
