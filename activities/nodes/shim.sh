#!/bin/sh
# Lazarus node shim: the rank mechanics of activities/nodes/rank_wrapper.py and
# activities/stop.py, for a remote POSIX host where Lazarus is not installed.
#
# Why plain sh: the node needs nothing from us but a shell, coreutils, util-linux
# setsid and /proc. The controller sends this whole file on every command (it is
# small), so the node never runs a stale copy and there is nothing to deploy.
#
# Protocol. The agent runs `sh -s` and writes to its stdin: this file, then one
# or more lines `shim_main SUBCOMMAND ARG... </dev/null`, every argument quoted
# with Python's shlex.quote. Nothing reaches the remote login shell but `sh -s`,
# so a spec value can never be parsed as shell. Run directly,
# `sh shim.sh SUBCOMMAND ARG...` does the same (handy when debugging a node).
# Every subcommand prints one JSON object per line on stdout (tail prints raw
# bytes); failures print {"error": "..."} (with "rank" where one applies).
#
#   start GEN_DIR RANK WORKDIR [--env-file FILE] -- CMD...   (stdin: the env)
#       {"rank","pid","pgid","start_ticks","log_file","adopted"}
#       The rank's whole environment comes on stdin as sh assignments (KEY='VALUE'
#       lines, values quoted by the agent), never as arguments: every user can read
#       any process's argv in /proc/PID/cmdline. FILE (env_from_file) is read on
#       this node: KEY=VALUE lines, refused unless only its owner can read it.
#   status GEN_DIR RANK...
#       per rank {"rank","pid","alive","stopped","exit","heartbeat"}; exit and
#       heartbeat are the files' JSON objects embedded as they are, or null
#   stop RUN_ROOT KEEP_GEN|none GRACE_S [KILL_WAIT_CS]
#       {"signalled","killed","last_step","generations","survivors","survivor_pids"}
#       survivor_pids: [[PGID,PID],...] still alive KILL_WAIT_CS (default 1000)
#       centiseconds after SIGKILL
#   tail GEN_DIR RANK MAX_BYTES            raw bytes of the end of rank-N.log
#   read GEN_DIR RANK OFFSET MAX_BYTES     {"log_size","mtime"} (nulls: no such log),
#       then raw bytes of rank-N.log from byte OFFSET, at most MAX_BYTES
#   preflight INTERPRETER WORKDIR DISK_PATH TIMEOUT_S MAX_OUTPUT [-- HEALTH_CMD...]
#       {"interpreter","workdir_exists","disk_path","free_kb","health_exit",
#        "health_timed_out","health_output"}
#   write PATH [CONTENT]                   (stdin without CONTENT) {"written"}
#   memory ROOT                            per committed step-N under ROOT:
#       {"root","memory_step","manifest","sizes"} (manifest embedded or null)
#   replica-restore VERB PROGRAM WORKDIR   (stdin: the ranks' PATH line, their
#       PYTHONPATH line, then the request, its key included) runs `PROGRAM -m
#       lazarus.rank.replica_restore VERB` (send or receive) in WORKDIR: one end of
#       a replica's copy node to node; its one JSON line ({"error"} when it cannot)
#   hang-evidence PROGRAM WORKDIR          (stdin: the ranks' PATH line, their
#       PYTHONPATH line, then the request) runs `PROGRAM -m
#       lazarus.rank.hang_evidence` in WORKDIR: a hung generation's Python stacks
#       (py-spy) and flight-recorder dumps read on this node; its one JSON line
#       ({"hang_evidence"}, or {"error"} when it cannot)
#   end-run MEMORY_DIR                     {"removed"} the run's memory tier, only
#       under /dev/shm/lazarus/ (it is removed recursively)
#   warm GEN_DIR PROGRAM WORKDIR           (stdin: the ranks' PATH line (empty:
#       the node's own), their PYTHONPATH line, then one JSON request) runs `PROGRAM -m
#       activities.nodes.warm` (PROGRAM found on the ranks' PATH: the ranks'
#       own interpreter) in WORKDIR, which forks the ranks from the run's zygote on
#       this node, starting it when needed, detached; one JSON line per rank, warm
#       or with the reason it must start cold ({"error"} when nothing can run)
#   rejoin GEN_DIR PROGRAM WORKDIR         (stdin: as warm, the request a
#       CarryRequest) runs `PROGRAM -m activities.nodes.carry` in WORKDIR, which carries
#       this node's surviving ranks into GEN_DIR and fences the rest of the older
#       generations here; one CarryResult JSON line ({"error"} when it cannot)
#   stop-zygote RUN_ROOT NODE              {"zygotes_stopped"} NODE's zygotes of the
#       run (and of the runs below a job directory); forked ranks are not touched
#   json-escape STRING...                  one JSON string per line (for tests)
#
# Must run under dash: no bashisms, no awk, no python. Variables are global
# (dash has `local`, POSIX does not), so each function uses its own _prefixed
# names: a helper must never clobber a loop variable of its caller.

# --- Shared with the rank wrapper, which runs in a fresh `sh -c`: single-quoted,
# so no single quote may appear inside. -------------------------------------------
SHIM_LIB='
read_file() {
	# The whole file into RF, newlines turned into spaces: JSON stays JSON, and
	# /proc/PID/stat stays parseable even when a command name contains a newline.
	# Builtins only: status runs this for every rank on every poll.
	RF=
	[ -f "$1" ] || return 1
	{ while IFS= read -r _rl || [ -n "$_rl" ]; do RF="$RF$_rl "; done <"$1"; } 2>/dev/null
	[ -n "$RF" ]
}

