"""e2e/host/node_checks.py — what both install suites check of the Kubernetes node the join
made: the kubelet's Node, a pod, NodeReboot, repave (and its rollback), the deletion signal's
halves. A mixin of the suites' `Suite` classes (beside `lab.SuiteBase`, whose helpers it uses:
`create`, `expect`, `self.lab`). Python 3 stdlib only.
"""

import json
import time

from lab import Fail, detail, need, parse_time, show_guest, wait_until

# The pod the suites run on the node (c_pod_runs).
POD = "flexnode-hello"


def condition(obj, kind):
    """The condition of type `kind` in an object's status (empty when there is none)."""
    for c in ((obj or {}).get("status") or {}).get("conditions") or []:
        if c.get("type") == kind:
            return c
    return {}


def container_status(p):
    """The status of a pod's (first) container; empty when it has none yet."""
    return (((p or {}).get("status") or {}).get("containerStatuses") or [{}])[0]


def pod_state(p):
    """A pod's state in one line: phase, conditions not true, its container's state."""
    st = p.get("status") or {}
    conds = ",".join(c.get("type", "?") for c in st.get("conditions") or [] if c.get("status") != "True")
    cs = container_status(p)
    return "phase %s, not %s, container %s restarts %s" % (
        st.get("phase"), conds or "-", json.dumps(cs.get("state"), sort_keys=True), cs.get("restartCount"))


def node_context(lab):
    """A failed node check's context: the pod's events and the kubelet's last lines (the
    active side's journal, read from the host); never fails."""
    try:
        _, out, _ = lab.kubectl("get", "events", "--field-selector", "involvedObject.name=%s" % POD,
                                "--sort-by", ".lastTimestamp")
        for line in out.splitlines()[-15:]:
            print("    | " + line, flush=True)
    except Exception as e:  # noqa: BLE001 - diagnostics must never fail the run
        print("    | (no pod events: %s)" % e, flush=True)
    show_guest(lab, "for m in kube1 kube2; do [ \"$(machinectl show $m -p State --value 2>/dev/null)\" = running ] && "
               "echo \"== $m\" && journalctl -M $m -u kubelet -u containerd --no-pager -o short-precise -n 200 | "
               "grep -Ev 'loading plugin|signal loop|cleaning up|cleanup warnings|Observed|reflector' | tail -40; done",
               last=45)


