#!/usr/bin/env python3
"""e2e/host/soak.py — the power-cut soak, run by `e2e/run soak` (host install) and
`e2e/container/run soak` (container install) in a fresh lab of their own. Not part of CI.

  soak.py --lab DIR --mode host|container --cuts N [--seed S] [--kinds upgrade,reboot,repave]
          [--record FILE]

The node joins (host: `flexnode join`; container: the first boot's bootstrap unit), then N
cuts: a kind (every kind once per round, the round's order shuffled; before a kind's first cut
one uncut run of it measures its window, operation created -> terminal result), the operation started
(AgentUpgrade: to the lab's other build — an archive on the host, an image in a container
install; NodeReboot; repave: a new Machine generation with the Node deleted), the power cut
(QMP quit) at a seeded random offset inside the kind's window, a cold boot, then the checks:

- exactly one terminal result, from the recorded watch histories (the operations' and the
  Machine's), within a bound; one terminal Event per operation;
- the layout agrees with that result and with the store (`flexnode status`): host, the
  `current`/`last-good` links name existing slots, the agent runs from `current`; container,
  the image selection file names the image the agent's container runs; machines, exactly the
  active side runs and it is the one the store names, the Node Ready in a heartbeat since the
  cut (NodeReboot, repave);
- nothing ran twice: in the store's journal since the operation began no disruptive effect
  appears twice, no step is left without its outcome; in systemd's journal (what the stream
  saw before the cut and the boot's journal after it) the agent unit and each machine unit
  were stopped at most once;
- the agent serves the next operation (the next cut's; after the last one, an uncut
  AgentUpgrade).

Each cut prints one line: `CUT i/N kind offset=…s/…s in-flight: … -> outcome (converged in
… s) OK|FAIL: why`, and appends a JSON record to FILE (default
$FLEXNODE_CACHE/soak/<mode>-<utc>-seed<S>.jsonl); the last line is the per-kind summary.
Exit 1 if a cut failed. Python 3 stdlib only.
"""

import argparse
import importlib.util
import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time

from lab import (MSG_REBOOT_DONE, MSG_UPGRADE_DONE, SLOT_RE, TERMINAL, Fail, Lab, Recorder,
                 detail, need, op_view, show_guest, slot_path, wait_until)

KINDS = ("upgrade", "reboot", "repave")
# Bounds from the cold boot to the terminal result (TCG: a repave unpacks ≈300 MB in the guest).
BOUND = {"upgrade": 900, "reboot": 900, "repave": 1800}
DISRUPTIVE = ("SwitchAgent", "ScheduleAgentRestart", "RestartAgent", "StopMachine",
              "RestartMachine", "RemoveMachine", "WipeNode", "UninstallAgent")
ANSI = re.compile(r"\x1b\[[0-9;]*m")


# ------------------------------------------------------------------------ what is recorded

class MachineWatch(Recorder):
    """Every state of the Machines (their phase and `NodeUpdated` condition), recorded like
    the operations (lab.Recorder); `history(lab.node)` is the node's."""

    what = "machines"

    @staticmethod
    def _row(st):
        """(t, generation, phase, NodeUpdated status, its message, its observedGeneration, uid)."""
        return (st["at"], st["generation"], st["phase"], st["updatedStatus"], st["updatedMessage"],
                st["observedGeneration"], st["uid"])


def repave_terminal(row, gen):
    """Whether a Machine row is a repave's result for generation `gen`: applied, or failed."""
    _, _, phase, _, msg, observed, _ = row
    if phase == "Ready" and msg == "machine goal state applied" and observed == gen:
        return "applied"
    if phase == "Failed" and msg.startswith("repave to") and observed == gen:
        return "failed"
    return None