proc_stat() {
	# PID (or self) -> ST_PID ST_STATE ST_PGRP ST_TICKS. The command name sits in
	# parentheses and may itself hold spaces or parens, so fields are counted from
	# the text after the LAST ")": state is field 3, pgrp 5, starttime 22.
	read_file "/proc/$1/stat" || return 1
	ST_PID=${RF%% *}
	set -- ${RF##*\)}
	[ $# -ge 20 ] || return 1
	ST_STATE=$1
	ST_PGRP=$3
	shift 19
	ST_TICKS=$1
}

now() {
	# Seconds since the epoch, with fractions where date knows %N (GNU, busybox).
	NOW=$(date +%s.%N 2>/dev/null)
	case $NOW in "" | .* | *. | *[!0-9.]*) NOW=$(date +%s) ;; esac
}

write_atomic() {
	# PATH CONTENT. Readers poll these files while they are written; a rename is
	# never seen half-done.
	case $1 in */*) _wd=${1%/*} ;; *) _wd=. ;; esac
	_wt="${_wd:-/}/.${1##*/}.$$.lazarus-tmp"
	if printf "%s" "$2" >"$_wt" && mv -f "$_wt" "$1"; then
		return 0
	fi
	rm -f "$_wt"
	return 1
}
'

# --- The rank's environment. The rank wrapper's subshell, after writing the pid
# file, becomes `env -i SH -s -- ENV_FILE CMD...` (exec: the pid is kept) reading
# this program from its stdin, a pipe: the env_from_file values, then the agent's
# assignments (so env and Lazarus's own variables win), then `exec CMD`. Secrets
# thus travel only through pipes and the owner-only file, never through an argv.
SHIM_ENV_LOADER='
unset PWD OLDPWD SHLVL
envf=$1
shift
if [ -n "$envf" ]; then
	while IFS= read -r _el || [ -n "$_el" ]; do
		case $_el in "" | "#"*) continue ;; *=*) ;; *) continue ;; esac
		_ek=${_el%%=*}
		case $_ek in "" | [0-9]* | *[!A-Za-z0-9_]*) continue ;; esac
		export "$_ek=${_el#*=}"
	done <"$envf" || exit 125
fi
unset envf _el _ek
set -a
'
SHIM_ENV_EXEC='
set +a
exec "$@" </dev/null
'

# --- The rank wrapper: `setsid -f sh -c "$SHIM_LIB$SHIM_WRAPPER" lazarus-rank
# GEN_DIR RANK WORKDIR SH ENV_FILE CMD...` with the environment program above on
# its stdin, stdout+stderr appended to the rank log. It is the
# session and group leader that `stop` signals as a whole. It ignores TERM, HUP
# and INT so that it outlives the rank and records how it ended; the rank runs in
# a foreground subshell that restores default dispositions, then writes the pid
# file (its own pid and start ticks are the rank's: exec keeps both) and execs the
# command. A foreground subshell, not `&`: sh would make SIGINT ignored for good
# in an asynchronous child, and a rank must get the signals it expects.
SHIM_WRAPPER='
gen=$1
rank=$2
workdir=$3
rsh=$4
envf=$5
shift 5
exitf="$gen/rank-$rank.exit.json"
trap "" TERM HUP INT
if ! cd "$workdir" 2>/dev/null; then
	echo "lazarus: cannot enter the workdir" >&2
	now
	write_atomic "$exitf" "{\"rank\":$rank,\"exit_code\":127,\"signal\":null,\"ended_at\":$NOW,\"error\":\"cannot enter the workdir\"}"
	exit 0
fi
proc_stat $$
wticks=$ST_TICKS
(
	trap - TERM HUP INT
	proc_stat self || exit 126
	now
	write_atomic "$gen/rank-$rank.pid" "{\"rank\":$rank,\"wrapper_pid\":$$,\"pgid\":$ST_PGRP,\"wrapper_start_ticks\":$wticks,\"pid\":$ST_PID,\"start_ticks\":$ST_TICKS,\"started_at\":$NOW}" || exit 126
	exec env -i "$rsh" -s -- "$envf" "$@"
)
rc=$?
now
code=$rc
sig=null
# A shell reports death by signal N as 128+N; it cannot tell that from exit(128+N),
# which training programs do not use on purpose.
if [ "$rc" -gt 128 ] && [ "$rc" -le 192 ]; then
	n=$((rc - 128))
	name=$(kill -l "$n" 2>/dev/null)
	case $name in "" | *[!A-Za-z0-9+-]*) name=$n ;; esac
	code=-$n
	sig="\"SIG$name\""
fi
write_atomic "$exitf" "{\"rank\":$rank,\"exit_code\":$code,\"signal\":$sig,\"ended_at\":$NOW}"
'

eval "$SHIM_LIB"

# --- JSON output --------------------------------------------------------------------

json_sed_init() {
	# One sed program that escapes a whole input (lines joined first). Control
	# bytes are produced with printf %b so this file itself stays plain text.
	JSON_SED=$(
		printf ':a\n$!N\n$!ba\ns/\\\\/\\\\\\\\/g\ns/"/\\\\"/g\ns/\\n/\\\\n/g\n'
		printf 's/%b/\\\\%s/g\n' '\0011' t '\0015' r '\0010' b '\0014' f
		printf 's/%b/\\\\u00%s/g\n' \
			'\0001' 01 '\0002' 02 '\0003' 03 '\0004' 04 '\0005' 05 '\0006' 06 '\0007' 07 \
			'\0013' 0b '\0016' 0e '\0017' 0f '\0020' 10 '\0021' 11 '\0022' 12 '\0023' 13 \
			'\0024' 14 '\0025' 15 '\0026' 16 '\0027' 17 '\0030' 18 '\0031' 19 '\0032' 1a \
			'\0033' 1b '\0034' 1c '\0035' 1d '\0036' 1e '\0037' 1f
	)
}

