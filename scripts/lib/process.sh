# Process helpers shared by scripts/controlplane.sh and scripts/node.sh.
# Sourced, not run: the caller defines log() and die() (with its own prefix)
# and BIN (where the binaries are: the tools directory, scripts/lib/tools.sh)
# first.

# The last 40 lines of each of DIR's logs for NAMEs (NAME.log), for a failure.
tail_logs_of() { # DIR NAME...
  local dir="$1" f name; shift
  for name in "$@"; do
    f="$dir/$name.log"
    [ -e "$f" ] || continue
    [ -s "$f" ] || { echo "----- $f is empty -----" >&2; continue; }
    echo "----- last 40 lines of $f -----" >&2
    tail -n 40 "$f" >&2
  done
}

# A port nobody listens on right now. Races are handled by retrying the start.
free_port() {
  if command -v python3 >/dev/null 2>&1; then
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()' && return 0
  fi
  local p
  for _ in $(seq 1 100); do
    p=$((20000 + RANDOM % 40000))
    if ! ss -Hltn "sport = :$p" 2>/dev/null | grep -q .; then echo "$p"; return 0; fi
  done
  return 1
}

# PID's command line, arguments separated by spaces ("" while it execs).
proc_cmdline() { # PID
  tr '\0' ' ' < "/proc/$1/cmdline" 2>/dev/null || true
}

# Is PID alive and running the binary NAME? (protects against pid reuse)
# A live process whose command line reads empty is in the middle of an
# execve (the kernel has switched to the new image but not yet laid out its
# arguments; measured: one spawn of kube-apiserver in four shows it): that is
# ours starting, not a process that exited.
is_ours() { # PID NAME
  local pid="$1" name="$2" cmdline state
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || return 1
  # An exited-but-unreaped process (zombie) counts as gone.
  state="$(sed 's/.*) //' "/proc/$pid/stat" 2>/dev/null | cut -d' ' -f1)"
  [ -n "$state" ] && [ "$state" != Z ] && [ "$state" != X ] || return 1
  cmdline="$(proc_cmdline "$pid")"
  case "$cmdline" in "" | *"$name"*) return 0 ;; *) return 1 ;; esac
}

# SIGTERM, then SIGKILL after SECS (default 10), if PID is still NAME.
stop_pid() { # PID NAME [SECS]
  local pid="$1" name="$2" secs="${3:-10}"
  if [ "$pid" != "$$" ] && is_ours "$pid" "$name"; then
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 1 $((secs * 10))); do is_ours "$pid" "$name" || break; sleep 0.1; done
    if is_ours "$pid" "$name"; then
      log "$name (pid $pid) ignored SIGTERM for ${secs}s; sending SIGKILL"
      kill -KILL "$pid" 2>/dev/null || true
      for _ in $(seq 1 50); do is_ours "$pid" "$name" || break; sleep 0.1; done
    fi
  fi
}

kill_component() { # DIR NAME
  local pidf="$1/$2.pid"
  [ -f "$pidf" ] || return 0
  stop_pid "$(cat "$pidf")" "$2"
  rm -f "$pidf"
}

# Start $BIN/NAME in the background, detached from our stdio, in its own
# session, its stdout and stderr both in DIR/NAME.log. Returns once the
# process runs the binary (or has died), so nothing that checks it afterwards
# can mistake the shell it was forked from for a dead component. Job control
# is switched off while it forks: with it on (an interactive shell, `set -m`)
# the child leads its own process group, and setsid(1) would then fork once
# more and exit, leaving a pid that is not the component's.
spawn() { # DIR NAME ARGS...
  local dir="$1" name="$2" monitor=0 pid
  shift 2
  case $- in *m*) monitor=1; set +m ;; esac
  setsid "$BIN/$name" "$@" </dev/null >>"$dir/$name.log" 2>&1 &
  pid=$!
  [ "$monitor" = 0 ] || set -m
  echo "$pid" > "$dir/$name.pid"
  # Forked but not yet exec'd, the child's command line is this shell's;
  # then setsid's (naming the binary as an argument); then, between the two
  # execs, empty. Started is when the binary itself is argv[0].
  for _ in $(seq 1 200); do
    case "$(proc_cmdline "$pid")" in "$BIN/$name "*) return 0 ;; esac
    kill -0 "$pid" 2>/dev/null || return 0
    sleep 0.05
  done
  log "$name (pid $pid) has not started $BIN/$name after 10s"
}

# Until CMD succeeds: 0; 1 after SECS; 2 as soon as NAME's process died.
wait_until() { # DIR NAME SECS CMD...
  local dir="$1" name="$2" secs="$3"; shift 3
  local pid deadline=$((SECONDS + secs))
  pid="$(cat "$dir/$name.pid")"
  while :; do
    if "$@" >/dev/null 2>&1; then return 0; fi
    if ! is_ours "$pid" "$name"; then return 2; fi
    if [ "$SECONDS" -ge "$deadline" ]; then return 1; fi
    sleep 0.25
  done
}

# Why NAME, started by spawn in this shell, is not running: its exit status or
# signal (it is our child, so `wait` has it), the last lines of its log (its
# stdout and stderr), and what else ran and how much memory was left, so a
# component killed before it wrote a line (the OOM killer, a signal from
# outside) still explains itself. On stderr.
explain_exit() { # DIR NAME
  local dir="$1" name="$2" pid rc=0 how
  pid="$(cat "$dir/$name.pid" 2>/dev/null || true)"
  if [ -z "$pid" ]; then
    how="has no pid file"
  elif is_ours "$pid" "$name"; then
    how="(pid $pid) is still running"
  else
    wait "$pid" 2>/dev/null || rc=$?
    if [ "$rc" = 127 ] && ! kill -0 "$pid" 2>/dev/null && ! [ -e "/proc/$pid" ]; then
      how="(pid $pid) exited; its status is unknown (not a child of this shell)"
    elif [ "$rc" -gt 128 ]; then
      how="(pid $pid) was killed by signal $((rc - 128)) ($(kill -l $((rc - 128)) 2>/dev/null || echo '?'))"
    else
      how="(pid $pid) exited with status $rc"
    fi
  fi
  echo "----- $name $how -----" >&2
  tail_logs_of "$dir" "$name"
  echo "----- memory (MiB) -----" >&2
  free -m >&2 2>/dev/null || true
  echo "----- the largest processes running -----" >&2
  ps -eo pid,ppid,rss,etime,args --sort=-rss 2>/dev/null | head -n 12 | cut -c1-200 >&2 || true
  local oom
  oom="$(dmesg 2>/dev/null | grep -iE 'out of memory|oom-kill|killed process' | tail -n 5 || true)"
  [ -z "$oom" ] || { echo "----- the kernel's OOM killer -----" >&2; echo "$oom" >&2; }
}

# `$SELF __watch DIR PID` in the background: stops what DIR runs once PID
# exits. Its own session, so a Ctrl-C or a killed process group does not take
# the watchdog down with what it watches. VAR names PID in the error.
start_watchdog_of() { # DIR PID VAR
  local dir="$1" watch="$2"
  kill -0 "$watch" 2>/dev/null || die "$3=$watch is not a running process"
  setsid bash "$SELF" __watch "$dir" "$watch" </dev/null >>"$dir/watchdog.log" 2>&1 &
  echo $! > "$dir/watchdog.pid"
}
