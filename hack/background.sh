# shellcheck shell=bash
# Background jobs for the scripts that run the tests (hack/test.sh, .ci/run); source it.
#
# Each job runs in a process group of its own (job control is on once this is sourced), so that it is
# stopped with all its children when the script exits, whether it ends, fails or is interrupted. A job's
# output goes to a log file, whose end is shown when the job fails. Jobs stay in the script's session:
# under autogroup scheduling (kernel.sched_autogroup_enabled) a new session would be a scheduler group of
# its own, and a job's nice value or SCHED_IDLE would no longer put it below the script's foreground work.
set -m
declare -A bg_pids bg_logs
bg_stop() {
	local pid
	for pid in "${bg_pids[@]}"; do
		kill -- "-$pid" 2>/dev/null || true
	done
}
trap bg_stop EXIT
trap 'exit 130' INT TERM

# bg_start NAME LOG COMMAND...: start COMMAND in the background, reading nothing, writing to LOG.
bg_start() {
	local name=$1 log=$2
	shift 2
	"$@" </dev/null >"$log" 2>&1 &
	bg_pids[$name]=$!
	bg_logs[$name]=$log
}

# bg_wait NAME: wait for NAME to end. When it failed, show the end of its log, say so on stderr and
# return 1.
bg_wait() {
	local name=$1
	if wait "${bg_pids[$name]}"; then
		return 0
	fi
	tail -n 60 "${bg_logs[$name]}"
	echo "$name failed (its whole log: ${bg_logs[$name]})" >&2
	return 1
}