json_str() {
	# Print STRING as a JSON string literal. Most strings (paths, numbers) need no
	# escaping and cost no process; the rest go through sed once. The trailing "."
	# keeps $(...) from eating trailing newlines of the string itself.
	case $1 in
	*[\\\"]* | *[[:cntrl:]]*)
		[ -n "${JSON_SED-}" ] || json_sed_init
		_js=$(printf '%s.' "$1" | LC_ALL=C sed -e "$JSON_SED")
		printf '"%s"' "${_js%.}"
		;;
	*) printf '"%s"' "$1" ;;
	esac
}

fail() {
	# MESSAGE [RANK]: one error line; the caller returns non-zero.
	if [ $# -ge 2 ]; then
		printf '{"rank":%s,"error":%s}\n' "$2" "$(json_str "$1")"
	else
		printf '{"error":%s}\n' "$(json_str "$1")"
	fi
}

json_int() {
	# TEXT KEY -> JI: the integer value of "KEY" in a flat JSON object. Enough for
	# the files Lazarus itself writes (pid, pgid, start_ticks, step).
	_jr=${1#*\"$2\":}
	[ "$_jr" != "$1" ] || return 1
	while :; do case $_jr in " "*) _jr=${_jr# } ;; *) break ;; esac; done
	JI=${_jr%%[!0-9-]*}
	case $JI in "" | -) return 1 ;; esac
}

read_json_obj() {
	# FILE -> RJ: the file's JSON object on one line, or false when absent or not
	# plausibly one (the agent parses it; a torn foreign write must not break the
	# line around it).
	read_file "$1" || return 1
	RJ=$RF
	while :; do case $RJ in *" ") RJ=${RJ% } ;; *) break ;; esac; done
	case $RJ in "{"*"}") return 0 ;; esac
	return 1
}

# --- Small helpers ---------------------------------------------------------------

uptime_cs() {
	# Monotonic centiseconds from /proc/uptime: deadlines without forking date.
	read -r _up _idle </proc/uptime
	UP="${_up%.*}${_up#*.}"
	while :; do case $UP in 0?*) UP=${UP#0} ;; *) break ;; esac; done
}

nap() {
	sleep "${1:-0.05}" 2>/dev/null || sleep 1
}

is_uint() {
	case $1 in "" | *[!0-9]*) return 1 ;; esac
}

lock_gen() {
	# Hold GEN_DIR/.node.lock on fd 9 while starting ranks, as the local launcher
	# does, so a stop can never slip between two rank starts. flock is optional.
	# Not .launch.lock: on a filesystem shared with the controller, the controller
	# holds that one for the whole launch, and waiting on it would deadlock.
	[ "${LOCKED_GEN-}" = "$1" ] && return 0
	command -v flock >/dev/null 2>&1 || return 0
	command exec 9>>"$1/.node.lock" || return 0
	flock -w 60 9 || return 0
	LOCKED_GEN=$1
}

# --- start -----------------------------------------------------------------------------

check_env_file() {
	# FILE -> EF (why not). env_from_file must be a regular file only its owner can
	# read or write (0600 or stricter) holding KEY=VALUE lines. A line is never
	# quoted back: it may hold a secret.
	if [ ! -f "$1" ]; then
		EF="env_from_file: $1 does not exist on the node (or is not a regular file)"
		return 1
	fi
	if [ ! -r "$1" ]; then
		EF="env_from_file: $1 is not readable by this user"
		return 1
	fi
	_em=$(LC_ALL=C ls -ld -- "$1" 2>/dev/null)
	_em=${_em%% *}
	case $_em in
	-???------*) ;;
	*)
		EF="env_from_file: $1 is readable or writable by group or others (mode $_em); it holds secrets: chmod 600 $1"
		return 1
		;;
	esac
	_en=0
	while IFS= read -r _el || [ -n "$_el" ]; do
		_en=$((_en + 1))
		case $_el in "" | "#"*) continue ;; esac
		_ek=${_el%%=*}
		case $_el in *=*) ;; *) _ek= ;; esac
		case $_ek in
		"" | [0-9]* | *[!A-Za-z0-9_]*)
			EF="env_from_file: $1 line $_en: expected KEY=VALUE with KEY a variable name (letters, digits, '_'); the line is not shown, it may hold a secret"
			return 1
			;;
		esac
	done <"$1"
}

print_started() {
	# RANK PIDFILE_CONTENT LOG ADOPTED
	json_int "$2" pid && _sp=$JI || return 1
	json_int "$2" pgid && _sg=$JI || return 1
	json_int "$2" start_ticks && _st=$JI || return 1
	printf '{"rank":%s,"pid":%s,"pgid":%s,"start_ticks":%s,"log_file":%s,"adopted":%s}\n' \
		"$1" "$_sp" "$_sg" "$_st" "$(json_str "$3")" "$4"
}

