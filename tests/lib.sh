# tests/lib.sh: helpers for command-line tests (sourced by tests/t*.sh).
# Each check prints "ok N - what" / "not ok N - what"; tests/run counts them.
set -u
T_N=0
T_FAIL=0
ROOT=${ROOT:-$(cd "$(dirname "$0")/.." && pwd)}
PATH="$ROOT/bin:$ROOT/pipelines:$PATH"
SHARED=${X3_SHARED:-$ROOT/../shared}
TMP=$(mktemp -d "${TMPDIR:-/tmp}/x3test.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
export LC_ALL=C

ok() { T_N=$((T_N+1)); echo "ok $T_N - $*"; }
notok() { T_N=$((T_N+1)); T_FAIL=$((T_FAIL+1)); echo "not ok $T_N - $*"; }
skip() { T_N=$((T_N+1)); echo "ok $T_N - $* # SKIP"; }
# check "what" cmd...: passes if cmd exits 0
check() { local what=$1; shift; if "$@"; then ok "$what"; else notok "$what"; fi; }
# check_fail "what" STATUS PATTERN cmd...: cmd must exit STATUS and print
# PATTERN (grep -E) on stderr
check_fail() {
	local what=$1 want=$2 pat=$3; shift 3
	local rc=0
	"$@" >"$TMP/cf.out" 2>"$TMP/cf.err" || rc=$?
	if [ "$rc" -eq "$want" ] && grep -Eq -- "$pat" "$TMP/cf.err"; then ok "$what"
	else notok "$what"; echo "#   exit $rc (want $want), stderr:"; sed 's/^/#   /' "$TMP/cf.err" | head -5; fi
}
have_shared() { [ -f "$SHARED/models/stories260K/model.safetensors" ]; }
done_testing() { [ "$T_FAIL" -eq 0 ]; exit $?; }
