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
printf '#!/bin/sh\necho "${SSH_CONNECTION:+over-ssh} $*" >>%s/hc.log\nexec %s/bin/hessian-capture "$@"\n' "$TMP" "$ROOT" >shim/hessian-capture
chmod +x shim/hessian-capture
export PATH="$TMP/shim:$PATH"
opts=(--bits 3 --rows 8 --cols 64 --chunk-rows 3 -q)
check "convert locally, -j 1" convert m a "${opts[@]}" -j 1
check "convert --hosts (127.0.0.1 twice, over ssh)" convert m b "${opts[@]}" --hosts hosts
check "--hosts vs local: byte-identical directories" diff -r a b
# every encode went through ssh (one call each: the measurement encodes
# and the planned ones), on both entries of the list
n=$(wc -l <"$d/ssh.log")
jobs=$(make -s -f b.work/Makefile --no-print-directory NOPLAN=1 list-meas | wc -l)
check "the $jobs measurement encodes, at least, ran over ssh ($n calls)" test "$n" -ge "$jobs"
check "... on both entries of the host list" \
	test "$(grep -ow 'x3-host-[ab]' "$d/ssh.log" | sort -u | wc -l)" -eq 2
# the capture parts too (--capture-parts, on with --hosts): 8 rows in chunks
# of 3 are 3 parts, for the layer and for the head
check "the 6 capture parts ran over ssh" test "$(grep -c '^over-ssh .*--part [0-2] ' hc.log)" -eq 6
check "... and no capture of a whole layer did" sh -c "! grep '^over-ssh' hc.log | grep -v -e '--part' -e '--list-parts' -e '--merge' | grep -q ."
done_testing
