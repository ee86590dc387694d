#!/usr/bin/env bash
# convert --hosts for real (issue 12 part 4): an OpenSSH server on 127.0.0.1,
# started here on a free port with throw-away host and user keys (nothing
# is installed; without sshd, from openssh-server, the test skips saying
# why), named twice in the host list, so that GNU parallel runs the
# capture parts and the encodes over ssh on two job slots. The directory
# must equal a local run's byte for byte.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/lib-convert.sh"
cd "$TMP"

skip_all() { skip "$1"; done_testing; }
sshd=$(command -v sshd || echo /usr/sbin/sshd)
[ -x "$sshd" ] || skip_all "convert --hosts over ssh: no sshd (Debian openssh-server, .ci/deps)"
command -v ssh >/dev/null && command -v ssh-keygen >/dev/null ||
	skip_all "convert --hosts over ssh: no ssh client (Debian openssh-client)"
command -v parallel >/dev/null || skip_all "convert --hosts over ssh: no GNU parallel"

d=$TMP/ssh
mkdir -m 700 "$d"
ssh-keygen -q -t ed25519 -N '' -f "$d/host_key" && ssh-keygen -q -t ed25519 -N '' -f "$d/user_key" ||
	skip_all "convert --hosts over ssh: ssh-keygen failed"
cp "$d/user_key.pub" "$d/authorized_keys"
user=$(id -un)
# sshd started by root needs its privilege separation directory, which the
# package's init script creates at boot (not there in a container)
[ "$(id -u)" -ne 0 ] || [ -d /run/sshd ] || mkdir -p -m 0755 /run/sshd 2>/dev/null || true

# every command over ssh runs under a login that stays its parent (no exec),
# as a login shell may: then nothing on the host sees the ssh connection
# end, so GNU parallel's remote wrapper (which watches its parent) does not
# end a job when its ssh is killed, and only convert's remote kill can
printf '#!/bin/sh\n/bin/sh -c "$SSH_ORIGINAL_COMMAND"\n' >"$d/login"
chmod +x "$d/login"
# a free port: sshd fails to bind a taken one, then the next is tried
started=0
for try in 1 2 3 4 5; do
	port=$((20000 + (RANDOM * 7 + $$ + try * 131) % 40000))
	cat >"$d/sshd_config" <<EOF
Port $port
ListenAddress 127.0.0.1
HostKey $d/host_key
AuthorizedKeysFile $d/authorized_keys
PidFile $d/sshd.pid
StrictModes no
UsePAM no
PasswordAuthentication no
KbdInteractiveAuthentication no
PubkeyAuthentication yes
PermitRootLogin prohibit-password
AllowUsers $user
LogLevel INFO
ForceCommand $d/login
EOF
	"$sshd" -D -f "$d/sshd_config" -E "$d/sshd.log" &
	spid=$!
	cat >"$d/ssh_config" <<EOF
Host x3-host-a x3-host-b
  HostName 127.0.0.1
  Port $port
  User $user
  IdentityFile $d/user_key
  IdentitiesOnly yes
  BatchMode yes
  StrictHostKeyChecking no
  UserKnownHostsFile /dev/null
  LogLevel ERROR
EOF
	for i in $(seq 50); do
		ssh -F "$d/ssh_config" x3-host-a true 2>/dev/null && { started=1; break; }
		kill -0 "$spid" 2>/dev/null || break
		sleep 0.2
	done
	[ "$started" -eq 0 ] || break
	kill "$spid" 2>/dev/null; wait "$spid" 2>/dev/null
done
if [ "$started" -eq 0 ]; then
	skip_all "convert --hosts over ssh: sshd did not start on 127.0.0.1 ($(tr '\n' ' ' <"$d/sshd.log" | cut -c1-200))"
fi
trap 'kill "$spid" 2>/dev/null; wait "$spid" 2>/dev/null; rm -rf "$TMP"' EXIT
ok "sshd on 127.0.0.1:$port with a throw-away key; ssh to it works"

