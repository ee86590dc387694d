#!/usr/bin/env bash
# convert --slurm for real: a Slurm cluster of one node, this host, started
# here as root from a throw-away slurm.conf (its real name and CPUs,
# proctrack/linuxproc, task/none, select/cons_tres, state, spool and logs
# under $TMP, free high ports on 127.0.0.1) with munged on a key of its own.
# Nothing is installed here (.ci/deps installs Debian's slurm-wlm and
# munge); where the daemons cannot start the test skips, saying why. Inside
# `salloc -N1 -n2` the capture parts and the encodes run as job steps, and
# the directory must equal a local run's byte for byte; a step made to fail
# once is started again (the same bytes), one that always fails ends the
# conversion (exit 1) naming its node, its step and its stderr; kill -9 of
# convert leaves no step running; examples/slurm-convert.sbatch converts
# through sbatch. First, without the daemons, what a step gets from
# allocations of other shapes (nodes, tasks, CPUs per task, memory, GPUs).
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/lib-convert.sh"
cd "$TMP"

skip_all() { skip "$1"; done_testing; }
# a test run inside someone's allocation must not see it
unset $(compgen -e | grep '^SLURM_') 2>/dev/null || true
command -v parallel >/dev/null || skip_all "convert --slurm: no GNU parallel"
tiny_model m 1
opts=(--bits 3 --rows 8 --cols 64 --chunk-rows 3 -q)