class GuestStream(threading.Thread):
    """The guest's journal from now on (`journalctl -f -o json`), over an ssh connection of its
    own, until the cut: what the agent and PID 1 logged before the power went, including what
    had not reached the guest's disk."""

    def __init__(self, lab, marker):
        super().__init__(daemon=True)
        opts = [("ControlPath=none" if o.startswith("ControlPath=") else o) for o in lab.ssh_opts]
        self.proc = subprocess.Popen(["ssh", *opts, "root@127.0.0.1", "exec journalctl -f -n 0 -o json"],
                                     stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, text=True)
        self.marker = marker
        self.lines = []
        self.lock = threading.Lock()
        self.started = threading.Event()

    def run(self):
        for raw in self.proc.stdout:
            try:
                j = json.loads(raw)
            except ValueError:
                continue
            e = journal_entry(j)
            if e["msg"] == self.marker:
                self.started.set()
            with self.lock:
                self.lines.append(e)

    def snapshot(self):
        with self.lock:
            return list(self.lines)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def journal_entry(j):
    msg = j.get("MESSAGE")
    if isinstance(msg, list):
        msg = bytes(b & 0xff for b in msg).decode("utf-8", "replace")
    return {"t": int(j.get("__REALTIME_TIMESTAMP") or 0) / 1e6, "pid": j.get("_PID"),
            "unit": j.get("_SYSTEMD_UNIT") or "", "msg": ANSI.sub("", msg or "")}


def stops(entries, unit):
    """PID 1's `Stopping UNIT` lines: a stop job of the unit (a restart has one too); a power
    cut has none."""
    return sum(1 for e in entries if e["pid"] == "1" and e["msg"].startswith("Stopping %s" % unit))


def in_flight(entries):
    """The agent's last transition before the cut: its target state, and whether it was
    resuming an interrupted step."""
    last = None
    for e in entries:
        if e["unit"] == "flexnode-agent.service" and " transition " in " %s " % e["msg"]:
            m = re.search(r"\bto=(.*)$", e["msg"])
            last = (m.group(1) if m else e["msg"]).split(" side=")[0].strip()
    return last


# --------------------------------------------------------------------------- install modes

def patient(lab):
    """The lab's guest shell, patient with ssh itself: a connection that fails (exit 255:
    refused, or no banner from a guest that TCG on a loaded host runs slowly) is tried again
    for up to 3 minutes; a command's own failure is not."""
    once = lab.ssh

    def ssh(script, timeout=120, inp=None):
        deadline = time.time() + 180
        while True:
            rc, out, err = once(script, timeout, inp)
            if rc != 255 or time.time() > deadline:
                return rc, out, err
            lab.drop_ssh()
            time.sleep(3)
    lab.ssh = ssh
    return lab