shim_start() {
	# Read the environment first, whatever happens next: a writer blocked on a full
	# pipe would keep the session (and the agent) waiting.
	_env=$(cat)
	[ $# -ge 3 ] || {
		fail "start: usage: start GEN_DIR RANK WORKDIR [--env-file FILE] -- CMD..." "null"
		return 2
	}
	_gen=$1
	_rank=$2
	_wdir=$3
	shift 3
	_envf=
	if [ "${1-}" = "--env-file" ] && [ $# -ge 2 ]; then
		_envf=$2
		shift 2
	fi
	[ "${1-}" = "--" ] && shift
	is_uint "$_rank" || {
		fail "start: rank must be a number" "null"
		return 2
	}
	[ $# -gt 0 ] || {
		fail "start: no command for rank $_rank" "$_rank"
		return 2
	}
	command -v setsid >/dev/null 2>&1 || {
		fail "setsid not found on the node (util-linux); it is needed to detach ranks" "$_rank"
		return 1
	}
	mkdir -p -- "$_gen" 2>/dev/null || {
		fail "cannot create the run directory $_gen" "$_rank"
		return 1
	}
	lock_gen "$_gen"
	if [ -e "$_gen/stopped.json" ]; then
		fail "generation $_gen was stopped; launch a new one" "$_rank"
		return 1
	fi
	_pidf="$_gen/rank-$_rank.pid"
	_log="$_gen/rank-$_rank.log"
	# A fork request claimed this rank (warm): its pid file, if the zygote started
	# it, comes within seconds; only then may a cold start proceed.
	if [ -e "$_gen/rank-$_rank.zygote.claim" ] && [ ! -e "$_pidf" ]; then
		uptime_cs
		_deadline=$((UP + 1000))
		while [ ! -e "$_pidf" ] && [ "$UP" -lt "$_deadline" ]; do
			nap 0.02
			uptime_cs
		done
	fi
	# A retried launch: this rank was started before, whatever became of it since.
	if read_file "$_pidf"; then
		print_started "$_rank" "$RF" "$_log" true && return 0
		fail "rank $_rank: unreadable pid file $_pidf" "$_rank"
		return 1
	fi
	if [ ! -d "$_wdir" ]; then
		fail "workdir $_wdir does not exist on the node" "$_rank"
		return 1
	fi
	if [ -n "$_envf" ] && ! check_env_file "$_envf"; then
		fail "$EF" "$_rank"
		return 1
	fi
	rm -f -- "$_gen/rank-$_rank.exit.json"
	if [ -z "${SETSID_FORK-}" ]; then
		if setsid -f true >/dev/null 2>&1; then SETSID_FORK=yes; else SETSID_FORK=no; fi
	fi
	# fd 9 (the launch lock) must not leak: the wrapper would hold it for its life.
	# The environment goes down a pipe: printf is a builtin (no argv), and a wrapper
	# that dies before reading closes the pipe, so the writer never blocks for good.
	_rsh=${LAZARUS_SHIM_SH:-/bin/sh}
	# The node's own PATH first (its login environment), under everything else: a
	# rank whose spec sets no PATH finds its programs as a login on the node would.
	case $PATH in *"'"*) _npath= ;; *) _npath="PATH='$PATH'; export PATH" ;; esac
	if [ "$SETSID_FORK" = yes ]; then
		printf '%s\n%s\n%s\n%s\n' "$_npath" "$SHIM_ENV_LOADER" "$_env" "$SHIM_ENV_EXEC" |
			setsid -f "$_rsh" -c "$SHIM_LIB$SHIM_WRAPPER" lazarus-rank \
				"$_gen" "$_rank" "$_wdir" "$_rsh" "$_envf" "$@" >>"$_log" 2>&1 9>&-
	else
		# Old setsid without -f: an asynchronous child is never a group leader, so
		# setsid does not fork. (sh then ignores SIGINT in it for good.)
		printf '%s\n%s\n%s\n%s\n' "$_npath" "$SHIM_ENV_LOADER" "$_env" "$SHIM_ENV_EXEC" |
			setsid "$_rsh" -c "$SHIM_LIB$SHIM_WRAPPER" lazarus-rank \
				"$_gen" "$_rank" "$_wdir" "$_rsh" "$_envf" "$@" >>"$_log" 2>&1 9>&- &
	fi
	uptime_cs
	_deadline=$((UP + 3000))
	while :; do
		if read_file "$_pidf"; then
			print_started "$_rank" "$RF" "$_log" false && return 0
		fi
		if read_json_obj "$_gen/rank-$_rank.exit.json"; then
			fail "rank $_rank did not start: $RJ" "$_rank"
			return 1
		fi
		uptime_cs
		if [ "$UP" -ge "$_deadline" ]; then
			fail "rank $_rank: the wrapper wrote no pid file within 30 s" "$_rank"
			return 1
		fi
		nap 0.005
	done
}

# --- status ----------------------------------------------------------------------------

shim_status() {
	[ $# -ge 1 ] || return 2
	_gen=$1
	shift
	for _rank; do
		is_uint "$_rank" || continue
		_pid=null
		_alive=false
		_stopped=false
		_exit=null
		_hb=null
		if read_file "$_gen/rank-$_rank.pid" && json_int "$RF" pid; then
			_pid=$JI
			_want=
			json_int "$RF" start_ticks && _want=$JI
			if is_uint "$_pid" && proc_stat "$_pid"; then
				case $ST_STATE in
				Z | X) ;;
				*)
					if [ -z "$_want" ] || [ "$_want" = "$ST_TICKS" ]; then
						_alive=true
						case $ST_STATE in T | t) _stopped=true ;; esac
					fi
					;;
				esac
			fi
		fi
		read_json_obj "$_gen/rank-$_rank.exit.json" && _exit=$RJ
		read_json_obj "$_gen/rank-$_rank.heartbeat.json" && _hb=$RJ
		printf '{"rank":%s,"pid":%s,"alive":%s,"stopped":%s,"exit":%s,"heartbeat":%s}\n' \
			"$_rank" "$_pid" "$_alive" "$_stopped" "$_exit" "$_hb"
	done
}

# --- stop ------------------------------------------------------------------------------

live_groups() {
	# PGID... -> LIVE: the groups that still have a member that is not a zombie
	# (with no reaping init, zombies linger forever). kill -0 rules out most groups
	# without scanning /proc.
	LIVE=
	_lc=
	for _lg; do
		kill -0 -"$_lg" 2>/dev/null && _lc="$_lc $_lg "
	done
	[ -n "$_lc" ] || return 0
	for _ld in /proc/[0-9]*; do
		proc_stat "${_ld#/proc/}" || continue
		case $ST_STATE in Z | X) continue ;; esac
		case $_lc in *" $ST_PGRP "*) ;; *) continue ;; esac
		case "$LIVE " in *" $ST_PGRP "*) ;; *) LIVE="$LIVE $ST_PGRP" ;; esac
	done
}

