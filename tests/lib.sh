# tests/lib.sh: helpers for command-line tests (sourced by tests/t*.sh).
# Each check prints "ok N - what" / "not ok N - what"; tests/run counts them.
set -u
T_N=0
T_FAIL=0
export ROOT=${ROOT:-$(cd "$(dirname "$0")/.." && pwd)}   # exported: checks run "sh -c" strings that name it
PATH="$ROOT/bin:$ROOT/pipelines:$PATH"
# blas_kernels, blas_core, blas_other, blas_pair, blas_under: the OpenBLAS
# kernels a determinism test forces
. "$ROOT/tests/lib-blas.sh"
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
# info_sweep: exl3-info reads back, without a warning, every EXL3 directory
# the test left under $TMP (a config.json whose quantization_config says
# exl3, beside model.safetensors or its index), and finds it loadable by
# ExLlamaV3 where ExLlamaV3 loads the model (exl3-info --check auto: the
# reader contract, lib/arch/reader.h). A test that leaves broken
# directories on purpose names them in NO_INFO (shell globs of paths under
# $TMP, space-separated).
NO_INFO=
info_sweep() {
	command -v exl3-info >/dev/null 2>&1 || return 0
	local c d g n=0 bad=0
	while IFS= read -r c; do
		d=${c%/config.json}
		[ -e "$d/model.safetensors" ] || [ -e "$d/model.safetensors.index.json" ] || continue
		jq -e '.quantization_config.quant_method == "exl3"' "$c" >/dev/null 2>&1 || continue
		for g in $NO_INFO; do [[ ${d#"$TMP"/} == $g ]] && continue 2; done
		n=$((n + 1))
		if ! exl3-info --json "$d" >"$TMP/.info.json" 2>"$TMP/.info.err" || [ -s "$TMP/.info.err" ] ||
		   ! jq -e '.summary.linears > 0' "$TMP/.info.json" >/dev/null 2>&1; then
			bad=$((bad + 1)); echo "# exl3-info ${d#"$TMP"/}:"; sed 's/^/#   /' "$TMP/.info.err" | head -5
		elif ! exl3-info --check auto "$d" >"$TMP/.info.err" 2>&1; then
			bad=$((bad + 1)); echo "# exl3-info --check auto ${d#"$TMP"/}:"; sed 's/^/#   /' "$TMP/.info.err" | head -5
		fi
	done < <(find "$TMP" -name config.json 2>/dev/null | sort)
	[ "$n" -eq 0 ] || check "exl3-info reads every EXL3 directory the test wrote ($n), each loadable where ExLlamaV3 loads the model" test "$bad" -eq 0
}
done_testing() { info_sweep; [ "$T_FAIL" -eq 0 ]; exit $?; }