def load_suite(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class HostMode:
    """The host install: the agent's slots and links under /opt/flexnode, archives."""

    name = "host"

    def __init__(self, lab_dir):
        self.mod = load_suite(os.path.join(os.path.dirname(os.path.abspath(__file__)), "suite.py"), "host_suite")
        self.lab = patient(Lab(lab_dir))
        self.suite = self.mod.Suite(self.lab)

    def join(self):
        self.suite.c_join()

    def wait_agent(self, timeout):
        return self.lab.wait_agent(timeout)

    def history(self):
        return json.loads(self.lab.sh("/opt/flexnode/bin/flexnode history -o json --limit 100000", 120))["entries"]

    def before_upgrade(self):
        f = self.lab.facts()
        return {"cur": slot_path(f.get("link.current", "")), "lg": slot_path(f.get("link.last-good", "")),
                "version": self.lab.version()}

    def start_upgrade(self, name, before):
        which = "base" if before["version"] == "flexnode " + self.lab.ver_next else "next"
        archive, sha, want = self.suite.archive(which)
        self.suite.create("upgrade", name, url=self.suite.url(archive), sha=sha)
        return "flexnode " + want

    def layout(self):
        """The links name two existing slots, the agent runs from `current` (the build the
        link names), and the store's `flexnode status` names the same slots. Returns (current,
        last-good, version, description)."""
        lab = self.lab
        f = lab.wait_agent(300)
        cur, lg = slot_path(f.get("link.current", "")), slot_path(f.get("link.last-good", ""))
        need(SLOT_RE.match(cur), "current -> %r is not a slot" % cur)
        # no last-good before the first upgrade
        need(not lg or SLOT_RE.match(lg), "last-good -> %r is not a slot" % lg)
        need(cur != lg, "current and last-good both name %s" % cur)
        lab.sh("test -x %s/flexnode" % cur + (" && test -x %s/flexnode" % lg if lg else ""))
        need(f.get("agent.exe", "").startswith(cur + "/"),
             "the agent (pid %s) runs %r, not from current %s" % (f.get("agent.MainPID"), f.get("agent.exe"), cur))
        ver = lab.version()
        need(lab.version("/proc/%s/exe" % f.get("agent.MainPID")) == ver, "the running daemon is not the build in current")
        node = (self.status() or {}).get("node") or {}
        color = lambda p: "slot " + p.rsplit("-", 1)[-1] if p else None  # noqa: E731 - /opt/flexnode/lib/flexnode-<color>
        need(node.get("agent") == color(cur) and node.get("lastGoodAgent") == color(lg),
             "flexnode status names agent %r, last good %r; the links %s, %s"
             % (node.get("agent"), node.get("lastGoodAgent"), cur, lg))
        return cur, lg, ver, "current %s (%s), last-good %s" % (cur.rsplit("/", 1)[-1], ver, (lg or "-").rsplit("/", 1)[-1])

    def upgrade_layout(self, v, before, want):
        """`layout`, and the links and version are the result's."""
        cur, lg, ver, desc = self.layout()
        if v[0] == "Complete":
            need(cur != before["cur"] and lg == before["cur"],
                 "Complete but current %s, last-good %s (was current %s)" % (cur, lg, before["cur"]))
            need(ver == want, "Complete but current runs %r, not %r" % (ver, want))
        else:
            need(cur == before["cur"] and ver == before["version"],
                 "%s but current %s runs %r (was %s, %r)" % (v[0], cur, ver, before["cur"], before["version"]))
        return desc

    def status(self):
        return self.lab.status_json()


class ContainerMode:
    """The container install: the agent's image selection files and its container."""

    name = "container"

    def __init__(self, lab_dir):
        here = os.path.dirname(os.path.abspath(__file__))
        self.mod = load_suite(os.path.join(here, "..", "container", "suite.py"), "container_suite")
        self.lab = patient(self.mod.ContainerLab(lab_dir))
        self.suite = self.mod.Suite(self.lab)

    def join(self):
        self.suite.c_first_boot()

    def wait_agent(self, timeout):
        return self.suite.wait_agent(timeout)

    def history(self):
        return json.loads(self.lab.agent_cli("history -o json --limit 100000"))["entries"]

    def before_upgrade(self):
        f = self.suite.wait_agent(120)
        return {"selected": f.get("selected"), "last_good": f.get("last_good"), "version": self.suite.version()}

    def start_upgrade(self, name, before):
        lab = self.lab
        which = "base" if before["selected"] == lab.image_ref("next") else "next"
        self.suite.upgrade(name, which)
        return which

    def running_image(self):
        out = self.lab.sh("%s containers info flexnode-agent" % self.mod.CTR)
        return (json.loads(out) or {}).get("Image", "")

    def layout(self):
        """agent-image.env names the image the agent's container runs, which answers with
        that build's version; `flexnode status` names the same digests as the selection
        files. Returns (selected, last good, description)."""
        lab = self.lab
        f = self.suite.wait_agent(600)
        sel, lg = f.get("selected"), f.get("last_good")
        run = self.running_image()
        need(sel and run == sel, "the agent's container runs %r, agent-image.env selects %r" % (run, sel))
        ver = self.suite.version()
        wantver = "flexnode " + (lab.ver_next if sel in (lab.image_ref("next"), lab.image_ref("fresh")) else lab.ver_base)
        need(ver == wantver, "the agent's container answers %r, expected %r" % (ver, wantver))
        node = (self.status() or {}).get("node") or {}
        short = lambda ref: "image sha256:" + ref.rsplit("@sha256:", 1)[-1][:12] if ref else None  # noqa: E731
        need(node.get("agent") == short(sel) and node.get("lastGoodAgent") == short(lg),
             "flexnode status names agent %r, last good %r; selected %s, last good %s"
             % (node.get("agent"), node.get("lastGoodAgent"), sel, lg))
        return sel, lg, "selected %s (%s), last good %s" % (sel.rsplit("@", 1)[-1][:19], ver, (lg or "-").rsplit("@", 1)[-1][:19])

    def upgrade_layout(self, v, before, which):
        """`layout`, and the selection is the result's; the last good image the one left."""
        sel, lg, desc = self.layout()
        want = self.lab.image_ref(which) if v[0] == "Complete" else before["selected"]
        need(sel == want, "%s/%s but agent-image.env selects %r, not %r" % (v[0], v[1], sel, want))
        if v[0] == "Complete":
            need(lg == before["selected"], "the last good image is %r, not the one left (%r)" % (lg, before["selected"]))
        return desc

    def status(self):
        return self.lab.status_json()


# ------------------------------------------------------------------------------- the soak

class Soak:
    def __init__(self, mode, rng, record, seed):
        self.mode = mode
        self.lab = mode.lab
        self.suite = mode.suite
        self.rng = rng
        self.seed = seed
        self.record = record
        self.mwatch = MachineWatch(self.lab)
        self.window = {}
        self.results = []

    # -- the node as a whole
    def machines(self):
        out = self.lab.sh("for m in kube1 kube2; do echo $m=$(systemctl is-active systemd-nspawn@$m || true); done")
        return dict(l.split("=", 1) for l in out.split())

    def settled(self, since):
        """The node at rest after an operation: the store Ready with nothing in flight or
        interrupted; exactly its active side runs; the Node Ready in a heartbeat since `since`
        (unix time); returns (status, Node)."""
        st = wait_until("flexnode status: Ready, no operation, nothing interrupted",
                        lambda: (lambda s: s if s.get("phase") == "Ready" and not s.get("currentOperation")
                                 and not s.get("interruptedEffects") else None)(self.mode.status()), 300, 5)
        side = (st.get("node") or {}).get("activeSide")
        other = {"kube1": "kube2", "kube2": "kube1"}[side]
        m = wait_until("exactly %s running" % side,
                       lambda: (lambda m: m if m.get(side) == "active" and m.get(other) != "active" else None)(self.machines()),
                       300, 5)
        n = self.suite.node_ready(600, since)
        return st, n, m

    def store_since(self, seq0):
        """The store's journal since `seq0`: every step has its outcome, no disruptive effect
        appears twice. Returns the entries."""
        entries = [e for e in self.mode.history() if e.get("seq", 0) > seq0]
        open_ = [e.get("seq") for e in entries if e.get("outcome") is None]
        need(not open_, "journal entries without an outcome: %s" % open_)
        seen = {}
        for e in entries:
            for eff in e.get("effects") or []:
                if eff.split("(", 1)[0] in DISRUPTIVE:
                    seen.setdefault(eff, []).append(e.get("seq"))
        twice = {k: v for k, v in seen.items() if len(v) > 1}
        need(not twice, "disruptive effects in more than one step: %s" % twice)
        return entries

    def last_seq(self):
        h = self.mode.history()
        return max((e.get("seq", 0) for e in h), default=0)

    # -- one operation of each kind, started
    def start(self, kind, name):
        """Starts an operation of `kind`; returns what its checks need."""
        ctx = {"kind": kind, "name": name}
        if kind == "upgrade":
            ctx["before"] = self.mode.before_upgrade()
            ctx["want"] = self.mode.start_upgrade(name, ctx["before"])
        elif kind == "reboot":
            ctx["side"] = (self.mode.status().get("node") or {}).get("activeSide")
            self.suite.create("reboot", name)
        else:
            st = self.mode.status()
            node = st.get("node") or {}
            ctx["from"] = node.get("activeSide")
            ctx["to"] = {"kube1": "kube2", "kube2": "kube1"}[ctx["from"]]
            want = self.lab.st["K8S_VERSION"]
            ctx["version"] = want
            ctx["gen"] = self.suite.drift_and_delete_node(name, want if node.get("appliedKubernetesVersion") != want else None)
        return ctx

    def terminal_row(self, ctx, after):
        """The first terminal result of the operation the watches recorded, or None."""
        if ctx["kind"] == "repave":
            for row in self.mwatch.history(self.lab.node):
                if row[0] >= after and repave_terminal(row, ctx["gen"]):
                    return row
            return None
        for row in self.suite.watch.history(ctx["name"]):
            if row[1] in TERMINAL:
                return row
        return None

    def in_flight_api(self, ctx, after):
        """What the API showed of the operation at the cut."""
        if ctx["kind"] == "repave":
            rows = [r for r in self.mwatch.history(self.lab.node) if r[0] >= after]
            if not rows:
                return "Machine unchanged"
            r = rows[-1]
            return "Machine %s %r" % (r[2] or "-", r[4][:60])
        h = self.suite.watch.history(ctx["name"])
        return "op %s" % ("/".join(x for x in h[-1][1:3] if x) if h and h[-1][1] else "not claimed")

    def wait_terminal(self, ctx, after, bound):
        return wait_until("%s's terminal result" % ctx["name"], lambda: self.terminal_row(ctx, after), bound, 2)

    # -- the checks after an operation (cut or not)
    def check(self, ctx, t_start, t_cut, entries):
        """Everything a cut must leave; returns (outcome, details)."""
        kind, name = ctx["kind"], ctx["name"]
        row = self.wait_terminal(ctx, t_start, BOUND[kind] + (0 if t_cut is None else 120))
        conv = row[0] - (t_cut if t_cut is not None else t_start)
        self.mode.wait_agent(600)
        # a heartbeat since the cut (the machine booted again) or since a restart the
        # operation made; an uncut AgentUpgrade restarts no kubelet, which reports no sooner
        # than its status report period
        since = t_cut if t_cut is not None else (None if kind == "upgrade" else t_start)
        st, n, _ = self.settled(None if since is None else since - 5)
        # the daemon running now has listed the operations and decided about each
        self.lab.agent_decided(600)
        store = self.store_since(ctx["seq0"])
        post = self.boot_journal() if t_cut is not None else []
        where = []
        if kind == "repave":
            gen = ctx["gen"]
            rows = [r for r in self.mwatch.history(self.lab.node) if r[0] >= t_start]
            first = next(i for i, r in enumerate(rows) if repave_terminal(r, gen))
            bad = ["%s %r" % (r[2], r[4][:80]) for r in rows[first + 1:]
                   if r[2] in ("Provisioning", "Failed") or (repave_terminal(r, gen) not in (None, repave_terminal(rows[first], gen)))]
            need(not bad, "the Machine changed after its result for generation %d: %s" % (gen, bad))
            res = repave_terminal(rows[first], gen)
            node = st.get("node") or {}
            want_side = ctx["to"] if res == "applied" else ctx["from"]
            need(node.get("activeSide") == want_side, "repave %s but the store's active side is %s" % (res, node.get("activeSide")))
            if res == "applied":
                need(node.get("appliedGeneration") == gen and node.get("appliedKubernetesVersion") == ctx["version"],
                     "applied, but the store has generation %s at %s" % (node.get("appliedGeneration"), node.get("appliedKubernetesVersion")))
                left = self.lab.sh("test -e /var/lib/machines/%s && echo left || echo gone" % ctx["from"]).strip()
                need(left == "gone", "the old side's tree %s is %s" % (ctx["from"], left))
            kv = ((n.get("status") or {}).get("nodeInfo") or {}).get("kubeletVersion")
            need(res != "applied" or kv == ctx["version"], "the Node's kubelet is %s, not %s" % (kv, ctx["version"]))
            for side in ("kube1", "kube2"):
                k = stops(entries + post, "systemd-nspawn@%s.service" % side)
                need(k <= 1, "systemd-nspawn@%s was stopped %d times" % (side, k))
            outcome = "%s %s (gen %d)" % ("Ready" if res == "applied" else "Failed", rows[first][4][:70], gen)
            where.append("%s active, Node Ready (kubelet %s)" % (want_side, kv))
            where.append(self.mode.layout()[-1])
        else:
            self.suite.one_result(name)
            v = op_view(self.lab.get_op(name))
            outcome = "%s/%s" % (v[0], v[1])
            if kind == "upgrade":
                where.append(self.mode.upgrade_layout(v, ctx["before"], ctx["want"]))
                need(v[2] == MSG_UPGRADE_DONE or v[0] == "Failed", "%s message %r" % (name, v[2]))
                k = stops(entries + post, "flexnode-agent.service")
                need(k <= 1, "flexnode-agent was stopped %d times" % k)
            else:
                side = ctx["side"]
                need((st.get("node") or {}).get("activeSide") == side,
                     "after the reboot the store's active side is %s, was %s" % ((st.get("node") or {}).get("activeSide"), side))
                need(v[0] != "Complete" or v[2] == MSG_REBOOT_DONE, "%s message %r" % (name, v[2]))
                k = stops(entries + post, "systemd-nspawn@%s.service" % side)
                need(k <= 1, "systemd-nspawn@%s was stopped %d times (one restart per NodeReboot)" % (side, k))
                where.append("%s restarted %d time(s) by a stop job, Node Ready" % (side, k))
                where.append(self.mode.layout()[-1])
            need(v[0] == "Complete", "ended %s/%s: %r" % (v[0], v[1], v[2]))
        resumed = [e["msg"] for e in post if "resuming effects interrupted by a crash" in e["msg"]]
        return outcome, conv, "; ".join(where), len(store), resumed

    def boot_journal(self):
        out = self.lab.sh("journalctl -b 0 -o json --no-pager -u flexnode-agent -u systemd-nspawn@kube1 "
                          "-u systemd-nspawn@kube2", 300)
        res = []
        for line in out.splitlines():
            try:
                res.append(journal_entry(json.loads(line)))
            except ValueError:
                pass
        return res

    # -- a run
    def run_one(self, kind, name, offset=None):
        """One operation; with `offset` the power is cut that many seconds after it started.
        Returns the record (`ok` false with `error` when a check failed)."""
        rec = {"mode": self.mode.name, "kind": kind, "name": name, "seed": self.seed,
               "window": round(self.window.get(kind, 0), 1)}
        try:
            self._run(kind, name, offset, rec)
        except Fail as e:
            rec.update(ok=False, error=str(e))
        except subprocess.TimeoutExpired as e:
            rec.update(ok=False, error="timeout: %s" % e)
        except (OSError, ValueError, KeyError) as e:
            rec.update(ok=False, error="%s: %s" % (type(e).__name__, e))
        return rec

    def _run(self, kind, name, offset, rec):
        lab = self.lab
        self.mode.wait_agent(600)
        seq0 = self.last_seq()
        marker = "soak-%s-%d" % (name, os.getpid())
        stream = GuestStream(lab, marker)
        stream.start()
        try:
            # the stream follows the journal once it shows a line logged after it started
            wait_until("the guest's journal stream to show %s" % marker,
                       lambda: lab.sh("logger -t flexnode-soak %s" % marker) is not None and stream.started.wait(1),
                       60, 0)
            t_start = time.time()
            ctx = self.start(kind, name)
            ctx["seq0"] = seq0
            t_cut = None
            if offset is not None:
                # The cut's moment is the thing under test: a seeded random point in the window.
                delay = t_start + offset - time.time()
                if delay > 0:
                    time.sleep(delay)
                entries = stream.snapshot()
                done = self.terminal_row(ctx, t_start)
                api = self.in_flight_api(ctx, t_start)
                agent = in_flight(entries)
                if done is not None:
                    where = "after completion"
                elif agent is None and ("not claimed" in api or "unchanged" in api):
                    where = "before the claim"
                else:
                    where = "in flight"
                lab.drop_ssh()
                t_cut = time.time()
                lab.qemu("poweroff", lab.guest, timeout=60)
                stream.stop()
                rec.update(offset=round(t_cut - t_start, 1), at=where, api=api, agent_step=agent or "-")
                print("  cut %s at +%.1f s (%s): %s; agent's last transition: %s"
                      % (name, t_cut - t_start, where, api, agent or "-"), flush=True)
                lab.qemu("boot", lab.guest, timeout=600)
                lab.refresh_port()
                rec["boot_s"] = round(time.time() - t_cut, 1)
            else:
                row = self.wait_terminal(ctx, t_start, BOUND[kind])
                entries = stream.snapshot()
                stream.stop()
                rec["window_measured"] = round(row[0] - t_start, 1)
        finally:
            stream.stop()
        outcome, conv, where, nsteps, resumed = self.check(ctx, t_start, t_cut, entries)
        rec.update(outcome=outcome, converge_s=round(conv, 1), layout=where, steps=nsteps,
                   resumed=[re.sub(r"^.*?resuming", "resuming", r)[:160] for r in resumed], ok=True)

    def log(self, rec):
        self.results.append(rec)
        with open(self.record, "a") as fh:
            fh.write(json.dumps(rec, sort_keys=True) + "\n")

    def calibrate(self, kind):
        """One uncut run of `kind` measures its window (before its first cut). The labs join
        at the previous minor: a first repave changes the version (it pulls the goal's node
        image, which no later repave does), so it runs first and the window is the second's."""
        plan = []
        if kind == "repave" and ((self.mode.status().get("node") or {}).get("appliedKubernetesVersion")
                                 != self.lab.st["K8S_VERSION"]):
            plan.append("soak-cal-repave-version")
        plan.append("soak-cal-%s" % kind)
        for name in plan:
            print("---- calibrate %s (uncut): %s" % (kind, name), flush=True)
            rec = self.run_one(kind, name)
            rec["calibration"] = True
            self.log(rec)
            if not rec["ok"]:
                print("FAIL calibration %s: %s" % (name, rec.get("error")), flush=True)
                diagnose(self.lab)
                return False
            self.window[kind] = rec["window_measured"]
            print("calibration %s: window %.1f s, %s; %s" % (name, rec["window_measured"], rec["outcome"], rec["layout"]),
                  flush=True)
        return True

    def cuts(self, n, kinds):
        order = []
        while len(order) < n:
            r = list(kinds)
            self.rng.shuffle(r)
            order += r
        failed = 0
        for i, kind in enumerate(order[:n], 1):
            if kind not in self.window and not self.calibrate(kind):
                return failed + n - i + 1
            offset = self.rng.uniform(0, self.window[kind])
            name = "soak-%d-%s" % (i, kind)
            print("---- cut %d/%d: %s, planned offset %.1f s of a %.1f s window" % (i, n, kind, offset, self.window[kind]),
                  flush=True)
            t = time.time()
            rec = self.run_one(kind, name, offset)
            rec.update(cut=i, planned=round(offset, 1), total_s=round(time.time() - t, 1))
            self.log(rec)
            line = "CUT %d/%d %s offset=%.1fs/%.1fs %s: %s -> " % (
                i, n, kind, rec.get("offset", offset), self.window[kind], rec.get("at", "?"), rec.get("agent_step", "-"))
            if rec["ok"]:
                print(line + "%s (converged %.0f s after the cut) OK" % (rec["outcome"], rec["converge_s"]), flush=True)
            else:
                failed += 1
                print(line + "FAIL: %s" % rec["error"], flush=True)
                diagnose(self.lab)
                try:
                    self.mode.wait_agent(600)
                except Fail as e:
                    print("the agent does not come back (%s): the soak stops here" % e, flush=True)
                    break
        return failed

    def serve(self):
        """After the last cut the agent still serves: an uncut AgentUpgrade completes."""
        print("---- serve: an uncut AgentUpgrade after the last cut", flush=True)
        rec = self.run_one("upgrade", "soak-serve")
        rec["serve"] = True
        self.log(rec)
        print(("PASS serve: %s; %s" % (rec["outcome"], rec["layout"])) if rec["ok"] else "FAIL serve: %s" % rec["error"],
              flush=True)
        return rec["ok"]

    def summary(self):
        cuts = [r for r in self.results if "cut" in r]
        by = {}
        for r in cuts:
            k = by.setdefault(r["kind"], {"cuts": 0, "ok": 0, "in flight": 0, "before the claim": 0, "after completion": 0})
            k["cuts"] += 1
            k["ok"] += 1 if r["ok"] else 0
            if r.get("at") in k:
                k[r["at"]] += 1
        for kind, k in sorted(by.items()):
            print("summary %s %s: %d cuts, %d converged (%d in flight, %d before the claim, %d after completion)"
                  % (self.mode.name, kind, k["cuts"], k["ok"], k["in flight"], k["before the claim"], k["after completion"]),
                  flush=True)
        return by


def diagnose(lab):
    show_guest(lab, "journalctl --no-pager -o short-precise -b 0 -n 40 -u 'flexnode*'; "
               "for m in kube1 kube2; do echo $m $(systemctl is-active systemd-nspawn@$m); done", last=50)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lab")
    ap.add_argument("--check", action="store_true", help="check the arguments only (before a lab is brought up)")
    ap.add_argument("--mode", choices=("host", "container"), required=True)
    ap.add_argument("--cuts", type=int, required=True)
    ap.add_argument("--seed", type=int)
    ap.add_argument("--kinds", default=",".join(KINDS))
    ap.add_argument("--record")
    ap.add_argument("--joined", action="store_true",
                    help="the node is joined already (a lab kept up with `e2e/run lab --qemu`): no join")
    a = ap.parse_args()
    kinds = [k for k in a.kinds.split(",") if k]
    bad = set(kinds) - set(KINDS)
    if bad or not kinds:
        ap.error("--kinds: one or more of %s (got %s)" % (",".join(KINDS), a.kinds))
    if a.cuts < 1:
        ap.error("--cuts must be at least 1")
    if a.check:
        return 0
    if not a.lab:
        ap.error("--lab is required")
    seed = a.seed if a.seed is not None else int.from_bytes(os.urandom(4), "big")
    cache = os.environ.get("FLEXNODE_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "flexnode")
    record = a.record or os.path.join(cache, "soak", "%s-%s-seed%d.jsonl" % (a.mode, time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()), seed))
    os.makedirs(os.path.dirname(os.path.abspath(record)), exist_ok=True)

    def on_term(signum, _frame):
        raise KeyboardInterrupt("signal %d" % signum)
    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)

    mode = (HostMode if a.mode == "host" else ContainerMode)(a.lab)
    soak = Soak(mode, random.Random(seed), record, seed)
    print("soak: mode %s, seed %d, %d cuts over %s; record %s" % (a.mode, seed, a.cuts, ",".join(kinds), record), flush=True)
    t0 = time.time()
    for w in (mode.suite.watch, soak.mwatch):
        w.start()
        if not w.listed.wait(60):
            sys.exit("soak: a watch could not list")
    rc = 1
    try:
        print("---- join" + (" (skipped: --joined)" if a.joined else ""), flush=True)
        try:
            if a.joined:
                mode.wait_agent(300)
            else:
                mode.join()
        except Fail as e:
            print("FAIL join: %s" % e, flush=True)
            diagnose(mode.lab)
            return 1
        failed = soak.cuts(a.cuts, kinds)
        served = soak.serve()
        gaps = mode.suite.watch.gaps + soak.mwatch.gaps
        if gaps:
            print("FAIL the watches lost events: %s" % gaps, flush=True)
        soak.summary()
        rc = 0 if failed == 0 and served and not gaps else 1
        print("soak %s: seed %d, %d cuts, %d failed, serve %s, in %.0f s; record %s"
              % (a.mode, seed, a.cuts, failed, "ok" if served else "FAILED", time.time() - t0, record), flush=True)
    except KeyboardInterrupt:
        print("interrupted", flush=True)
    finally:
        mode.suite.watch.stop()
        soak.mwatch.stop()
        mode.lab.drop_ssh()
    return rc


if __name__ == "__main__":
    sys.exit(main())