class NodeChecks:
    def node(self):
        """The Node object as the API server has it, or None."""
        rc, out, _ = self.lab.kubectl("get", "node", self.lab.node, "-o", "json")
        return json.loads(out) if rc == 0 else None

    def node_ready(self, timeout, since=None):
        """The Node once its kubelet reports it Ready (with `since`, in a heartbeat at or after
        that unix time: a Ready from before a restart does not count)."""
        def ready():
            n = self.node()
            r = condition(n, "Ready")
            if r.get("status") != "True":
                return None
            if since is not None and (parse_time(r.get("lastHeartbeatTime")) or 0) < since:
                return None
            return n
        return wait_until("Node %s Ready" % self.lab.node, ready, timeout, 3)

    def node_boot_id(self):
        return (((self.node() or {}).get("status") or {}).get("nodeInfo") or {}).get("bootID")

    def kubelet_rebooted(self, boot_id, since):
        """After a machine restart at unix time `since`: the Node reports a new boot ID, the
        kubelet recorded its `Rebooted` Event, the Node is Ready in a heartbeat since, and the
        suite's pod runs again."""
        n = self.node_ready(300, since)
        new = ((n.get("status") or {}).get("nodeInfo") or {}).get("bootID")
        need(new and new != boot_id, "the Node's bootID %r did not change" % new)
        def event():
            rc, out, _ = self.lab.kubectl("get", "events", "-A", "-o", "json", "--field-selector",
                                          "involvedObject.kind=Node,involvedObject.name=%s,reason=Rebooted" % self.lab.node)
            items = json.loads(out).get("items", []) if rc == 0 else []
            return [e for e in items if (parse_time(e.get("lastTimestamp") or e.get("eventTime")) or 0) >= since - 1] or None
        wait_until("the kubelet's Rebooted Event", event, 120, 3)
        self.pod_running_since(since)
        return new

    def pod_running_since(self, since, timeout=300):
        """The suite's pod runs in a container started at or after unix time `since`."""
        def back():
            p = self.pod()
            need(p, "no pod %s" % POD)
            started = ((container_status(p).get("state") or {}).get("running") or {}).get("startedAt")
            need(started and parse_time(started) >= since - 1, pod_state(p))
            return p
        return wait_until("pod %s running again" % POD, back, timeout, 3)

    def pod(self):
        """The suite's pod as the API server has it, or None."""
        rc, out, _ = self.lab.kubectl("get", "pod", POD, "-o", "json")
        return json.loads(out) if rc == 0 else None

    def pod_container(self):
        """(container ID, startedAt, restartCount) of the suite's pod, or None."""
        p = self.pod()
        if not p:
            return None
        cs = container_status(p)
        return (cs.get("containerID"), ((cs.get("state") or {}).get("running") or {}).get("startedAt"),
                cs.get("restartCount"))

    def pods_untouched(self, before, what):
        """The suite's pod still runs its container `before` (the kubelet was not restarted)."""
        after = self.pod_container()
        need(before and before[1] and after == before,
             "the pod's container changed across %s: %s -> %s" % (what, before, after))

    def drift_and_delete_node(self, label, version=None):
        """What permits a repave: the Machine's spec edited (a new generation, returned; its
        Kubernetes version too when given) and the Node deleted."""
        lab = self.lab
        spec = {"nodeLabels": {"flexnode.io/repave": label}}
        if version:
            spec["version"] = version
        patch = json.dumps({"spec": {"kubernetes": spec}})
        rc, out, err = lab.kubectl("patch", "machines", lab.node, "--type", "merge", "-p", patch, "-o", "json")
        need(rc == 0, "kubectl patch machine: %s" % err.strip())
        rc, _, err = lab.kubectl("delete", "node", lab.node, "--wait=true", timeout=120)
        need(rc == 0, "kubectl delete node: %s" % err.strip())
        return json.loads(out)["metadata"]["generation"]

    def repave(self, to, label):
        """The Machine's goal changes (a spec edit: a new generation; the control plane's
        Kubernetes version when the node runs another, as the host lab's joins at the
        previous minor) and the Node is deleted: the agent provisions `to` from the goal
        version's node image, stops the active side, starts `to`, waits for its kubelet,
        retires the old side. Its new kubelet is the same Node (its client certificate
        carried over) at the goal's version, Ready in a heartbeat since; the Machine says
        `machine goal state applied` for the new generation."""
        lab = self.lab
        frm = (lab.status_json().get("node") or {}).get("activeSide")
        need(frm and frm != to, "active side %r before a repave to %s" % (frm, to))
        want = lab.st["K8S_VERSION"]
        was = ((self.node_ready(120).get("status") or {}).get("nodeInfo") or {}).get("kubeletVersion")
        since = int(time.time()) - 1
        t = time.time()
        gen = self.drift_and_delete_node(label, want if was != want else None)

        def applied():
            st = lab.status_json()
            node = st.get("node") or {}
            return st if (st.get("phase") == "Ready" and node.get("activeSide") == to
                          and node.get("appliedGeneration") == gen) else None
        wait_until("flexnode status: Ready on %s at generation %d" % (to, gen), applied, 900, 5)
        n = self.node_ready(300, since)
        upd = condition(lab.machine(), "NodeUpdated")
        need(upd.get("message") == "machine goal state applied" and upd.get("observedGeneration") == gen,
             "Machine NodeUpdated: %s" % upd)
        out = lab.sh("systemctl is-active systemd-nspawn@%s || true; systemctl is-active systemd-nspawn@%s || true; "
                     "test -e /var/lib/machines/%s && echo left || echo gone" % (to, frm, frm))
        need(out.split() == ["active", "inactive", "gone"], "after the repave: %s %s, %s tree: %r" % (to, frm, frm, out))
        info = (n.get("status") or {}).get("nodeInfo") or {}
        need(info.get("kubeletVersion") == want, "after the repave the Node's kubelet is %r, not %r" % (info.get("kubeletVersion"), want))
        st = lab.status_json()
        need((st.get("node") or {}).get("appliedKubernetesVersion") == want, "flexnode status after the repave: %s" % st.get("node"))
        detail("repave %s -> %s at generation %d: kubelet %s -> %s, Node Ready (bootID %s) %.0f s after the Node was deleted"
               % (frm, to, gen, was, want, info.get("bootID"), time.time() - t))

    def c_repave_rolls_back(self):
        """A repave whose new side cannot start (kube2's unit fails: a drop-in the check adds
        under /run) rolls back by itself: kube1 runs again, the Node is Ready on it, the
        Machine says the repave failed and was rolled back, the applied goal is unchanged (so a
        later repave, after the next Node deletion, tries again)."""
        lab = self.lab
        st0 = lab.status_json()
        node0 = st0.get("node") or {}
        need(node0.get("activeSide") == "kube1", "active side %r" % node0.get("activeSide"))
        broken = "/run/systemd/system/systemd-nspawn@kube2.service.d"
        lab.sh("mkdir -p %s && printf '[Service]\\nExecStartPre=/bin/false\\n' > %s/zz-e2e-broken.conf && "
               "systemctl daemon-reload" % (broken, broken))
        try:
            since = int(time.time()) - 1
            self.drift_and_delete_node("broken")

            def rolled_back():
                msg = condition(lab.machine(), "NodeUpdated").get("message") or ""
                return msg if msg.startswith("repave to kube2 failed and was rolled back") else None
            msg = wait_until("the Machine's account of the rollback", rolled_back, 900, 5)
            n = self.node_ready(300, since)
            st = lab.status_json()
            node = st.get("node") or {}
            need(st.get("phase") == "Ready" and node.get("activeSide") == "kube1"
                 and node.get("appliedGeneration") == node0.get("appliedGeneration"),
                 "after the rollback flexnode status: %s %s" % (st.get("phase"), node))
            out = lab.sh("systemctl is-active systemd-nspawn@kube1 || true; systemctl is-active systemd-nspawn@kube2 || true")
            need(out.split() == ["active", "inactive"], "after the rollback kube1/kube2: %r" % out)
            detail("%s; Node Ready again on kube1 (bootID %s)" % (msg[:160], ((n.get("status") or {}).get("nodeInfo") or {}).get("bootID")))
        finally:
            lab.sh("rm -rf %s; systemctl daemon-reload; systemctl reset-failed systemd-nspawn@kube2 || true" % broken)

    def c_repave(self):
        self.repave("kube2", "first")

    def c_repave_back_without_the_token(self):
        """The bootstrap token is deleted from the cluster (expired tokens are, by the token
        cleaner): a repave back to kube1 still works, its kubelet being the same Node by the
        client certificate the running side holds."""
        lab = self.lab
        rc, _, err = lab.kubectl("-n", "kube-system", "delete", "secret", "bootstrap-token-%s" % lab.st["BOOTSTRAP_TOKEN_ID"])
        need(rc == 0, "deleting the bootstrap token: %s" % err.strip())
        self.repave("kube1", "back")

    def c_deletion_signal(self):
        """The deletion signal (the Node tainted for deletion and its Machine gone) resets
        the node: nothing left (the next check starts from the reset node)."""
        lab = self.lab
        rc, _, err = lab.kubectl("taint", "nodes", lab.node, "kubernetes.azure.com/flex-node-deleting=true:NoSchedule")
        need(rc == 0, "kubectl taint: %s" % err.strip())
        try:
            rc, _, err = lab.kubectl("delete", "machines", lab.node, "--wait=false")
            need(rc == 0, "kubectl delete machine: %s" % err.strip())
            self.reset_leaves_nothing("the deletion signal")
        finally:
            lab.kubectl("taint", "nodes", lab.node, "kubernetes.azure.com/flex-node-deleting-")

    def guest_now(self):
        return int(self.lab.sh("date +%s").strip())

    def goal_observed(self, since, what, timeout=180):
        """The daemon's journal lines (since the guest's unix time `since`) saying it
        observed `what` and what it decided: the positive signal before a check that nothing
        happened. By time, not by journal cursor: an `--after-cursor` read with `-u` missed
        the line once, where no entry came between the cursor's and it."""
        def seen():
            out = self.lab.sh("journalctl --no-pager --since @%d -u flexnode-agent -o cat" % since)
            return [l for l in out.splitlines() if "goal observed" in l and what in l] or None
        return wait_until("the daemon's 'goal observed (%s)' journal line" % what, seen, timeout, 3)

    def untouched_since(self, before, what):
        """The node as `node_snapshot` saw it `before`: the same phase, side, agent process,
        machine process, and the pod's container when it ran then."""
        after = self.node_snapshot()
        if not (before[3] and before[3][1]):
            before, after = before[:3], after[:3]
        need(after == before, "%s changed the node: %s -> %s" % (what, before, after))

    def settled_snapshot(self):
        """`node_snapshot` once the pod runs, if it does within 2 minutes: after a re-join or
        a repave its new sandbox may wait out the kubelet's backoff (up to 5 minutes), and a
        pod between restarts is not compared."""
        try:
            wait_until("the pod's container running", lambda: (lambda c: c if c and c[1] else None)(self.pod_container()), 120, 3)
        except Fail:
            detail("the pod is not running: its container is not compared")
        return self.node_snapshot()

    def node_snapshot(self):
        """(phase, active side, agent and machine MainPIDs, the pod's container)."""
        st = self.lab.status_json()
        side = (st.get("node") or {}).get("activeSide")
        out = self.lab.sh("systemctl show -P MainPID flexnode-agent; systemctl show -P MainPID systemd-nspawn@%s" % side)
        return (st.get("phase"), side, out.split(), self.pod_container())

    def c_deletion_signal_halves(self):
        """Half of the deletion signal changes nothing: the Node's deletion taint while the
        Machine exists, then the Machine deleted while the Node is untainted. The daemon says
        it saw each (its journal), then the node is as it was: phase, side, agent and machine
        processes, the pod's container. The Machine is created again afterwards."""
        lab = self.lab
        before = self.settled_snapshot()
        need(before[0] == "Ready", "the node is %s, not Ready" % before[0])
        taint = "kubernetes.azure.com/flex-node-deleting=true:NoSchedule"
        since = self.guest_now()
        rc, _, err = lab.kubectl("taint", "nodes", lab.node, taint)
        need(rc == 0, "kubectl taint: %s" % err.strip())
        try:
            seen = self.goal_observed(since, "node tainted for deletion, machine generation")
            self.untouched_since(before, "the taint alone")
        finally:
            lab.kubectl("taint", "nodes", lab.node, "kubernetes.azure.com/flex-node-deleting-")
        m = lab.machine()
        need(m, "no Machine %s" % lab.node)
        since = self.guest_now()
        rc, _, err = lab.kubectl("delete", "machines", lab.node, "--wait=true", timeout=120)
        need(rc == 0, "kubectl delete machine: %s" % err.strip())
        try:
            seen += self.goal_observed(since, "node present, machine missing")
            self.untouched_since(before, "the Machine's deletion alone")
        finally:
            again = {"apiVersion": m["apiVersion"], "kind": m["kind"],
                     "metadata": {"name": lab.node, "labels": (m.get("metadata") or {}).get("labels") or {}},
                     "spec": m.get("spec") or {}}
            rc, _, err = lab.kubectl("create", "-f", "-", inp=json.dumps(again))
            need(rc == 0, "creating the Machine again: %s" % err.strip())
        detail("; ".join(l.split("goal observed", 1)[-1].strip()[:140] for l in seen))

    def c_pod_runs(self):
        """The join made a real node: the kubelet in machine kube1 (unpacked from the node
        image the config names by digest) registered the Node itself (no lab creates it), at
        the join's version, Ready; a pod of the lab registry's busybox (pulled by the
        machine's containerd with the registry's CA and credentials, on a sandbox of the
        lab's pause image) runs, and `kubectl logs` and `kubectl exec` reach the kubelet
        through the API server."""
        lab = self.lab
        n = self.node_ready(300)
        info = (n.get("status") or {}).get("nodeInfo") or {}
        want = lab.st["JOIN_VERSION"]
        need(info.get("kubeletVersion") == want, "the Node's kubelet is %r, not %r" % (info.get("kubeletVersion"), want))
        need(info.get("containerRuntimeVersion", "").startswith("containerd://"),
             "runtime %r" % info.get("containerRuntimeVersion"))
        st = self.lab.status_json()
        need(((st.get("kubelet") or {}).get("ready")) == "True", "flexnode status shows the kubelet as %s" % st.get("kubelet"))
        need((st.get("node") or {}).get("activeSide") == "kube1", "flexnode status: active side %s" % st.get("node"))
        image = "%s/flexnode/busybox@%s" % (lab.st["GUEST_REG"], lab.st["BUSYBOX_IMAGE"])
        manifest = json.dumps({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": POD, "namespace": "default"},
            "spec": {"automountServiceAccountToken": False, "terminationGracePeriodSeconds": 2,
                     "containers": [{"name": "hello", "image": image,
                                     # PID 1 of its container: TERM is handled, so a
                                     # machine stops without waiting out its timeout
                                     "args": ["sh", "-c", "echo hello from $(hostname); "
                                              "trap 'exit 0' TERM; while :; do sleep 1; done"]}]}})
        t = time.time()
        rc, out, err = lab.kubectl("apply", "-f", "-", inp=manifest)
        need(rc == 0, "kubectl apply pod: %s" % err.strip())
        def running():
            p = self.pod() or {}
            return p if (p.get("status") or {}).get("phase") == "Running" else None
        p = wait_until("pod %s Running" % POD, running, 600, 3)
        need((p.get("spec") or {}).get("nodeName") == lab.node, "the pod runs on %r" % (p.get("spec") or {}).get("nodeName"))
        ran = time.time() - t
        rc, logs, err = lab.kubectl("logs", POD)
        need(rc == 0 and "hello from %s" % POD in logs, "kubectl logs: rc %d %r %s" % (rc, logs, err.strip()))
        rc, out, err = lab.kubectl("exec", POD, "--", "busybox", "echo", "exec-ok")
        need(rc == 0 and out.strip() == "exec-ok", "kubectl exec: rc %d %r %s" % (rc, out, err.strip()))
        detail("Node %s Ready (kubelet %s, %s); pod Running %.0f s after it was created; logs and exec reach the kubelet"
               % (lab.node, info.get("kubeletVersion"), info.get("containerRuntimeVersion"), ran))
