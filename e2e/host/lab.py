"""e2e/host/lab.py — what the host-install suite (suite.py) stands on: the lab `e2e/run` brought
up (its guest over ssh, its control plane over kubectl and HTTPS), the operation watch, and the
small helpers every check uses. Python 3 stdlib only.
"""

import argparse
import calendar
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def agent_words():
    """The agent's own words, read from its source instead of copied here: the terminal
    messages (`MSG_*` in src/lifecycle/step/mod.rs) and the reasons of the `Completed`
    condition (`ResultReason::as_str` in src/lifecycle/result.rs)."""
    with open(os.path.join(REPO, "src/lifecycle/step/mod.rs")) as f:
        messages = dict(re.findall(r'pub const (MSG_\w+): &str = "([^"]*)";', f.read()))
    with open(os.path.join(REPO, "src/lifecycle/result.rs")) as f:
        text = f.read()
    start = text.index("impl ResultReason {")
    as_str = text[text.index("fn as_str", start):text.index("fn parse", start)]
    reasons = tuple(re.findall(r'Self::\w+ => "(\w+)"', as_str))
    if not reasons or not {"MSG_UPGRADE_DONE", "MSG_REBOOT_DONE", "MSG_RESET_DONE"} <= messages.keys():
        raise SystemExit("e2e/host/lab.py: the agent's reasons or messages were not found in its source")
    return messages, reasons


_MESSAGES, TERMINAL_REASONS = agent_words()
MSG_UPGRADE_DONE = _MESSAGES["MSG_UPGRADE_DONE"]
MSG_REBOOT_DONE = _MESSAGES["MSG_REBOOT_DONE"]
MSG_RESET_DONE = _MESSAGES["MSG_RESET_DONE"]
TERMINAL = ("Complete", "Failed")
SLOT_RE = re.compile(r"^/opt/flexnode/lib/flexnode-(blue|green)$")


def slot_path(link):
    """The absolute slot directory a link under /opt/flexnode names ('' for none)."""
    if not link:
        return ""
    return os.path.normpath(os.path.join("/opt/flexnode", link))


# Where a named check runs (the table in e2e/README.md says why for each): QEMU where it needs a
# machine of its own (a power cut, the guest's reboot, its kernel's modules, a first boot by
# Ignition), NATIVE where a booted container on the lab bridge shows all it asserts, BOTH where
# a QEMU run needs it too (the join its other checks stand on, the results at the end).
QEMU, NATIVE, BOTH = "qemu", "native", "both"


class Fail(Exception):
    pass


def need(cond, msg):
    if not cond:
        raise Fail(msg)


def detail(msg):
    print("    " + msg, flush=True)


def wait_until(desc, fn, timeout, interval=2.0):
    """Calls fn until it returns a truthy value; Fail after timeout (with the last value)."""
    deadline = time.time() + timeout
    last = None
    while True:
        try:
            v = fn()
        except Fail as e:
            last = str(e)
        except subprocess.TimeoutExpired as e:
            last = "timeout: %s" % e
        else:
            if v:
                return v
            last = repr(v)
        if time.time() > deadline:
            raise Fail("timed out after %ds waiting for %s (last: %s)" % (timeout, desc, last))
        time.sleep(interval)


def parse_time(s):
    """RFC 3339 (as the API writes metav1.Time) -> unix seconds."""
    if not s:
        return None
    s = s.rstrip("Z").split(".")[0].split("+")[0]
    return calendar.timegm(time.strptime(s, "%Y-%m-%dT%H:%M:%S"))


# ------------------------------------------------------------------------------------ the lab

def read_state(d):
    """A lab's `DIR/state` (KEY=VALUE lines, e2e/lib.sh's state_set) as a dict."""
    st = {}
    with open(os.path.join(d, "state")) as fh:
        for line in fh:
            k, _, v = line.rstrip("\n").partition("=")
            st[k] = v
    return st