# What a step gets, by the allocation's shape, as -n --slurm says and the
# run uses: SLURM_* as salloc/sbatch set them, and the job's TRES from a
# stand-in scontrol (no daemon needed for these)
mkdir fake
printf '#!/bin/sh\ncase "$1 $2" in\n"show job") echo "JobId=7 NumNodes=2 TRES=$X3T_TRES" ;;\n"show hostnames") printf "n1\\nn2\\n" ;;\nesac\n' >fake/scontrol
printf '#!/bin/sh\necho "srun: not here" >&2; exit 1\n' >fake/srun
chmod +x fake/*
shape() {
	env PATH="$TMP/fake:$PATH" SLURM_JOB_ID=7 SLURM_JOB_NODELIST='n[1-2]' SLURM_JOB_CPUS_PER_NODE='16(x2)' \
		X3T_TRES=cpu=32,node=2 "$@" convert -n --json --slurm m s "${opts[@]}" |
		jq -r '[.slurm.per_step.cpus, .slurm.per_step.gpus, .slurm.steps_at_once, .slurm.srun, .devices.encode,
			(.slurm.nodes | map(.name) | join(","))] | join(" ")'
}
check "-n --slurm, 2 nodes of 16 CPUs: a step a node, of 16 CPUs" \
	test "$(shape)" = "16 0 2 srun --exclusive -N1 -n1 -c 16 cpu n1,n2"
check "... -n 8: 8 steps of 4 CPUs" test "$(shape SLURM_NTASKS=8)" = "4 0 8 srun --exclusive -N1 -n1 -c 4 cpu n1,n2"
check "... -c 8 on 16, 16 and 8 CPUs: 5 steps of 8 (CPUs per task first)" \
	test "$(shape SLURM_JOB_CPUS_PER_NODE='16(x2),8' SLURM_NTASKS=3 SLURM_CPUS_PER_TASK=8)" = "8 0 5 srun --exclusive -N1 -n1 -c 8 cpu n1,n2,"
check "... --mem 64000 a node, -n 8: --mem 16000 a step" \
	test "$(shape SLURM_NTASKS=8 SLURM_MEM_PER_NODE=64000)" = "4 0 8 srun --exclusive -N1 -n1 -c 4 --mem=16000 cpu n1,n2"
check "... --mem-per-cpu 2000: the steps' too" \
	test "$(shape SLURM_NTASKS=8 SLURM_MEM_PER_CPU=2000)" = "4 0 8 srun --exclusive -N1 -n1 -c 4 --mem-per-cpu=2000 cpu n1,n2"
check "... 4 GPUs: 4 steps of one GPU and 8 CPUs, the stages on cuda" \
	test "$(shape X3T_TRES=cpu=32,node=2,billing=32,gres/gpu=4 SLURM_NTASKS=2)" = "8 1 4 srun --exclusive -N1 -n1 -c 8 --gres=gpu:1 cuda n1,n2"
check_fail "... a step larger than a node: exit 1" 1 "too few CPUs for one step" \
	env PATH="$TMP/fake:$PATH" SLURM_JOB_ID=7 SLURM_JOB_CPUS_PER_NODE=4 SLURM_CPUS_PER_TASK=8 X3T_TRES=cpu=4 \
	convert -n --slurm m s "${opts[@]}"
check_fail "... a CPU list it cannot read: exit 1, naming it" 1 "SLURM_JOB_CPUS_PER_NODE: 'x'" \
	env PATH="$TMP/fake:$PATH" SLURM_JOB_ID=7 SLURM_JOB_CPUS_PER_NODE=x convert -n --slurm m s "${opts[@]}"
[ "$(id -u)" -eq 0 ] || skip_all "convert --slurm: the Slurm daemons start as root, and this is uid $(id -u)"
PATH=$PATH:/usr/sbin:/sbin
for p in munged slurmctld slurmd salloc srun scontrol sinfo squeue scancel; do
	command -v "$p" >/dev/null || skip_all "convert --slurm: no $p (Debian slurm-wlm and munge, .ci/deps)"
done

# wait_for SECONDS CMD...: until CMD succeeds, every 0.2 s
wait_for() { local n=$(($1 * 5)); shift; while ! "$@"; do n=$((n - 1)); [ $n -gt 0 ] || return 1; sleep 0.2; done; }
d=$TMP/slurm
mkdir -p -m 700 "$d" && mkdir -p "$d/state" "$d/spool" "$d/log"
pids=()
# stop PID: a daemon of this test, TERM, then KILL after 10 s (slurmd
# that cannot reach its controller does not end on TERM)
running() { local s; s=$(ps -o stat= -p "$1" 2>/dev/null) && [[ $s != Z* ]]; }
stop() {
	kill "$1" 2>/dev/null || return 0
	wait_for 10 eval '! running '"$1" || kill -KILL "$1" 2>/dev/null
	wait "$1" 2>/dev/null
}
# the daemons this test started, by their pids: jobs of this cluster
# cancelled first (their slurmstepd ends with them), then slurmd,
# slurmctld, munged
stop_all() {
	if [ ${#pids[@]} -gt 1 ]; then
		timeout 10 squeue -h -o %i 2>/dev/null | xargs -r timeout 10 scancel 2>/dev/null
		wait_for 10 sh -c '[ -z "$(timeout 5 squeue -h -o %i 2>/dev/null)" ]' || true
	fi
	local i
	for ((i = ${#pids[@]} - 1; i >= 0; i--)); do stop "${pids[i]}"; done
	pids=()
}
trap 'stop_all; rm -rf "$TMP"' EXIT

head -c 1024 /dev/urandom >"$d/munge.key" && chmod 600 "$d/munge.key"
munged -F -f --key-file="$d/munge.key" --socket="$d/munge.sock" --pid-file="$d/munged.pid" \
	--seed-file="$d/munged.seed" 2>"$d/log/munged.log" &
pids+=($!)
wait_for 10 test -S "$d/munge.sock" ||
	skip_all "convert --slurm: munged did not start ($(tr '\n' ' ' <"$d/log/munged.log" | cut -c1-200))"

host=$(hostname -s)
node=$(slurmd -C 2>/dev/null | sed -n '1s/^NodeName=[^ ]* //p')
[ -n "$node" ] || skip_all "convert --slurm: slurmd -C printed no node configuration"
export SLURM_CONF=$d/slurm.conf
started=0
for try in 1 2 3; do
	port=$((20000 + (RANDOM * 7 + $$ + try * 131) % 40000))
	cat >"$SLURM_CONF" <<EOF
ClusterName=x3test
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$port
SlurmdPort=$((port + 1))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$d/munge.sock
CredType=cred/munge
StateSaveLocation=$d/state
SlurmdSpoolDir=$d/spool
SlurmctldPidFile=$d/slurmctld.pid
SlurmdPidFile=$d/slurmd.pid
SlurmctldLogFile=$d/log/slurmctld.log
SlurmdLogFile=$d/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/builtin
MpiDefault=none
MailProg=/bin/true
ReturnToService=2
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
NodeName=$host NodeAddr=127.0.0.1 $node State=UNKNOWN
PartitionName=x3 Nodes=$host Default=YES MaxTime=INFINITE State=UP
EOF
	slurmctld -D -c -f "$SLURM_CONF" >"$d/log/slurmctld.out" 2>&1 &
	cpid=$!
	slurmd -D -f "$SLURM_CONF" >"$d/log/slurmd.out" 2>&1 &
	dpid=$!
	# until the node is idle, 30 s at most, or a daemon has ended (a
	# port taken: then the next)
	for i in $(seq 150); do
		kill -0 "$cpid" 2>/dev/null && kill -0 "$dpid" 2>/dev/null || break
		[ "$(timeout 5 sinfo -h -n "$host" -o %t 2>/dev/null)" != idle ] || { started=1; break; }
		sleep 0.2
	done
	[ "$started" -eq 0 ] || { pids+=("$cpid" "$dpid"); break; }
	stop "$dpid"; stop "$cpid"
done
[ "$started" -eq 1 ] ||
	skip_all "convert --slurm: slurmctld and slurmd did not bring node $host to idle ($( { grep -h -i fatal "$d"/log/*.out; grep -h -i error "$d"/log/*.out | grep -v -i pmix; } | head -2 | tr '\n' ' ' | cut -c1-240))"
ok "slurmctld and slurmd on 127.0.0.1:$port: node $host idle ($node)"

# srun as a shim on PATH that notes each call (every job step is one), and
# a hessian-capture and a trellis-encode that note whether they ran in a
# step (SLURM_STEP_ID); inside a step the encode fails where told to: once
# (the file fail-once, taken away by the failure) or always (fail-always),
# and with the file stop-step it stops (sleeps until killed; its pid in
# stopped-step)
mkdir shim
printf '#!/bin/sh\necho "$*" >>%s/srun.log\nexec %s "$@"\n' "$TMP" "$(command -v srun)" >shim/srun
printf '#!/bin/sh\necho "${SLURM_STEP_ID:+step} $*" >>%s/hc.log\nexec %s/bin/hessian-capture "$@"\n' "$TMP" "$ROOT" >shim/hessian-capture
cat >shim/trellis-encode <<EOF
#!/bin/sh
echo "\${SLURM_STEP_ID:+step} \$*" >>$TMP/te.log
if [ -n "\$SLURM_STEP_ID" ]; then
	if [ -e $TMP/stop-step ]; then echo \$\$ >$TMP/stopped-step; exec sleep 300; fi
	if mv $TMP/fail-once $TMP/fail-once.taken 2>/dev/null || [ -e $TMP/fail-always ]; then
		cat >/dev/null; echo "trellis-encode: planted failure in step \$SLURM_JOB_ID.\$SLURM_STEP_ID" >&2; exit 3
	fi
fi
exec $ROOT/bin/trellis-encode "\$@"
EOF
chmod +x shim/*
export PATH="$TMP/shim:$PATH"
# the allocation: one node, two tasks of one CPU; a conversion waits for it
# 30 s at most, and runs under a timeout
sal() { timeout 300 salloc -Q -I30 -N1 -n2 -J x3test "$@"; }

check "convert locally, -j 1" convert m a "${opts[@]}" -j 1
check_fail "convert --slurm outside an allocation: exit 1, says so" 1 'not inside a Slurm allocation' \
	convert m x "${opts[@]}" --slurm
sal convert -n --json --slurm m b "${opts[@]}" >dry.json
check "convert -n --slurm in the allocation: its job, 2 steps at a time of 1 CPU, nothing written" \
	jqe --arg h "$host" '.slurm.job != null and .slurm.steps_at_once == 2 and .slurm.per_step.cpus == 1
		and .slurm.nodes == [{name: $h, cpus: 2}] and (.slurm.srun | test("--exclusive -N1 -n1 -c 1"))' dry.json
check "... and started no step (no srun call), wrote nothing" sh -c '! test -e srun.log && ! test -e b && ! test -e b.work'
convert -n --slurm m b "${opts[@]}" >dry.txt
check "convert -n --slurm outside an allocation: the same steps, listed, said to be without one" \
	sh -c "grep -q 'not inside an allocation' dry.txt && [ \$(grep -c '^  \(capture h1\|encode\) ' dry.txt) -eq $(jq .slurm.counts.steps dry.json) ]"
rm -f hc.log te.log
check "convert --slurm in salloc -N1 -n2" sal convert m b "${opts[@]}" --slurm
check "--slurm vs local: byte-identical directories" diff -r a b
# every step is an srun of its own, one per capture part and per encode,
# as many as -n --slurm listed; the programs ran inside them
nsteps=$(cat srun.log 2>/dev/null | wc -l)
check "the $(jq .slurm.counts.steps dry.json) steps -n --slurm listed ran as $nsteps job steps" \
	test "$nsteps" -eq "$(jq .slurm.counts.steps dry.json)"
check "... each srun --exclusive -N1 -n1 -c 1" test "$(grep -c -- '--exclusive -N1 -n1 -c 1 ' srun.log)" -eq "$nsteps"
# 8 rows in chunks of 3: 3 parts, for the layer and for the head
check "the 6 capture parts ran in job steps" test "$(grep -c '^step .*--part [0-2] ' hc.log)" -eq 6
check "... and no capture outside one" sh -c "! grep -v '^step' hc.log | grep -v -e '--merge' -e '--list-parts' | grep -q ."
check "the $(jq '[.slurm.steps[] | select(.step == "encode")] | length' dry.json) encodes ran in job steps" \
	test "$(grep -c '^step ' te.log)" -eq "$(jq '[.slurm.steps[] | select(.step == "encode")] | length' dry.json)"
check "... and none outside one" sh -c "! grep -v '^step ' te.log | grep -q ."

# a step that fails once is started again: the same bytes
rm -rf b b.work srun.log
touch fail-once
check_fail "a step failing once: started again, the conversion completes" 0 \
	"job step [0-9]+\.[0-9]+ \(enc/[^)]*\) failed on node $host \(exit [0-9]+\): starting it again \(1 of 1\)" \
	sal convert m b "${opts[@]}" --slurm
check "... the failure was planted (fail-once taken)" test -e fail-once.taken
check "... byte-identical to the local run" diff -r a b
# a step that always fails: two tries (--retries 1), then exit 1 naming it
rm -rf b b.work
touch fail-always
check_fail "a step failing always: exit 1 naming the node, the step and its stderr" 1 \
	"job step [0-9]+\.[0-9]+ \(enc/[^)]*\) failed on node $host \(exit [0-9]+, tried 2 times\)" \
	sal convert m b "${opts[@]}" --slurm
check "... its stderr quoted" grep -q '^  trellis-encode: planted failure in step [0-9]*\.[0-9]*' "$TMP/cf.err"
check "... no output that looks complete" sh -c '! test -e b/config.json && ! test -e b/model.safetensors'
f=$(grep -o 'job step [0-9.]* (enc/[^)]*) failed on node .*tried' cf.err | sed 's/^[^(]*(\([^)]*\)).*/\1/' | head -1)
check "... the encode that failed (${f:-none named}) left no file" sh -c "[ -n '$f' ] && ! test -e 'b.work/$f'"
# --retries 0: the first failure ends it
check_fail "--retries 0: one try" 1 "failed on node $host \(exit [0-9]+\); its stderr" \
	sal convert m b "${opts[@]}" --slurm --retries 0
