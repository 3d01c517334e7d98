#!/bin/sh
# The whole test suite: every tests/*.bats through prove (TAP), so the output
# ends in prove's summary ("Result: PASS" / "Files=..., Tests=...").
cd "$(dirname "$0")/.." || exit 1
exec prove -f -o -e 'bats --tap' tests/*.bats
