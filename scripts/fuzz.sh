#!/usr/bin/env bash
# make fuzz: run every Go fuzz target in the repository, one at a time, for
# FUZZTIME each (first argument, default 10s). Targets are found by their
# `func FuzzX(f *testing.F)` declarations, so a new target is picked up
# without touching this file.
#
# One at a time because `go test -fuzz` accepts exactly one target per run,
# and because the fuzzing workers already use every core (-parallel defaults
# to GOMAXPROCS): running targets side by side would only split the same
# cores and halve each target's coverage.
#
# Exits non-zero when any target fails. A failing input is saved by go test
# under PKG/testdata/fuzz/FuzzX/ (commit it: it becomes a regression seed);
# the script names the file and keeps going so one run reports every broken
# target. A target that fails to build counts as a failure too.
set -uo pipefail

FUZZTIME=${1:-10s}
cd "$(dirname "$0")/.."

# "dir name" pairs, sorted for a stable order. Module code lives under lib/,
# tool/ and integration/; node_modules and testdata are never Go packages of
# ours.
mapfile -t targets < <(
	grep -rE --include='*_test.go' -o '^func Fuzz[A-Za-z0-9_]*\(' lib tool integration 2>/dev/null |
		sed -E 's#^(.*)/[^/]*_test\.go:func (Fuzz[A-Za-z0-9_]*)\($#\1 \2#' |
		grep -v -e node_modules -e /testdata/ |
		sort -u
)
if [ ${#targets[@]} -eq 0 ]; then
	echo "fuzz: no fuzz targets found" >&2
	exit 1
fi

failed=()
start_all=$SECONDS
for t in "${targets[@]}"; do
	dir=${t% *}
	name=${t#* }
	echo "=== fuzz ./$dir $name ($FUZZTIME)"
	start=$SECONDS
	if go test -run '^$' -fuzz "^${name}\$" -fuzztime "$FUZZTIME" "./$dir"; then
		echo "--- ok   ./$dir $name ($((SECONDS - start))s)"
	else
		echo "--- FAIL ./$dir $name ($((SECONDS - start))s)"
		found=$(ls -t "$dir/testdata/fuzz/$name" 2>/dev/null | head -1)
		if [ -n "$found" ]; then
			echo "    newest input: $dir/testdata/fuzz/$name/$found"
			echo "    reproduce:    go test -run '^$name/$found\$' ./$dir"
		fi
		failed+=("./$dir $name")
	fi
done

echo "fuzz: ${#targets[@]} targets, ${#failed[@]} failed, $((SECONDS - start_all))s"
if [ ${#failed[@]} -gt 0 ]; then
	printf 'FAIL %s\n' "${failed[@]}"
	exit 1
fi