group_is_ours() {
	# PIDFILE_CONTENT -> PG. A pgid is the wrapper's pid; Linux does not reuse it
	# while any member lives, but once all have died a new session leader may get
	# it. A leader whose start ticks differ from the wrapper's is someone else.
	json_int "$1" pgid || return 1
	PG=$JI
	is_uint "$PG" && [ "$PG" -gt 1 ] && [ "$PG" != "${MY_PGRP-}" ] || return 1
	json_int "$1" wrapper_start_ticks || return 0
	if proc_stat "$PG" && [ "$ST_PGRP" = "$PG" ] && [ "$ST_TICKS" != "$JI" ]; then
		return 1
	fi
	return 0
}

last_step_of() {
	# GEN_DIR -> STEP: the largest heartbeat step of its ranks, or empty.
	for _hf in "$1"/rank-*.heartbeat.json; do
		read_file "$_hf" || continue
		json_int "$RF" step || continue
		is_uint "$JI" || continue
		if [ -z "$STEP" ] || [ "$JI" -gt "$STEP" ]; then STEP=$JI; fi
	done
}

shim_stop() {
	[ $# -eq 3 ] || [ $# -eq 4 ] || {
		fail "stop: usage: stop RUN_ROOT KEEP_GEN|none GRACE_S [KILL_WAIT_CS]"
		return 2
	}
	_root=$1
	_keep=$2
	_grace=$3
	_kill_cs=${4:-1000}
	is_uint "$_kill_cs" || {
		fail "stop: the SIGKILL wait must be a whole number of centiseconds"
		return 2
	}
	case $_keep in none) ;; *) is_uint "$_keep" || {
		fail "stop: keep generation must be a number or none"
		return 2
	} ;; esac
	# GRACE_S (decimal seconds) -> centiseconds, without arithmetic on fractions.
	_gi=${_grace%%.*}
	_gf=
	case $_grace in *.*) _gf=${_grace#*.} ;; esac
	_gf="${_gf}00"
	_gf=${_gf%"${_gf#??}"}
	is_uint "${_gi:-0}" && is_uint "$_gf" || {
		fail "stop: grace must be a number of seconds"
		return 2
	}
	while :; do case $_gf in 0?*) _gf=${_gf#0} ;; *) break ;; esac; done
	_grace_cs=$((${_gi:-0} * 100 + _gf))

	# Never our own group, whatever a pid file says.
	proc_stat self && MY_PGRP=$ST_PGRP
	_targets=
	_all=
	for _g in "$_root"/gen-*; do
		[ -d "$_g" ] || continue
		_n=${_g##*/gen-}
		case $_n in ????? | ?????*) ;; *) continue ;; esac
		is_uint "$_n" || continue
		while :; do case $_n in 0?*) _n=${_n#0} ;; *) break ;; esac; done
		[ "$_keep" != none ] && [ "$_n" -eq "$_keep" ] && continue
		# Wait out a launch in progress, and fence the generation against a late one.
		if command -v flock >/dev/null 2>&1 && command exec 8>>"$_g/.node.lock"; then
			flock -w 10 8
		fi
		if [ ! -e "$_g/stopped.json" ]; then
			now
			write_atomic "$_g/stopped.json" "{\"reason\":\"stopping\",\"at\":$NOW}"
		fi
		_gg=
		for _pf in "$_g"/rank-*.pid; do
			read_file "$_pf" || continue
			group_is_ours "$RF" || continue
			case "$_gg " in *" $PG "*) continue ;; esac
			_gg="$_gg $PG"
		done
		command exec 8>&-
		LIVE=
		[ -n "$_gg" ] && live_groups $_gg
		[ -n "$LIVE" ] || continue
		# Names only (gen-NNNNN never holds a space); the root may.
		_targets="$_targets ${_g##*/}"
		_all="$_all$LIVE"
	done

	_signalled=0
	for _pg in $_all; do
		kill -TERM -"$_pg" 2>/dev/null
		kill -CONT -"$_pg" 2>/dev/null
		_signalled=$((_signalled + 1))
	done
	_remaining=$_all
	uptime_cs
	_deadline=$((UP + _grace_cs))
	while [ -n "$_remaining" ]; do
		uptime_cs
		[ "$UP" -lt "$_deadline" ] || break
		nap 0.05
		live_groups $_remaining
		_remaining=$LIVE
	done
	_killed=0
	for _pg in $_remaining; do
		kill -KILL -"$_pg" 2>/dev/null
		_killed=$((_killed + 1))
	done
	# SIGKILL is not instant: wait until the kernel has really taken them down, so
	# the next generation never overlaps this one.
	uptime_cs
	_deadline=$((UP + _kill_cs))
	while [ -n "$_remaining" ]; do
		nap 0.02
		live_groups $_remaining
		_remaining=$LIVE
		uptime_cs
		[ "$UP" -lt "$_deadline" ] || break
	done

	STEP=
	_gens=
	for _name in $_targets; do
		_gd="$_root/$_name"
		_n=${_name#gen-}
		while :; do case $_n in 0?*) _n=${_n#0} ;; *) break ;; esac; done
		now
		write_atomic "$_gd/stopped.json" "{\"reason\":\"stopped\",\"at\":$NOW}"
		# A rank or wrapper killed mid-write leaves its temporary file; once every
		# group is gone nobody will rename it (as local_agent._sweep_temp_files).
		[ -n "$_remaining" ] || rm -f -- "$_gd"/.*.lazarus-tmp
		last_step_of "$_gd"
		_gens="${_gens:+$_gens,}$_n"
	done
	_surv=
	for _pg in $_remaining; do _surv="${_surv:+$_surv,}$_pg"; done
	# Name the survivors' pids: the operator must know what would not die.
	_spids=
	if [ -n "$_remaining" ]; then
		for _ld in /proc/[0-9]*; do
			proc_stat "${_ld#/proc/}" || continue
			case $ST_STATE in Z | X) continue ;; esac
			case " $_remaining " in *" $ST_PGRP "*) ;; *) continue ;; esac
			_spids="${_spids:+$_spids,}[$ST_PGRP,$ST_PID]"
		done
	fi
	printf '{"signalled":%s,"killed":%s,"last_step":%s,"generations":[%s],"survivors":[%s],"survivor_pids":[%s]}\n' \
		"$_signalled" "$_killed" "${STEP:-null}" "$_gens" "$_surv" "$_spids"
	[ -z "$_remaining" ]
}