# the host list: the same server twice, one job slot each; GNU parallel
printf '1/x3-host-a\n1/x3-host-b\n' >hosts
# reaches it through this ssh configuration (a wrapper that notes each
# call: every job is one)
printf '#!/bin/sh\necho "$*" >>%s/ssh.log\nexec ssh -F %s/ssh_config "$@"\n' "$d" "$d" >"$d/ssh"
chmod +x "$d/ssh"
export PARALLEL_SSH=$d/ssh
tiny_model m 1
# a hessian-capture on PATH (the jobs get convert's) that notes each run and
# whether it ran under sshd (SSH_CONNECTION)
mkdir shim
# whether it ran under sshd (SSH_CONNECTION); with the file stop-remote, a
# job over ssh stops instead (sleeps until killed: the kill -9 test below)
printf '#!/bin/sh\necho "${SSH_CONNECTION:+over-ssh} $*" >>%s/hc.log\nif [ -n "$SSH_CONNECTION" ] && [ -e %s/stop-remote ]; then touch %s/stopped-remote; exec sleep 300.1819; fi\nexec %s/bin/hessian-capture "$@"\n' "$TMP" "$TMP" "$TMP" "$ROOT" >shim/hessian-capture
chmod +x shim/hessian-capture
export PATH="$TMP/shim:$PATH"
opts=(--bits 3 --rows 8 --cols 64 --chunk-rows 3 -q)
check "convert locally, -j 1" convert m a "${opts[@]}" -j 1
check "convert --hosts (127.0.0.1 twice, over ssh)" convert m b "${opts[@]}" --hosts hosts
check "--hosts vs local: byte-identical directories" diff -r a b
# every encode went through ssh (one call each: the measurement encodes
# and the planned ones), on both entries of the list
n=$(wc -l <"$d/ssh.log")
jobs=$(make -s -C b.work --no-print-directory NOPLAN=1 list-meas | wc -l)
check "the $jobs measurement encodes, at least, ran over ssh ($n calls)" test "$n" -ge "$jobs"
check "... on both entries of the host list" \
	test "$(grep -ow 'x3-host-[ab]' "$d/ssh.log" | sort -u | wc -l)" -eq 2
# the capture parts too (--capture-parts, on with --hosts): 8 rows in chunks
# of 3 are 3 parts, for the layer and for the head
check "the 6 capture parts ran over ssh" test "$(grep -c '^over-ssh .*--part [0-2] ' hc.log)" -eq 6
check "... and no capture of a whole layer did" sh -c "! grep '^over-ssh' hc.log | grep -v -e '--part' -e '--list-parts' -e '--merge' | grep -q ."
# any legal path over ssh too: the jobs get the work directory in the
# environment (X3_WORK), not in their command's text
n=$'sp ace #$:\'"\\*\nnl'
mkdir -p "$n" && cp -r m "$n/m $n"
check "convert --hosts with blanks, # \$ : ' \" \\ * and a newline in MODEL, OUT and --work" \
	convert "$n/m $n" "$n/out $n" --work "$n/work $n" "${opts[@]}" --hosts hosts
check "... byte-identical to the local run" diff -r a "$n/out $n"

# kill -9 (and TERM) of a --hosts conversion while its jobs run over ssh:
# convert's watchdog (its TERM trap) ends the local make and parallel, then
# kills the remote jobs' process groups over the same ssh (kill_remote);
# the lock is free, and a re-run completes to the local run's bytes
wait_for() { local n=$(($1 * 10)); shift; while ! "$@"; do n=$((n - 1)); [ $n -gt 0 ] || return 1; sleep 0.1; done; }
remote_gone() { ! pgrep -f 'sleep 300.1819' >/dev/null; }
for sig in KILL TERM; do
	rm -f stopped-remote "$d/ssh.log"
	touch stop-remote
	setsid convert m c "${opts[@]}" --hosts hosts & cpid=$!
	if wait_for 60 test -e stopped-remote; then
		check "$sig: a job stopped over ssh: its process runs under sshd, outside convert's session" \
			sh -c "pgrep -f 'sleep 300.1819' >/dev/null && ! pgrep -s \$(ps -o sid= -p $cpid) -f 'sleep 300.1819' >/dev/null"
		if [ $sig = KILL ]; then kill -KILL -- -"$cpid" 2>/dev/null; else kill -TERM "$cpid"; fi
		wait "$cpid" 2>/dev/null
		check "kill -$sig of convert --hosts: its remote jobs end too (within 10 s)" wait_for 10 remote_gone
		check "... ended by the remote kill over ssh, on both hosts" \
			wait_for 10 sh -c "test \$(grep 'Make file' '$d/ssh.log' | grep -ow 'x3-host-[ab]' | sort -u | wc -l) -eq 2"
		pkill -f 'sleep 300.1819' 2>/dev/null || true
		rm -f stop-remote
		check "... and a re-run completes" convert m c "${opts[@]}" --hosts hosts
		check "... byte-identical to the local run" diff -r a c
	else
		notok "kill -$sig of convert --hosts: no job reached the remote stop"
		kill -9 -- -"$cpid" 2>/dev/null; wait "$cpid" 2>/dev/null
	fi
	rm -rf c c.work
done
done_testing
