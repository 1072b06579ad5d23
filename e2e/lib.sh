# e2e/lib.sh — what the e2e scripts share, sourced by each of them (e2e/run, e2e/*/run,
# e2e/native/lab): logging, root and Debian packages, free ports, PIDs checked against
# /proc/PID/cmdline, removal confined to a script's own cache; and for the labs the state
# file, the flexnode builds, the node images, the registry. The caller sets REPO (the labs'
# parts also CACHE and DIR) and may set LOG_PREFIX, the start of its log lines.

log() { printf '%s %s\n' "${LOG_PREFIX:-$'\033[1m[lab]\033[0m'}" "$*" >&2; }
die() { printf '%s: error: %s\n' "${0#"$REPO"/}" "$*" >&2; exit 1; }
now_ms() { echo $(( $(date +%s%N) / 1000000 )); }
usage() { sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; }

as_root() {
  if [[ $EUID -eq 0 ]]; then "$@"
  elif command -v sudo >/dev/null; then sudo "$@"
  else die "need root (or sudo) to run: $*"
  fi
}

# apt_install PKG...: the missing Debian packages installed, without letting their maintainer
# scripts start any service (policy-rc.d => 101, only if none exists already). The package
# lists are updated once per process.
APT_UPDATED=0
apt_install() {
  local missing=() p
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
  done
  ((${#missing[@]})) || return 0
  command -v apt-get >/dev/null || die "missing ${missing[*]} and no apt-get to install them"
  log "installing Debian packages: ${missing[*]}"
  local policy=/usr/sbin/policy-rc.d made_policy=0 rc=0
  if [[ ! -e $policy ]]; then
    as_root sh -c "printf '#!/bin/sh\nexit 101\n' > $policy && chmod 755 $policy"
    made_policy=1
  fi
  if ((APT_UPDATED == 0)); then as_root apt-get update -qq >&2 || rc=$?; APT_UPDATED=1; fi
  if ((rc == 0)); then
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2 || rc=$?
  fi
  if ((made_policy)); then as_root rm -f "$policy"; fi
  ((rc == 0)) || die "apt-get install ${missing[*]} failed"
}

# free_port: a free TCP port on 127.0.0.1 (bound to port 0, then released)
free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
}

# safe_rm MARKER PATH...: rm -rf of each PATH, only inside the folder that holds MARKER (a
# script's own cache, marked when the script made it) and never through "..".
safe_rm() {
  local marker=$1 root p; shift
  root=$(dirname -- "$marker")
  [[ -f $marker ]] || die "$root carries no $(basename -- "$marker"): refusing to remove anything in it"
  for p in "$@"; do
    [[ $p == "$root"/* ]] || die "refusing to remove $p: not inside $root"
    [[ "/$p/" != */../* ]] || die "refusing to remove $p: contains .."
    rm -rf -- "$p"
  done
}

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

# cp_versions CP_DIR: K8S_VERSION, the control plane's Kubernetes version, and PREV_VERSION,
# the previous minor both labs join at (their first repave is the version change), as the
# control plane's state has them from its pinned modules (e2e/controlplane/run).
cp_versions() {
  K8S_VERSION=$(awk -F= '$1 == "K8S_VERSION" { print $2 }' "$1/state")
  PREV_VERSION=$(awk -F= '$1 == "PREV_VERSION" { print $2 }' "$1/state")
  [[ -n $K8S_VERSION && -n $PREV_VERSION ]] || die "no Kubernetes versions in $1/state"
}

# pid_ours PID PATTERN: alive, not a zombie, and its cmdline contains PATTERN (our DIR)
pid_ours() {
  local pid=$1 pat=$2
  [[ $pid =~ ^[0-9]+$ && -r /proc/$pid/cmdline ]] || return 1
  [[ "$(awk '{ print $3 }' /proc/"$pid"/stat 2>/dev/null)" != Z ]] || return 1
  tr '\0' ' ' 2>/dev/null < /proc/"$pid"/cmdline | grep -qF -- "$pat"
}

# pidfile_ours FILE PATTERN: the PID in FILE is ours (pid_ours)
pidfile_ours() { [[ -f $1 ]] && pid_ours "$(cat -- "$1")" "$2"; }

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

# remove_under ROOT PATH: rm -rf of PATH, only inside ROOT, never through "..", and never of a
# tree with a mount under it (a node's bind mounts, were it still up).
remove_under() {
  local root=$1 p=$2
  [[ -e $p || -L $p ]] || return 0
  [[ $p == "$root"/* && "/$p/" != */../* ]] || die "refusing to remove $p (not inside $root)"
  if findmnt -rn -o TARGET | grep -q "^$p\(/\|$\)"; then die "$p has mounts under it; refusing to remove it"; fi
  rm -rf --one-file-system -- "$p"
}

# debian_mirror: the Debian archive this machine's apt uses (MIRROR overrides), for debootstrap.
debian_mirror() {
  local m=${MIRROR:-$(awk '/^URIs:/ { print $2; exit }' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)}
  echo "${m:-http://deb.debian.org/debian}"
}

# ------------------------------------------------------------------------- the flexnode binary

# native_lock: waits until no other native lab runs (the labs' address on the bridge,
# 10.0.2.100, and the node names are one per machine), then holds the lock on fd 9 until
# the calling script exits.
native_lock() {
  mkdir -p "$FLEXNODE_CACHE/native"
  exec 9> "$FLEXNODE_CACHE/native/lab.lock"
  if ! flock -n 9; then
    log "another native lab is running: waiting for it"
    flock 9
  fi
}

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

# recorder_bin: the tests' watch recorder (examples/watch-recorder.rs), which the Python suites
# read every operation's history from; `cargo test` builds it, and passes it as RECORDER_BIN.
recorder_bin() {
  if [[ -n ${RECORDER_BIN:-} ]]; then
    [[ -x $RECORDER_BIN ]] || die "RECORDER_BIN=$RECORDER_BIN is not an executable"
    echo "$RECORDER_BIN"; return
  fi
  local target="${CARGO_TARGET_DIR:-$CACHE/target}"
  log "cargo build --example watch-recorder (target dir $target)"
  (cd "$REPO" && CARGO_TARGET_DIR="$target" cargo build --locked --example watch-recorder >&2) \
    || die "cargo build of the watch recorder failed"
  echo "$target/debug/examples/watch-recorder"
}

# guest_bin: the agent the guest runs: the release binary of the agent's image (image/build
# binary; tests/effects/agent_image.rs has built it when the suites run in `cargo test`), from the
# same sources as flexnode_bin, so it reports the same version. Optimized, because the agent's
# own generic data paths (tar, gzip and hashing instantiated in this crate: a node image
# unpacked into a machine's tree) took minutes in a TCG guest unoptimized.
guest_bin() {
  "$REPO/image/build" binary --arch amd64 2>&2 | tail -1 || die "image/build binary failed"
}

# next_bin VERSION: the same sources built to report VERSION (FLEXNODE_VERSION, src/lib.rs),
# in a target dir of its own beside the tests' (so neither build invalidates the other): the build an upgrade
# goes to, which `version` tells apart from the installed one. A debug build: the suites run
# no node image's unpack under it, and an optimized build costs minutes per change.
next_bin() {
  local target="${CARGO_TARGET_DIR:-$CACHE/target}-lab-next"
  log "cargo build --bin flexnode as version $1 (target dir $target)"
  (cd "$REPO" && CARGO_TARGET_DIR="$target" FLEXNODE_VERSION="$1" cargo build --locked --bin flexnode >&2) \
    || die "cargo build of the next build failed"
  echo "$target/debug/flexnode"
}

# node_images REGISTRY CA CREDENTIALS [PREVIOUS]: the node's images built offline
# (e2e/node-image/build) and pushed to the lab's registry at REGISTRY (host loopback, TLS with
# CA, auth with CREDENTIALS): the machines' rootfs (flexnode/node:K8S_VERSION), the pod sandbox
# (flexnode/pause) and the workload (flexnode/busybox); their digests in DIR/state as
# NODE_IMAGE, PAUSE_IMAGE, BUSYBOX_IMAGE. With PREVIOUS (a Kubernetes version) also the rootfs
# with that version's kubelet, flexnode/node:PREVIOUS, as PREV_NODE_IMAGE. More images as
# WHAT:REPO:TAG (e2e/node-image/build's WHAT; kube-proxy as KUBE_PROXY_IMAGE). Needs the
# control plane built (the kubelets).
node_images() {
  local registry=$1 ca=$2 creds=$3 prev=${4:-} what repo tag key layout digest pushed args
  local images=(node:node:"$K8S_VERSION" pause:pause:3.10 busybox:busybox:lab "${@:5}")
  [[ -z $prev ]] || images+=(node:node:"$prev")
  for what in "${images[@]}"; do
    IFS=: read -r what repo tag <<< "$what"
    key="${what^^}" layout="$CACHE/node-image/$what-layout" args=()
    key="${key//-/_}_IMAGE"
    if [[ $what == node && $tag != "$K8S_VERSION" ]]; then
      key=PREV_NODE_IMAGE layout="$CACHE/node-image/node-$tag-layout" args=(--kubernetes "$tag")
    fi
    digest=$("$REPO/e2e/node-image/build" build "$what" "${args[@]}" 2>> "$DIR/logs/node-image.log") \
      || die "e2e/node-image/build build $what ${args[*]} failed (see $DIR/logs/node-image.log)"
    pushed=$("$REPO/image/build" push "$layout" "$registry/flexnode/$repo:$tag" \
      --ca "$ca" --credentials "$creds" 2>> "$DIR/logs/node-image.log") \
      || die "pushing the $what:$tag image failed (see $DIR/logs/node-image.log)"
    [[ $pushed == "$digest" ]] || die "pushed $what:$tag as $pushed, built $digest"
    state_set "$key" "$digest"
    log "node image $what:$tag: $digest"
  done
}

# approver_up: `flexnode approver` (the lab's FLEXNODE_BIN) beside the control plane, with its
# service account's token (manifests/approver/rbac.yaml): nodes join with bootstrap tokens
# alone. Stopped by `stop_pidfile "$DIR/pids/approver.pid" "$DIR/approver.kubeconfig"`.
approver_up() {
  local kc=("$(state_get KUBECTL)" --kubeconfig "$(state_get KUBECONFIG)") token
  "${kc[@]}" apply -f "$REPO/manifests/approver/rbac.yaml" >&2
  token=$("${kc[@]}" create token flexnode-approver -n flexnode-system --duration 24h) \
    || die "no token for the approver's service account"
  # Written from a variable, never on a command line.
  (umask 077; cat > "$DIR/approver.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: lab
  cluster:
    server: https://127.0.0.1:$(state_get API_PORT)
    certificate-authority: $DIR/cp/pki/ca.crt
users:
- name: approver
  user:
    token: $token
contexts:
- name: lab
  context: {cluster: lab, user: approver}
current-context: lab
EOF
)
  setsid "$(state_get FLEXNODE_BIN)" approver --kubeconfig "$DIR/approver.kubeconfig" \
    > "$DIR/logs/approver.log" 2>&1 < /dev/null &
  echo $! > "$DIR/pids/approver.pid"
  log "flexnode approver running (pid $!, log $DIR/logs/approver.log)"
}

# bootstrap_token CP_DIR FILE [GROUPS]: a bootstrap token (a day) from the control plane, in
# FILE (0600) as the join config's bootstrapTokenFile wants it. Without GROUPS the lab's
# kubelet token, its id in DIR/state; with them (auth-extra-groups) a node's own.
bootstrap_token() {
  local kc token groups=()
  [[ -z ${3:-} ]] || groups=(--groups "$3")
  kc=$("$CP" bootstrap-token --ttl 86400 "${groups[@]+"${groups[@]}"}" --dir "$1") || die "no bootstrap token"
  token=$(awk '$1 == "token:" { print $2 }' "$kc")
  [[ $token =~ ^[a-z0-9]{6}\.[a-z0-9]{16}$ ]] || die "no token in $kc"
  (umask 077; echo "$token" > "$2")
  [[ -n ${3:-} ]] || state_set BOOTSTRAP_TOKEN_ID "${token%%.*}"
}

# kubelet_route GUEST NODE: the apiserver reaches the kubelet in GUEST (port 10250) as NODE,
# through a loopback port QEMU forwards (kubectl logs and exec).
kubelet_route() {
  local port; port=$("$QEMU" hostfwd "$1" 10250) || die "no forward to the guest's kubelet port"
  "$CP" route "$2:10250" "$port" --dir "$(state_get CP_DIR)" || die "no egress route to $2:10250"
  state_set KUBELET_PORT "$port"
}

# ------------------------------------------------------------------- the lab's registry
REG_USER=flexnode-lab
GUEST_REG=10.0.2.100:5000   # the registry as the guest sees it (IP SAN of the lab's cert)

# creds FILE REGISTRY PASSWORD: a Docker config.json-shaped credentials file, 0600.
creds() {
  (umask 077; python3 -c 'import base64, json, sys
print(json.dumps({"auths": {sys.argv[1]: {"auth": base64.b64encode((sys.argv[2] + ":" + sys.stdin.read().strip()).encode()).decode()}}}))' \
    "$2" "$REG_USER" < "$3" > "$1")
}

# registry_start: docker-registry on DIR/registry.yml (its port is REG_PORT), until it answers.
registry_start() {
  local port; port=$(state_get REG_PORT)
  setsid docker-registry serve "$DIR/registry.yml" >> "$DIR/logs/registry.log" 2>&1 < /dev/null &
  echo $! > "$DIR/pids/registry.pid"
  for _ in $(seq 100); do
    python3 -c 'import socket, sys; socket.create_connection(("127.0.0.1", int(sys.argv[1])), 1)' "$port" 2>/dev/null && return 0
    sleep 0.1
  done
  tail -5 "$DIR/logs/registry.log" >&2; die "the registry did not start on 127.0.0.1:$port"
}

# registry_up: the lab PKI in DIR/pki (the server certificate also for IP 10.0.2.100) and
# docker-registry over TLS with htpasswd on a loopback port (REG_PORT, storage DIR/registry),
# with credentials for the host (DIR/host-credentials.json) and the guest
# (DIR/guest-credentials.json, for GUEST_REG).
registry_up() {
  mkdir -p "$DIR/registry"
  PKI_EXTRA_SAN=IP:10.0.2.100 "$REPO/e2e/pki" make "$DIR/pki" > /dev/null
  (umask 077; head -c 18 /dev/urandom | base64 | tr -d '/+=' > "$DIR/registry.password")
  python3 -W ignore -c 'import crypt, sys
print("%s:%s" % (sys.argv[1], crypt.crypt(sys.stdin.read().strip(), crypt.mksalt(crypt.METHOD_BLOWFISH, rounds=16))))' \
    "$REG_USER" < "$DIR/registry.password" > "$DIR/htpasswd"
  local port; port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  cat > "$DIR/registry.yml" <<EOF
version: 0.1
log: {level: info}
storage:
  filesystem: {rootdirectory: $DIR/registry}
  delete: {enabled: true}
auth:
  htpasswd: {realm: flexnode-lab, path: $DIR/htpasswd}
http:
  addr: "127.0.0.1:$port"
  tls: {certificate: $DIR/pki/server.pem, key: $DIR/pki/server.key}
EOF
  state_set REG_PORT "$port"
  state_set GUEST_REG "$GUEST_REG"
  registry_start
  creds "$DIR/host-credentials.json" "127.0.0.1:$port" "$DIR/registry.password"
  creds "$DIR/guest-credentials.json" "$GUEST_REG" "$DIR/registry.password"
}