# --- tail, write, preflight --------------------------------------------------------------

shim_tail() {
	[ $# -eq 3 ] || return 2
	is_uint "$2" && is_uint "$3" || return 2
	[ -f "$1/rank-$2.log" ] || return 0
	tail -c "$3" -- "$1/rank-$2.log" 2>/dev/null
}

shim_read() {
	[ $# -eq 4 ] || return 2
	is_uint "$2" && is_uint "$3" && is_uint "$4" || return 2
	_rlf="$1/rank-$2.log"
	if [ ! -f "$_rlf" ]; then
		printf '{"log_size":null,"mtime":null}\n'
		return 0
	fi
	_rls=$(wc -c <"$_rlf" 2>/dev/null | tr -d ' ')
	_rlm=$(stat -c %Y -- "$_rlf" 2>/dev/null)
	is_uint "$_rls" || _rls=null
	is_uint "$_rlm" || _rlm=null
	printf '{"log_size":%s,"mtime":%s}\n' "$_rls" "$_rlm"
	[ "$4" -gt 0 ] || return 0
	tail -c +"$(($3 + 1))" -- "$_rlf" 2>/dev/null | head -c "$4"
}

shim_write() {
	[ $# -ge 1 ] || {
		fail "write: usage: write PATH [CONTENT]"
		return 2
	}
	case $1 in */*) _d=${1%/*} ;; *) _d=. ;; esac
	mkdir -p -- "${_d:-/}" 2>/dev/null || {
		fail "cannot create the directory of $1"
		return 1
	}
	_t="${_d:-/}/.${1##*/}.$$.lazarus-tmp"
	if [ $# -ge 2 ]; then
		printf '%s' "$2" >"$_t"
	else
		cat >"$_t"
	fi && mv -f -- "$_t" "$1" || {
		rm -f -- "$_t"
		fail "cannot write $1"
		return 1
	}
	printf '{"written":%s}\n' "$(json_str "$1")"
}

# The memory tier's logical root (/dev/shm/lazarus, the same on every node) lies in
# this user's private root, /dev/shm/lazarus-<uid> (lazarus.domain.memory_tier.on_node).
# tier_path LOGICAL sets _tp to the path on this node, after checking that every
# directory of it that exists is ours, no symlink, and closed to group and others.
tier_path() {
	case $1 in
	/dev/shm/lazarus | /dev/shm/lazarus/*) ;;
	*)
		_tp=$1 # not the tier's: a directory of the caller's choosing
		return 0
		;;
	esac
	_tp=/dev/shm/lazarus-$(id -u)${1#/dev/shm/lazarus}
	_tc=/dev/shm/lazarus-$(id -u)
	_trest=${1#/dev/shm/lazarus}
	while :; do
		[ -e "$_tc" ] || [ -L "$_tc" ] || return 0
		if [ -L "$_tc" ] || [ ! -d "$_tc" ] || [ ! -O "$_tc" ] ||
			[ -n "$(find "$_tc" -maxdepth 0 -perm /077 2>/dev/null)" ]; then
			fail "memory tier: $_tc is not a private directory of this user (refused)"
			return 1
		fi
		_trest=${_trest#/}
		[ -n "$_trest" ] || return 0
		_tc=$_tc/${_trest%%/*}
		case $_trest in */*) _trest=${_trest#*/} ;; *) _trest= ;; esac
	done
}

shim_end_run() {
	[ $# -eq 1 ] || {
		fail "end-run: usage: end-run MEMORY_DIR"
		return 2
	}
	case $1/ in
	*/../* | */./* | *//*) _ok=no ;;
	*) case $1 in /dev/shm/lazarus/?*) _ok=yes ;; *) _ok=no ;; esac ;;
	esac
	[ "$_ok" = yes ] || {
		fail "end-run: refusing to remove $1: not a run directory under /dev/shm/lazarus"
		return 2
	}
	tier_path "$1" || return 1
	rm -rf -- "$_tp" 2>/dev/null
	[ ! -e "$_tp" ] || {
		fail "end-run: cannot remove $_tp"
		return 1
	}
	# the job's directory too, once empty (rmdir leaves one another run still uses)
	case ${1%/*} in /dev/shm/lazarus/?*) rmdir -- "${_tp%/*}" 2>/dev/null ;; esac
	printf '{"removed":%s}\n' "$(json_str "$1")"
}

# --- warm starts ------------------------------------------------------------------------

shim_warm() {
	shim_python activities.nodes.warm warm "$@"
}

shim_rejoin() {
	shim_python activities.nodes.carry rejoin "$@"
}

shim_python() {
	# MODULE VERB GEN_DIR PROGRAM WORKDIR: run `PROGRAM -m MODULE` (Lazarus's own
	# code, with the ranks' interpreter) in WORKDIR, holding GEN_DIR's launch lock.
	# stdin: the ranks' PATH and PYTHONPATH, then the request (it may hold their
	# environments: stdin only, never an argument).
	_wmod=$1
	_wverb=$2
	shift 2
	[ $# -eq 3 ] || {
		fail "$_wverb: usage: $_wverb GEN_DIR PROGRAM WORKDIR"
		return 2
	}
	_gen=$1
	mkdir -p -- "$_gen" 2>/dev/null || {
		fail "cannot create the run directory $_gen"
		return 1
	}
	lock_gen "$_gen"
	if [ -e "$_gen/stopped.json" ]; then
		fail "generation $_gen was stopped; launch a new one"
		return 1
	fi
	shim_run_module "$_wmod" "$_wverb" "$2" "$3"
}

shim_replica_restore() {
	# VERB PROGRAM WORKDIR: one end of a replica restore (no generation: it runs before
	# the launch, and holds no lock). stdin as shim_python's; the request holds the key.
	[ $# -eq 3 ] || {
		fail "replica-restore: usage: replica-restore VERB PROGRAM WORKDIR"
		return 2
	}
	case $1 in send | receive) ;; *)
		fail "replica-restore: VERB must be send or receive"
		return 2
		;;
	esac
	shim_run_module "lazarus.rank.replica_restore $1" replica-restore "$2" "$3"
}

shim_hang_evidence() {
	# PROGRAM WORKDIR: a hang's evidence read on this node (no lock: the ranks are live
	# and the stop waits for this). stdin as shim_python's.
	[ $# -eq 2 ] || {
		fail "hang-evidence: usage: hang-evidence PROGRAM WORKDIR"
		return 2
	}
	shim_run_module lazarus.rank.hang_evidence hang-evidence "$1" "$2"
}

shim_run_module() {
	# MODULE VERB PROGRAM WORKDIR: run `PROGRAM -m MODULE` (its words: a module and its
	# arguments) with the ranks' interpreter in WORKDIR. stdin: the ranks' PATH and
	# PYTHONPATH lines, then the request, handed to the module on its stdin.
	_wmod=$1
	_wverb=$2
	_prog=$3
	_wdir=$4
	IFS= read -r _wpath
	IFS= read -r _wpp
	_wreq=$(cat)
	if [ ! -d "$_wdir" ]; then
		fail "workdir $_wdir does not exist on the node"
		return 1
	fi
	case $_prog in
	/*) _py=$_prog ;;
	*/*) _py=$_wdir/$_prog ;;
	*) _py=$(PATH=${_wpath:-$PATH} && command -v "$_prog" 2>/dev/null) ;;
	esac
	case $_py in /*) ;; *) _py= ;; esac
	if [ -z "$_py" ] || [ -d "$_py" ] || [ ! -x "$_py" ]; then
		fail "command $_prog is not a program on the ranks' PATH on this node"
		return 1
	fi
	# Only a python runs `-m MODULE` as meant (bash would run a file of that name).
	case ${_py##*/} in
	python | python[0-9] | python[0-9][0-9] | python[0-9].[0-9] | python[0-9].[0-9][0-9]) ;;
	*)
		fail "command $_prog is not a python interpreter: $_wverb runs Lazarus with the ranks' python"
		return 1
		;;
	esac
	# What it starts (warm: the zygote) is detached (its own session, stdio closed):
	# this session ends when the answers are written. fd 9 (the launch lock) stays here.
	printf '%s\n' "$_wreq" | (
		cd -- "$_wdir" || exit 1
		PATH=${_wpath:-$PATH}
		export PATH
		if [ -n "$_wpp" ]; then
			PYTHONPATH=$_wpp
			export PYTHONPATH
		else
			unset PYTHONPATH
		fi
		# shellcheck disable=SC2086 # MODULE and its arguments: plain words
		exec "$_py" -m $_wmod
	) 9>&- 2>&1
}

