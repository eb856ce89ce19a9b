# Process helpers shared by scripts/controlplane.sh and scripts/node.sh.
# Sourced, not run: the caller defines log() and die() (with its own prefix)
# and BIN (where the binaries are) first.

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

# Is PID alive and running the binary NAME? (protects against pid reuse)
is_ours() { # PID NAME
  local pid="$1" name="$2" exe state
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || return 1
  # An exited-but-unreaped process (zombie) counts as gone.
  state="$(sed 's/.*) //' "/proc/$pid/stat" 2>/dev/null | cut -d' ' -f1)"
  [ -n "$state" ] && [ "$state" != Z ] && [ "$state" != X ] || return 1
  exe="$(tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null || true)"
  case "$exe" in *"$name"*) return 0 ;; *) return 1 ;; esac
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

# Start $BIN/NAME in the background, detached from our stdio, in its own session.
spawn() { # DIR NAME ARGS...
  local dir="$1" name="$2"; shift 2
  setsid "$BIN/$name" "$@" </dev/null >>"$dir/$name.log" 2>&1 &
  echo $! > "$dir/$name.pid"
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

# `$SELF __watch DIR PID` in the background: stops what DIR runs once PID
# exits. Its own session, so a Ctrl-C or a killed process group does not take
# the watchdog down with what it watches. VAR names PID in the error.
start_watchdog_of() { # DIR PID VAR
  local dir="$1" watch="$2"
  kill -0 "$watch" 2>/dev/null || die "$3=$watch is not a running process"
  setsid bash "$SELF" __watch "$dir" "$watch" </dev/null >>"$dir/watchdog.log" 2>&1 &
  echo $! > "$dir/watchdog.pid"
}
