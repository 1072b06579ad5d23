# e2e/lib.sh — what the lab scripts (e2e/run, e2e/container/run) share: logging, the
# state file, PIDs checked against /proc/PID/cmdline, and the flexnode builds. Sourced; the
# caller sets REPO, CACHE and DIR.

log() { printf '\033[1m[lab]\033[0m %s\n' "$*" >&2; }
die() { printf '%s: error: %s\n' "${0#"$REPO"/}" "$*" >&2; exit 1; }
now_ms() { echo $(( $(date +%s%N) / 1000000 )); }

parse_dir() { # sets DIR, REST
  REST=()
  while (($#)); do
    case "$1" in
      --dir) [[ $# -ge 2 ]] || die "--dir needs a value"; DIR=$2; shift 2 ;;
      --dir=*) DIR=${1#--dir=}; shift ;;
      *) REST+=("$1"); shift ;;
    esac
  done
  [[ $DIR == /* ]] || DIR="$PWD/$DIR"
  DIR=${DIR%/}
  [[ -n $DIR && $DIR != / ]] || die "refusing to use / as the lab directory"
}

state_get() { [[ -f $DIR/state ]] && awk -F= -v k="$1" '$1 == k { sub(/^[^=]*=/, ""); print; exit }' "$DIR/state" || true; }
state_set() { # state_set KEY VALUE (replaces)
  local tmp="$DIR/state.tmp"
  { [[ -f $DIR/state ]] && grep -v "^$1=" "$DIR/state" || true; echo "$1=$2"; } > "$tmp"
  mv "$tmp" "$DIR/state"
}

# pid_ours PID PATTERN: alive, not a zombie, and its cmdline contains PATTERN (our DIR)
pid_ours() {
  local pid=$1 pat=$2
  [[ $pid =~ ^[0-9]+$ && -r /proc/$pid/cmdline ]] || return 1
  [[ "$(awk '{ print $3 }' /proc/"$pid"/stat 2>/dev/null)" != Z ]] || return 1
  tr '\0' ' ' 2>/dev/null < /proc/"$pid"/cmdline | grep -qF -- "$pat"
}

stop_pidfile() { # stop_pidfile FILE PATTERN: SIGTERM (then SIGKILL) the PID in FILE if it is ours
  local f=$1 pat=$2 pid
  [[ -f $f ]] || return 0
  pid=$(cat "$f")
  if pid_ours "$pid" "$pat"; then
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 50); do pid_ours "$pid" "$pat" || break; sleep 0.1; done
    pid_ours "$pid" "$pat" && { kill -KILL "$pid" 2>/dev/null || true; }
    log "stopped $(basename "$f" .pid) (pid $pid)"
  fi
  rm -f "$f"
}

# ------------------------------------------------------------------------- the flexnode binary

flexnode_bin() { # prints the path of the (host) flexnode binary, building it if needed
  if [[ -n ${FLEXNODE_BIN:-} ]]; then
    [[ -x $FLEXNODE_BIN ]] || die "FLEXNODE_BIN=$FLEXNODE_BIN is not an executable"
    echo "$FLEXNODE_BIN"; return
  fi
  local target="${CARGO_TARGET_DIR:-$CACHE/target}"
  log "cargo build --bin flexnode (target dir $target)"
  (cd "$REPO" && CARGO_TARGET_DIR="$target" cargo build --locked --bin flexnode >&2) || die "cargo build failed"
  echo "$target/debug/flexnode"
}

# next_bin VERSION: the same sources built to report VERSION (FLEXNODE_VERSION, src/lib.rs),
# in a target dir of its own (so neither build invalidates the other): the build an upgrade
# goes to, which `version` tells apart from the installed one.
next_bin() {
  local target="$CACHE/target-lab-next"
  log "cargo build --bin flexnode as version $1 (target dir $target)"
  (cd "$REPO" && CARGO_TARGET_DIR="$target" FLEXNODE_VERSION="$1" cargo build --locked --bin flexnode >&2) \
    || die "cargo build of the next build failed"
  echo "$target/debug/flexnode"
}