zygote_is_ours() {
	# ZYGOTE_PID_CONTENT -> ZG: the group of a live zygote whose start ticks and
	# group match its pid file (a reused pid is never signalled).
	json_int "$1" pid || return 1
	_zp=$JI
	json_int "$1" pgid || return 1
	ZG=$JI
	json_int "$1" start_ticks || return 1
	_zt=$JI
	is_uint "$_zp" && is_uint "$ZG" && [ "$ZG" -gt 1 ] && [ "$ZG" != "${MY_PGRP-}" ] || return 1
	proc_stat "$_zp" || return 1
	case $ST_STATE in Z | X) return 1 ;; esac
	[ "$ST_TICKS" = "$_zt" ] && [ "$ST_PGRP" = "$ZG" ]
}

shim_stop_zygote() {
	[ $# -eq 2 ] || {
		fail "stop-zygote: usage: stop-zygote RUN_ROOT NODE"
		return 2
	}
	proc_stat self && MY_PGRP=$ST_PGRP
	_zn=0
	for _zd in "$1/.zygote-$2" "$1"/*/".zygote-$2"; do
		[ -d "$_zd" ] || continue
		if read_file "$_zd/zygote.pid" && _zf=$RF && zygote_is_ours "$_zf"; then
			_zn=$((_zn + 1))
			# SIGTERM, 5 s, SIGKILL, 5 s: as zygote_client.stop_zygote.
			for _zsig in TERM KILL; do
				kill -"$_zsig" -"$ZG" 2>/dev/null
				uptime_cs
				_deadline=$((UP + 500))
				while zygote_is_ours "$_zf" && [ "$UP" -lt "$_deadline" ]; do
					nap 0.02
					uptime_cs
				done
				zygote_is_ours "$_zf" || break
			done
		fi
		rm -f -- "$_zd/zygote.sock" "$_zd/zygote.pid"
	done
	printf '{"zygotes_stopped":%s}\n' "$_zn"
}

free_kb() {
	# PATH -> FREE_KB via `df -Pk`: the "Available" column is the one just before
	# the first field ending in "%" (the device name may contain spaces).
	FREE_KB=
	_df=$(LC_ALL=C df -Pk -- "$1" 2>/dev/null) || return 1
	_line=${_df#*
}
	_prev=
	for _f in $_line; do
		case $_f in *%) is_uint "$_prev" && FREE_KB=$_prev && return 0 ;; esac
		_prev=$_f
	done
	return 1
}

shim_preflight() {
	[ $# -ge 5 ] || {
		fail "preflight: usage: preflight INTERPRETER WORKDIR DISK_PATH TIMEOUT_S MAX_OUTPUT [-- CMD...]"
		return 2
	}
	_interp=$1
	_wdir=$2
	_disk=$3
	_tmo=$4
	_max=$5
	shift 5
	[ "${1-}" = "--" ] && shift
	_found=
	case $_interp in
	*/*)
		case $_interp in /*) _cand=$_interp ;; *) _cand="$_wdir/$_interp" ;; esac
		[ -f "$_cand" ] && [ -x "$_cand" ] && _found=$_cand
		;;
	*)
		# Only a program file counts, not a builtin or function of this shell.
		_found=$(command -v "$_interp" 2>/dev/null)
		case $_found in /*) ;; *) _found= ;; esac
		;;
	esac
	_wd_ok=false
	[ -d "$_wdir" ] && _wd_ok=true
	# The checkpoint dir may not exist yet: measure the filesystem it will be on.
	_p=$_disk
	while [ ! -e "$_p" ]; do
		case $_p in */*) _p=${_p%/*} ;; *) _p=. ;; esac
		[ -n "$_p" ] || _p=/
	done
	free_kb "$_p"
	_hexit=null
	_htimed=false
	_hout=
	if [ $# -gt 0 ]; then
		_ho=$(mktemp 2>/dev/null) || _ho="${TMPDIR:-/tmp}/.lazarus-health.$$"
		if command -v timeout >/dev/null 2>&1 && is_uint "$_tmo"; then
			(
				cd "$_wdir" 2>/dev/null
				exec timeout -k 5 "$_tmo" "$@"
			) >"$_ho" 2>&1 </dev/null
			_hexit=$?
			[ "$_hexit" -eq 124 ] && _htimed=true
		else
			(
				cd "$_wdir" 2>/dev/null
				exec "$@"
			) >"$_ho" 2>&1 </dev/null
			_hexit=$?
		fi
		_hout=$(tail -c "$_max" -- "$_ho" 2>/dev/null)
		rm -f -- "$_ho"
	fi
	if [ -n "$_found" ]; then _found=$(json_str "$_found"); else _found=null; fi
	printf '{"interpreter":%s,"workdir_exists":%s,"disk_path":%s,"free_kb":%s,"health_exit":%s,"health_timed_out":%s,"health_output":%s}\n' \
		"$_found" "$_wd_ok" "$(json_str "$_p")" "${FREE_KB:-null}" "$_hexit" "$_htimed" "$(json_str "$_hout")"
}

shim_memory() {
	# ROOT: one line per committed step directory of a run's memory tier, oldest
	# first: {"root":ROOT,"memory_step":NAME,"manifest":{...}|null,"sizes":{RELPATH:BYTES,...}}
	# (the root as given: one call may list several).
	# Facts only; the controller judges them (torn, another job's).
	[ $# -eq 1 ] || {
		fail "memory: usage: memory ROOT"
		return 2
	}
	tier_path "$1" || return 1
	[ -d "$_tp" ] || return 0
	for _md in "$_tp"/step-*; do
		[ -L "$_md" ] && continue
		_mn=${_md##*/}
		case $_mn in step-[0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9]*) ;; *) continue ;; esac
		case $_mn in step-*[!0-9]*) continue ;; esac
		[ -d "$_md" ] && [ -f "$_md/COMMITTED" ] || continue
		read_json_obj "$_md/manifest.json" || RJ=null
		_msz=
		# One file per line (names with spaces or glob characters stay whole).
		_mifs=$IFS
		IFS='
