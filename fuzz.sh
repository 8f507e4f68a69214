#!/usr/bin/env bash
# Runs every fuzz target of the project for a while each (go test -fuzz).
#
#   ./fuzz.sh            every target, 30 s each
#   ./fuzz.sh 120        every target, 120 s each
#   ./fuzz.sh 60 Serve   the targets whose name contains "Serve"
#
# New inputs are shrunk for at most 5 s each (-fuzzminimizetime): at Go's
# default of 60 s, a target that keeps finding inputs spent most of a
# 150 s run shrinking them, with no executions (six targets idle for 34 to
# 45 of their 53 progress lines).
#
# A failing input is written by Go under the package's testdata/fuzz/<Target>/
# and from then on runs in ./test.sh as a regression case: commit it with the
# fix. Exit status 1 if any target failed. A target that fails without
# leaving an input (the fuzzing engine's own error, seen as "context deadline
# exceeded" at the end of its time) is run once more before it counts.
set -uo pipefail
cd "$(dirname "$0")"
export GOTOOLCHAIN=local
secs=${1:-30}
match=${2:-}
if ! [[ $secs =~ ^[0-9]+$ ]] || ((secs == 0)); then
	echo "usage: $0 [SECONDS] [NAME-PART]" >&2
	exit 2
fi

# dir<TAB>target for every "func FuzzX(" in a test file.
mapfile -t targets < <(grep -rEo --include='*_test.go' '^func Fuzz[A-Za-z0-9_]+' . |
	sed -E 's#^(.*)/[^/]+_test.go:func (Fuzz[A-Za-z0-9_]+)$#\1\t\2#' | sort -u)

inputs() { # the failing inputs Go has written for target $2 in dir $1
	ls "$1/testdata/fuzz/$2" 2>/dev/null | sort
}

failed=()
for t in "${targets[@]}"; do
	dir=${t%%$'\t'*} name=${t##*$'\t'}
	[[ -n $match && $name != *"$match"* ]] && continue
	for try in 1 2; do
		before=$(inputs "$dir" "$name")
		echo "== $dir $name (${secs}s)"
		if go test -run '^$' -fuzz "^${name}\$" -fuzztime "${secs}s" -fuzzminimizetime 5s -parallel 2 "$dir" >"${TMPDIR:-/tmp}/fuzz.$$.log" 2>&1; then
			tail -n 1 "${TMPDIR:-/tmp}/fuzz.$$.log"
			break
		fi
		tail -n 8 "${TMPDIR:-/tmp}/fuzz.$$.log"
		if [[ $(inputs "$dir" "$name") != "$before" || $try == 2 ]]; then
			failed+=("$dir $name")
			break
		fi
		echo "   (no failing input was written: the engine's own error; once more)"
	done
done
rm -f "${TMPDIR:-/tmp}/fuzz.$$.log"
if ((${#failed[@]})); then
	printf 'FAILED: %s\n' "${failed[@]}"
	exit 1
fi
echo "all fuzz targets passed"