class Lab:
    def __init__(self, d):
        self.dir = d
        self.st = st = read_state(d)
        self.node = st["NODE"]
        self.guest = st["GUEST"]
        self.kubectl_bin = st["KUBECTL"]
        self.kubeconfig = st["KUBECONFIG"]
        self.flexnode = st["FLEXNODE_BIN"]
        self.recorder = st["RECORDER_BIN"]
        # The host lab's artifact server and archives (the container lab has images instead).
        self.art = st.get("GUEST_ART", "")
        self.sha_good = st.get("SHA_GOOD", "")      # the next build (VERSION_NEXT)
        self.sha_base = st.get("SHA_BASE", "")      # the installed build (VERSION_BASE)
        self.sha_broken = st.get("SHA_BROKEN", "")
        self.ver_base = st["VERSION_BASE"]
        self.ver_next = st["VERSION_NEXT"]
        self.repo = st["REPO"]
        self.cp_dir = st["CP_DIR"]
        self.qemu_run = os.path.join(self.repo, "e2e/qemu/run")
        self.native_run = os.path.join(self.repo, "e2e/native/run")
        self.art_log = os.path.join(d, "logs/artifacts.log")
        self.ctl = os.path.join(d, "ssh-master")
        self.master = None
        # A native node (e2e/native/lab) is reached through its namespaces; a QEMU guest by ssh.
        self.native_node = st.get("NATIVE_NODE", "")
        if not self.native_node:
            self.key = st["KEY"]
            self.set_port(st["SSH_PORT"])

    def set_port(self, port):
        self.ssh_opts = [
            "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no",
            "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR",
            "-o", "ConnectTimeout=10", "-o", "ServerAliveInterval=2", "-o", "ServerAliveCountMax=4",
            "-o", "ControlPath=" + self.ctl, "-i", self.key, "-p", str(port)]

    def refresh_port(self):
        """After a cold boot the guest's ssh port may have moved (e2e/qemu/run retries a taken one)."""
        self.need_qemu("a cold boot")
        self.drop_ssh()
        self.set_port(self.qemu("port", self.guest))

    def need_qemu(self, what):
        if self.native_node:
            raise Fail("%s needs a QEMU guest, not the native node %s: run it in the QEMU tier"
                       % (what, self.native_node))

    # -- guest access
    def _master_up(self):
        if self.master is not None and self.master.poll() is None:
            return
        self.master = subprocess.Popen(
            ["ssh", *self.ssh_opts, "-o", "ControlMaster=yes", "-o", "ControlPersist=no", "-N",
             "root@127.0.0.1"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL)
        for _ in range(60):
            if os.path.exists(self.ctl):
                return
            if self.master.poll() is not None:
                return  # guest not reachable now; clients connect directly (and fail or not)
            time.sleep(0.25)

    def drop_ssh(self):
        """Ends our ssh control master (before a power cut or reboot: it would hang on a dead peer)."""
        if self.master is not None and self.master.poll() is None:
            self.master.terminate()
            try:
                self.master.wait(5)
            except subprocess.TimeoutExpired:
                self.master.kill()
                self.master.wait()
        self.master = None
        try:
            os.unlink(self.ctl)
        except OSError:
            pass

    def ssh(self, script, timeout=120, inp=None):
        """(rc, stdout, stderr) of a root shell script in the guest, run under `set -e`. On a
        native node: in its namespaces, with a login's clean environment as ssh gives one."""
        if self.native_node:
            p = subprocess.run([self.native_run, "exec", self.native_node, "env", "-i", "HOME=/root",
                                "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                                "bash", "-c", "set -e\n" + script],
                               input=inp, capture_output=True, text=True, timeout=timeout)
            return p.returncode, p.stdout, p.stderr
        self._master_up()
        p = subprocess.run(["ssh", *self.ssh_opts, "-o", "ControlMaster=no", "root@127.0.0.1",
                            "set -e\n" + script],
                           input=inp, capture_output=True, text=True, timeout=timeout)
        return p.returncode, p.stdout, p.stderr

    def sh(self, script, timeout=120, inp=None):
        rc, out, err = self.ssh(script, timeout, inp)
        if rc != 0:
            raise Fail("guest command failed (rc %d): %s: %s" % (rc, script[:120], (err or out).strip()[-400:]))
        return out

    def reboot(self, boot_id):
        """`systemctl reboot` in the guest; returns (the time it began) once a boot_id other
        than `boot_id` answers over ssh."""
        self.need_qemu("a reboot of the guest")
        self.drop_ssh()
        try:
            self.ssh("systemctl reboot", 30)
        except subprocess.TimeoutExpired:
            pass  # the connection may die with the guest's sshd
        self.drop_ssh()
        t = time.time()

        def new_boot():
            try:
                rc, out, _ = self.ssh("cat /proc/sys/kernel/random/boot_id", 20)
            except subprocess.TimeoutExpired:
                return None
            return out.strip() if rc == 0 and out.strip() and out.strip() != boot_id else None
        wait_until("a new boot_id", new_boot, 600, 3)
        detail("guest back after %.0f s" % (time.time() - t))
        return t

    def push(self, src, dst):
        """Copies the host's file SRC to DST in the guest, with its mode."""
        if not self.native_node:
            self.qemu("push", self.guest, src, dst)
            return
        with open(src, "rb") as fh:
            p = subprocess.run([self.native_run, "exec", self.native_node, "sh", "-c",
                                'cat > "$1" && chmod %o "$1"' % (os.stat(src).st_mode & 0o7777), "sh", dst],
                               stdin=fh, capture_output=True, timeout=600)
        need(p.returncode == 0, "copying %s to %s on %s: %s" % (src, dst, self.native_node, p.stderr.decode(errors="replace")[-300:]))

    def qemu(self, *args, timeout=600):
        self.need_qemu("e2e/qemu/run %s" % args[0])
        p = subprocess.run([self.qemu_run, *args], capture_output=True, text=True, timeout=timeout)
        if p.returncode != 0:
            raise Fail("e2e/qemu/run %s failed: %s" % (" ".join(args), (p.stderr or p.stdout).strip()[-600:]))
        return p.stdout.strip()

    # -- guest facts
    def facts(self):
        """One ssh round trip: links, the agent unit, kube1, boot_id."""
        out = self.sh(r"""
for l in current last-good bin/flexnode; do echo "link.$l=$(readlink /opt/flexnode/$l 2>/dev/null)"; done
echo "exists.bin=$(test -e /opt/flexnode/bin/flexnode && echo yes || echo no)"
systemctl show flexnode-agent -p ActiveState,SubState,MainPID,NRestarts,Result,ExecMainStartTimestamp,LoadState | sed 's/^/agent./'
systemctl show systemd-nspawn@kube1 -p ActiveState,MainPID,ActiveEnterTimestampMonotonic | sed 's/^/kube1./'
echo "machine.kube1=$(machinectl show kube1 -p Timestamp --value 2>/dev/null)"
echo "boot_id=$(cat /proc/sys/kernel/random/boot_id)"
pid=$(systemctl show -P MainPID flexnode-agent)
if [ "$pid" != 0 ]; then echo "agent.exe=$(readlink /proc/$pid/exe 2>/dev/null || true)"; fi
""")
        f = {}
        for line in out.splitlines():
            k, _, v = line.partition("=")
            f[k] = v
        return f

    def current(self):
        return self.facts().get("link.current", "")

    def agent_active(self, pid_not=None):
        f = self.facts()
        ok = f.get("agent.ActiveState") == "active" and f.get("agent.MainPID", "0") != "0"
        if ok and pid_not is not None and f.get("agent.MainPID") == pid_not:
            return None
        return f if ok else None

    def wait_agent(self, timeout=300, pid_not=None):
        return wait_until("flexnode-agent active" + (" with a new MainPID" if pid_not else ""),
                          lambda: self.agent_active(pid_not), timeout, 3)

    def status_json(self):
        return json.loads(self.sh("/opt/flexnode/bin/flexnode status -o json", 60))

    def journal(self, args="", timeout=120):
        return self.sh("journalctl --no-pager %s" % args, timeout)

    def cursor(self):
        """The guest journal's position now: journal_after(cursor) reads what came later."""
        out = self.sh("journalctl --no-pager -n 0 --show-cursor")
        m = re.search(r"-- cursor: (\S+)", out)
        need(m, "no journal cursor: %r" % out)
        return m.group(1)

    def journal_after(self, cursor, args="", timeout=120):
        return self.sh("journalctl --no-pager --after-cursor=%s %s" % (shlex.quote(cursor), args), timeout)

    def agent_decided(self, timeout=300):
        """The running daemon's own account that it has listed this node's operations (both
        watches) and decided about each: the positive signal before a negative check. Read
        from the journal of its own PID, so it is this daemon's, not an earlier one's.
        Returns those journal lines."""
        def listed():
            f = self.agent_active()
            if not f:
                return None
            out = self.journal("-b _PID=%s -o cat" % f.get("agent.MainPID"))
            lines = [l for l in out.splitlines() if "operations listed" in l]
            seen = {w for w in ("own", "selector") for l in lines if "watch=%s" % w in l}
            return lines if len(seen) == 2 else None
        return wait_until("the daemon's 'operations listed' journal lines", listed, timeout, 2)

    def version(self, path="/opt/flexnode/current/flexnode"):
        return self.sh("%s version" % path).strip()

    # -- API
    def kubectl(self, *args, inp=None, timeout=60):
        p = subprocess.run([self.kubectl_bin, "--kubeconfig", self.kubeconfig, *args],
                           input=inp, capture_output=True, text=True, timeout=timeout)
        return p.returncode, p.stdout, p.stderr

    def get_op(self, name):
        rc, out, err = self.kubectl("get", "machineoperations", name, "-o", "json")
        if rc != 0:
            if "NotFound" in err or "not found" in err:
                return None
            raise Fail("kubectl get machineoperation %s: %s" % (name, err.strip()))
        return json.loads(out)

    def op_create(self, kind, name, url=None, sha=None, node=None):
        args = [self.flexnode, "op", "--kubeconfig", self.kubeconfig, "create", kind,
                "--node", node or self.node, "--name", name]
        if url:
            args += ["--url", url, "--sha256", sha]
        p = subprocess.run(args, capture_output=True, text=True, timeout=60)
        need(p.returncode == 0, "flexnode op create %s %s: rc %d: %s" % (kind, name, p.returncode,
                                                                        (p.stderr or p.stdout).strip()))

    def op_raw(self, name, kind, params=None):
        """Creates the object with kubectl (no client-side validation: the AGENT must judge it)."""
        spec = {"machineRef": self.node, "operationKind": kind}
        if params is not None:
            spec["parameters"] = params
        obj = {"apiVersion": "unbounded-cloud.io/v1alpha3", "kind": "MachineOperation",
               "metadata": {"name": name}, "spec": spec}
        rc, out, err = self.kubectl("create", "-f", "-", inp=json.dumps(obj))
        need(rc == 0, "kubectl create %s: %s" % (name, err.strip()))

    def machine(self):
        rc, out, err = self.kubectl("get", "machines", self.node, "-o", "json")
        return json.loads(out) if rc == 0 else None

    def events_for(self, name):
        rc, out, err = self.kubectl("get", "events.v1.events.k8s.io", "-A", "-o", "json")
        if rc != 0:
            return []
        return [e for e in json.loads(out).get("items", [])
                if (e.get("regarding") or {}).get("name") == name
                and (e.get("regarding") or {}).get("kind") == "MachineOperation"]

    def art_log_lines(self):
        try:
            with open(self.art_log) as fh:
                return fh.read().splitlines()
        except OSError:
            return []


def op_view(op):
    """(phase, reason, message, completedAt, startedAt) of an operation object."""
    st = (op or {}).get("status") or {}
    reason = ""
    for c in st.get("conditions") or []:
        if c.get("type") == "Completed":
            reason = c.get("reason", "")
    return (st.get("phase") or "", reason, st.get("message") or "", st.get("completedAt") or "",
            st.get("startedAt") or "")


# ------------------------------------------------------------------------ operation watch

class Recorder(threading.Thread):
    """Every state of every MachineOperation from the start, as the tests' watch recorder
    (tests/support/recording.rs, run as examples/watch-recorder.rs) tells it, one JSON line
    each: a list, then a watch that resumes from the last resourceVersion it saw. A re-list
    (the API server could no longer resume: events were compacted away) may have skipped
    states: `gaps` keeps it and the final check fails on it; a failed watch tried again is a
    resume. The recorder judges each operation's states itself (`violations`). soak.py's
    `MachineWatch` records the Machines with `what = "machines"` and its own `_row`."""

    what = "operations"

    def __init__(self, lab):
        super().__init__(daemon=True)
        self.cmd = [lab.recorder, lab.kubeconfig, self.what]
        self.hist = {}  # name -> rows (`_row`)
        self.rv_seen = {}  # name -> newest resourceVersion seen
        self.judged = {}  # name -> the recorder's violations after its newest state
        self.lock = threading.Lock()
        self.proc = None
        self.resumes = 0
        self.gaps = []
        self.listed = threading.Event()

    def run(self):
        self.proc = subprocess.Popen(self.cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True)
        for line in self.proc.stdout:
            told = json.loads(line)
            kind = told["record"]
            if kind == "listed":
                self.listed.set()
            elif kind == "relisted":
                self.gaps.append("%s: listed again: states may be missing" % time.strftime("%H:%M:%S"))
            elif kind == "error":
                self.resumes += 1
            else:
                st = told["state"]
                row = self._row(st)
                with self.lock:
                    name = st["name"]
                    self.rv_seen[name] = int(st["resourceVersion"] or 0)
                    self.judged[name] = told["violations"]
                    h = self.hist.setdefault(name, [])
                    if not h or h[-1][1:] != row[1:]:
                        h.append(row)

    @staticmethod
    def _row(st):
        """(t, phase, reason, message, completedAt, startedAt, uid), as `op_view` gives them."""
        return (st["at"], st["phase"] or "", st["completedReason"], st["message"],
                st["completedAt"] or "", st["startedAt"] or "", st["uid"])

    def stop(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)

    def caught_up(self, name, rv):
        with self.lock:
            return self.rv_seen.get(name, 0) >= rv

    def history(self, name):
        with self.lock:
            return list(self.hist.get(name, []))

    def names(self):
        with self.lock:
            return list(self.hist)

    def violations(self, name):
        """Ways `name` broke its contract: more than one terminal result, a terminal phase
        left, pending again after InProgress."""
        with self.lock:
            return list(self.judged.get(name, []))


# -------------------------------------------------------------------- what suites share

class SuiteBase:
    """A suite's state and its checks' common steps: the operations it created (each must
    finish), the watch of every operation, waiting for phases and terminal results."""

    def __init__(self, lab):
        self.lab = lab
        self.watch = Recorder(lab)
        self.created = []

    def create(self, kind, name, **kw):
        self.created.append(name)
        self.lab.op_create(kind, name, **kw)

    def create_raw(self, name, kind, params):
        self.created.append(name)
        self.lab.op_raw(name, kind, params)

    def kernel_modules(self, log):
        """The machines' kernel modules are in the guest's kernel and listed for its boots;
        `log` (what the join logged) shows the host's modprobe loaded them: the lab's Debian
        kernel has both as modules that nothing else loads."""
        out = self.lab.sh("grep -qw overlay /proc/filesystems && echo overlay; "
                          "test -d /proc/sys/net/bridge && echo br_netfilter; "
                          "grep -v '^#' /etc/modules-load.d/flexnode.conf | tr '\\n' ' '")
        need(out.split() == ["overlay", "br_netfilter", "overlay", "br_netfilter"],
             "kernel modules: %r" % out)
        if self.lab.native_node:
            # A native node shares this host's kernel, which has both already: nothing to load.
            need("kernel modules loaded by the host's modprobe" not in log,
                 "the join ran modprobe for modules the kernel already has")
        else:
            need("kernel modules loaded by the host's modprobe" in log,
                 "the join did not log loading the modules by the host's modprobe")

    def wait_phase(self, name, phases, timeout):
        def probe():
            for row in reversed(self.watch.history(name)):
                if row[1] in phases:
                    return row
            op = self.lab.get_op(name)
            v = op_view(op)
            return v if v[0] in phases else None
        return wait_until("%s to reach %s" % (name, "/".join(phases)), probe, timeout, 2)

    def terminal(self, name, timeout):
        """Waits for a terminal phase; returns (phase, reason, message, completedAt, startedAt)."""
        wait_until("%s to finish (Complete or Failed)" % name,
                   lambda: op_view(self.lab.get_op(name))[0] in TERMINAL, timeout, 3)
        v = op_view(self.lab.get_op(name))
        detail("%s: %s/%s %r completedAt=%s" % (name, v[0], v[1], v[2], v[3]))
        need(v[3], "%s is %s but has no completedAt" % (name, v[0]))
        return v

    def expect(self, name, phase, reason, timeout, message=None):
        v = self.terminal(name, timeout)
        need((v[0], v[1]) == (phase, reason),
             "%s ended %s/%s (%r), expected %s/%s" % (name, v[0], v[1], v[2], phase, reason))
        if message is not None:
            need(v[2] == message, "%s message %r, expected %r" % (name, v[2], message))
        return v

    def terminal_events(self, name):
        ev = [e for e in self.lab.events_for(name) if e.get("reason") in TERMINAL_REASONS]
        return sum(max(1, ((e.get("series") or {}).get("count") or 1)) for e in ev), ev

    def one_result(self, name):
        """Exactly one terminal result for `name`, in the watch and in Events. First waits until
        the watch has seen the object as the API server has it now (its resourceVersion)."""
        op = self.lab.get_op(name)
        need(op, "%s does not exist" % name)
        rv = int(op["metadata"]["resourceVersion"])
        wait_until("the watch to see %s at resourceVersion %d" % (name, rv),
                   lambda: self.watch.caught_up(name, rv), 60, 0.5)
        bad = self.watch.violations(name)
        need(not bad, "%s: %s" % (name, "; ".join(bad)))
        n, ev = self.terminal_events(name)
        if op_view(op)[0] in TERMINAL:
            need(n == 1, "%s: %d terminal Events (%s)" % (name, n, [e.get("reason") for e in ev]))
        else:
            need(n == 0, "%s is %r but has terminal Events %s" % (name, op_view(op)[0], [e.get("reason") for e in ev]))
        phases = [r[1] or "-" for r in self.watch.history(name)]
        detail("%s went through: %s; terminal Events: %d" % (name, " -> ".join(phases), n))

    def power_cycle(self):
        self.lab.drop_ssh()
        t = time.time()
        self.lab.qemu("poweroff", self.lab.guest, timeout=60)
        detail("power cut (QMP quit) at +0 s; cold boot ...")
        self.lab.qemu("boot", self.lab.guest, timeout=600)
        self.lab.refresh_port()
        detail("guest back (ssh) after %.0f s" % (time.time() - t))

    def in_flight_at_cut(self, name):
        """The power cut hit `name` in flight: the daemon of the boot after it carried on the
        operation's transitions, so the cut came before its result (a result published
        before the cut would leave this boot nothing to do for it)."""
        j = self.lab.journal("-b -u flexnode-agent -o cat", 300)
        moved = [l for l in j.splitlines() if "transition from=" in l and "op=%s " % name in l]
        need(moved, "no transition of %s since the boot after the cut: it had finished before the cut" % name)
        detail("in flight at the cut: %s" % moved[0].split("transition ", 1)[1][:160])

    def c_one_result_each(self):
        """Over the whole run: every operation has exactly one terminal result in the watch
        (which never lost events: every resume continued from its last resourceVersion) and
        exactly one terminal Event."""
        need(not self.watch.gaps, "the watch lost events it cannot account for: %s" % self.watch.gaps)
        names = set(self.created) | set(self.watch.names())
        need(set(self.created) <= set(self.watch.names()),
             "the watch never saw %s" % sorted(set(self.created) - set(self.watch.names())))
        bad = []
        for n in sorted(names):
            op = self.lab.get_op(n)
            v = op_view(op)
            if op is not None:
                rv = int(op["metadata"]["resourceVersion"])
                wait_until("the watch to see %s at resourceVersion %d" % (n, rv),
                           lambda: self.watch.caught_up(n, rv), 60, 0.5)
            bad += ["%s: %s" % (n, b) for b in self.watch.violations(n)]
            if n in self.created and v[0] not in TERMINAL:
                bad.append("%s never finished (phase %r)" % (n, v[0]))
            if v[0] in TERMINAL:
                count, _ = self.terminal_events(n)
                if count != 1:
                    bad.append("%s has %d terminal Events" % (n, count))
        need(not bad, "; ".join(bad))
        detail("%d operations, each with exactly one terminal result and one terminal Event "
               "(the watch resumed %d times from its last resourceVersion, no gap)"
               % (len(names), self.watch.resumes))

    def measure_upgrade(self, name, since):
        """Hand-off gap and claim -> Complete from the guest journal (docs/benchmarks.md)."""
        m = upgrade_moments(self.lab, name, since)
        if m is None:
            detail("measure: journal incomplete for %s" % name)
            return
        print("measure: %s hand-off gap %.0f ms (old daemon exited -> new daemon ready); "
              "claim -> Complete %.0f ms, of which staging (download+verify+unpack+version) %.0f ms, "
              "excluding staging %.0f ms" % (name, (m["ready"] - m["exited"]) * 1e3,
                                             (m["ready"] - m["claim"]) * 1e3,
                                             (m["staged"] - m["claim"]) * 1e3,
                                             (m["ready"] - m["staged"]) * 1e3),
              flush=True)


def upgrade_moments(lab, name, since):
    """The moments (unix seconds) of AgentUpgrade `name` in the guest's journal since `since`:
    claim, staged (Switching), exited (old daemon), ready (new daemon's `Started`); None
    while the journal does not show them all."""
    rc, out, _ = lab.ssh("journalctl --no-pager -o json -u flexnode-agent --since @%d" % since, 120)
    if rc != 0:
        return None
    ev = []
    for line in out.splitlines():
        try:
            j = json.loads(line)
        except ValueError:
            continue
        msg = j.get("MESSAGE")
        if isinstance(msg, str):
            ev.append((int(j["__REALTIME_TIMESTAMP"]) / 1e6, re.sub(r"\x1b\[[0-9;]*m", "", msg)))

    def first(pred, after=0.0):
        return next((t for t, m in ev if t >= after and pred(m)), None)
    claim = first(lambda m: "transition" in m and "OperationClaimed(AgentUpgrade %s)" % name in m)
    staged = first(lambda m: "transition" in m and "to=Upgrading/Switching" in m, claim or 0)
    exited = first(lambda m: m.startswith("flexnode-agent.service: Deactivated successfully"), staged or 0)
    # The new daemon judges the hand-off and publishes the result before it tells systemd
    # it is ready, so `Started` marks both the end of the gap and the published result.
    ready = first(lambda m: m.startswith("Started flexnode-agent.service"), exited or 0)
    if None in (claim, staged, exited, ready):
        return None
    return {"claim": claim, "staged": staged, "exited": exited, "ready": ready}


def show_guest(lab, script, last=50):
    """A failure's context: the last lines a guest script prints, indented; never fails."""
    try:
        _, out, _ = lab.ssh(script, 30)
        for line in out.splitlines()[-last:]:
            print("    | " + line, flush=True)
    except Exception as e:  # noqa: BLE001 - diagnostics must never fail the run
        print("    | (no guest output: %s)" % e, flush=True)

# ------------------------------------------------------------------------------ the runner

def run_suite(doc, all_checks, suite_cls, lab_cls, diagnose, first, skipped_first, tier=QEMU):
    """A suite's command line (`--lab DIR [--tier T] [--only a,b] [--list]`) and run: each
    check placed in tier T (`all_checks`: (name, function, QEMU/NATIVE/BOTH)), in order,
    `PASS name (s)` / `FAIL name (s): why` (then `diagnose(lab)`), and the summary `N passed,
    M failed, K not run in T s`; 1 if a check failed. `skipped_first(suite)` runs when
    `--only` leaves out the check named `first` (the one that sets the node up)."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lab")
    ap.add_argument("--tier", choices=sorted({w for _, _, w in all_checks if w != BOTH} | {tier}), default=tier,
                    help="the checks placed in this tier (default %s)" % tier)
    ap.add_argument("--only", default="", help="comma-separated check names (default: all of the tier, in order)")
    ap.add_argument("--list", action="store_true", help="the tier's checks, one per line")
    a = ap.parse_args()
    checks = [(n, fn) for n, fn, where in all_checks if where in (a.tier, BOTH)]
    if a.list:
        for n, _ in checks:
            print(n)
        return 0
    if not a.lab:
        ap.error("--lab is required (except with --list)")
    only = [x for x in a.only.split(",") if x]
    unknown = set(only) - {n for n, _ in checks}
    if unknown:
        sys.exit("suite: not checks of the %s tier: %s" % (a.tier, ", ".join(sorted(unknown))))
    def on_term(signum, _frame):
        raise KeyboardInterrupt("signal %d" % signum)
    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)  # also when started with SIGINT ignored (background)
    lab = lab_cls(a.lab)
    suite = suite_cls(lab)
    suite.watch.start()
    if not suite.watch.listed.wait(60):
        sys.exit("suite: the operation watch could not list MachineOperations")
    t_all = time.time()
    passed = failed = 0
    ran = set()
    try:
        if only and first not in only:
            skipped_first(suite)
        for name, fn in checks:
            if only and name not in only:
                continue
            print("---- %s" % name, flush=True)
            ran.add(name)
            t = time.time()
            try:
                fn(suite)
            except Fail as e:
                failed += 1
                print("FAIL %s (%.1f s): %s" % (name, time.time() - t, e), flush=True)
                diagnose(lab)
            except Exception as e:  # noqa: BLE001 - any error is this check's failure
                failed += 1
                print("FAIL %s (%.1f s): %s: %s" % (name, time.time() - t, type(e).__name__, e), flush=True)
                diagnose(lab)
            else:
                passed += 1
                print("PASS %s (%.1f s)" % (name, time.time() - t), flush=True)
    except KeyboardInterrupt:
        print("interrupted", flush=True)
        failed += 1
    finally:
        suite.watch.stop()
        lab.drop_ssh()
    not_run = [n for n, _ in checks if n not in ran]
    print("%d passed, %d failed, %d not run%s in %.1f s"
          % (passed, failed, len(not_run), " (%s)" % ", ".join(not_run) if not_run else "",
             time.time() - t_all), flush=True)
    return 1 if failed else 0