'
		set -f
		for _mf in $(find "$_md" -type f 2>/dev/null); do
			[ -f "$_mf" ] || continue
			_mb=$(wc -c <"$_mf" 2>/dev/null) || continue
			_msz="$_msz${_msz:+,}$(json_str "${_mf#"$_md"/}"):$((_mb))"
		done
		set +f
		IFS=$_mifs
		printf '{"root":%s,"memory_step":%s,"manifest":%s,"sizes":{%s}}\n' \
			"$(json_str "$1")" "$(json_str "$_mn")" "$RJ" "$_msz"
	done
}

# --- dispatch ----------------------------------------------------------------------------

shim_main() {
	_sub=${1-}
	[ $# -gt 0 ] && shift
	case $_sub in
	start) shim_start "$@" ;;
	status) shim_status "$@" ;;
	stop) shim_stop "$@" ;;
	tail) shim_tail "$@" ;;
	read) shim_read "$@" ;;
	preflight) shim_preflight "$@" ;;
	write) shim_write "$@" ;;
	end-run) shim_end_run "$@" ;;
	warm) shim_warm "$@" ;;
	rejoin) shim_rejoin "$@" ;;
	stop-zygote) shim_stop_zygote "$@" ;;
	memory) shim_memory "$@" ;;
	replica-restore) shim_replica_restore "$@" ;;
	hang-evidence) shim_hang_evidence "$@" ;;
	json-escape)
		for _s; do
			json_str "$_s"
			echo
		done
		;;
	*)
		fail "unknown subcommand: $_sub"
		return 2
		;;
	esac
}

[ $# -eq 0 ] || shim_main "$@"