check "... not started again" sh -c "! grep -q 'starting it again' cf.err"
# resumed in a new allocation once the failure is gone
rm -f fail-always
check "a re-run in a new allocation completes" sal convert m b "${opts[@]}" --slurm
check "... byte-identical to the local run" diff -r a b
# kill -9 of convert --slurm in an allocation that goes on (an sbatch
# script that resumes): its watchdog ends its sruns, Slurm their steps,
# and a re-run in that allocation completes
touch stop-step
cat >killrun.sh <<EOF
wait_for() { local n=\$((\$1 * 5)); shift; while ! "\$@"; do n=\$((n - 1)); [ \$n -gt 0 ] || return 1; sleep 0.2; done; }
steps() { squeue -h -s -j "\$SLURM_JOB_ID" -o %j | grep -q '^x3-'; }
setsid convert m c ${opts[*]} --slurm & cpid=\$!
wait_for 60 test -s stopped-step || { echo "no step reached the stop"; exit 1; }
steps || { echo "no step of the conversion in squeue"; exit 1; }
kill -KILL -- -\$cpid; wait \$cpid 2>/dev/null
wait_for 15 sh -c '! kill -0 \$(cat stopped-step) 2>/dev/null' || { echo "the stopped step still runs"; exit 1; }
wait_for 15 sh -c '! squeue -h -s -j "\$SLURM_JOB_ID" -o %j | grep -q "^x3-"' || { echo "a step of the conversion is still in squeue"; exit 1; }
rm -f stop-step
convert m c ${opts[*]} --slurm || { echo "the re-run failed"; exit 1; }
EOF
check "kill -9 of convert --slurm: its steps end, a re-run in the allocation completes" sal bash killrun.sh
[ ! -s stopped-step ] || kill "$(cat stopped-step)" 2>/dev/null || true
check "... byte-identical to the local run" diff -r a c
# examples/slurm-convert.sbatch: the allocation sized from the dry run (one
# node of 2 CPUs, a step of 1 CPU: two steps a node, each with the larger
# peak of the dry run and a quarter more), then submitted and waited for
mib=$(jq '[.memory.capture, .memory.encode] | max * 1.25 / 1048576 | ceil' dry.json)
export X3_NODES=1 X3_CPUS_PER_STEP=1
check "examples/slurm-convert.sbatch -n: sbatch --nodes=1 --ntasks-per-node=2 --cpus-per-task=1 --mem-per-cpu=$mib" \
	sh -c "'$ROOT/examples/slurm-convert.sbatch' -n m e 3 ${opts[*]} 2>/dev/null | grep -q -- 'sbatch .*--nodes=1 --ntasks-per-node=2 --cpus-per-task=1 --mem-per-cpu=$mib '"
check "... submits nothing, writes nothing" sh -c '[ -z "$(squeue -h -o %i)" ] && ! test -e e && ! test -e e.work'
check "examples/slurm-convert.sbatch: the batch job converts" \
	env X3_SBATCH_OPTS="--wait -o $TMP/e.log" timeout 300 "$ROOT/examples/slurm-convert.sbatch" m e 3 "${opts[@]}" >e.out 2>e.err
check "... byte-identical to the local run" diff -r a e
unset X3_NODES X3_CPUS_PER_STEP
check_fail "--retries x: a usage error" 2 "--retries: 'x'" convert m b "${opts[@]}" --slurm --retries x
check_fail "--slurm with --hosts: a usage error" 2 "--slurm excludes" convert m b "${opts[@]}" --slurm --hosts /dev/null
stop_all
done_testing
