#!/bin/sh
# Print the CUTLASS 3.x include directory (the one holding cutlass/ and
# cute/), else fail: $CUTLASS_INC when set, else the headers of the PyPI
# package nvidia-cutlass (cutlass_library/source/include, found without
# importing it). Used by the Makefile and tests/deps.sh.
set -u
ok() { [ -f "$1/cutlass/cutlass.h" ] && [ -f "$1/cute/tensor.hpp" ]; }
if [ -n "${CUTLASS_INC:-}" ]; then
    ok "$CUTLASS_INC" && { echo "$CUTLASS_INC"; exit 0; }
    exit 1
fi
d=$(python3 -c 'import importlib.util as u, os
s = u.find_spec("cutlass_library")
print(os.path.join(list(s.submodule_search_locations)[0], "source", "include") if s else "")' 2>/dev/null)
[ -n "$d" ] && ok "$d" && { echo "$d"; exit 0; }
exit 1
