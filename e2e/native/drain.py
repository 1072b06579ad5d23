"""e2e/native/drain.py — the native suite's checks of drains (issue 32): a Deployment of three
replicas under a PodDisruptionBudget of minAvailable 2, spread over the three nodes; a NodeReboot
evicts its node's replica, which is Ready elsewhere before the machine restarts; a budget that
can never be met fails the operation at its drain timeout, nothing restarted; an agent killed
during a drain resumes it and restarts the machine once; a rollout over every node never takes
the workload below its budget; an operator's cordon outlives an operation. A watcher reads the
workload's pods and budget twice a second throughout. Mixed into e2e/native/suite.py's Suite;
Python 3 stdlib only."""

import json
import subprocess
import threading
import time

from lab import Fail, detail, need, parse_time, wait_until

APP = "budgeted"
MIN_AVAILABLE = 2
MARK = "flexnode.io/cordoned-by"


class BudgetWatch(threading.Thread):
    """Twice a second: how many of the workload's pods are Ready (not being deleted), and the
    budget's disruptionsAllowed; the fewest Ready seen, and when each pod was first seen Ready
    on its node."""

    def __init__(self, lab):
        super().__init__(daemon=True)
        self.lab = lab
        self.stop = threading.Event()
        self.fewest = None
        self.samples = 0
        self.ready_at = {}
        self.lock = threading.Lock()

    def run(self):
        while not self.stop.is_set():
            try:
                pods = self.lab.kube_json("get", "pods", "-l", "app=" + APP)["items"]
            except Fail:
                time.sleep(0.5)
                continue
            ready = 0
            now = time.time()
            for p in pods:
                if p["metadata"].get("deletionTimestamp"):
                    continue
                cond = [c for c in p.get("status", {}).get("conditions") or [] if c["type"] == "Ready"]
                if cond and cond[0]["status"] == "True":
                    ready += 1
                    with self.lock:
                        self.ready_at.setdefault(p["metadata"]["uid"], (p["spec"].get("nodeName"), now))
            with self.lock:
                self.samples += 1
                self.fewest = ready if self.fewest is None else min(self.fewest, ready)
            time.sleep(0.5)

    def result(self):
        self.stop.set()
        self.join(10)
        need(self.samples > 0, "the budget watch read nothing")
        return self.fewest, self.samples


class DrainChecks:
    def workload(self, min_available=MIN_AVAILABLE):
        """The Deployment (busybox httpd, three replicas preferring distinct nodes) and its
        budget, applied; returns its pods by node once all three are Ready."""
        lab = self.lab
        deployment = {
            "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": APP},
            "spec": {"replicas": 3, "selector": {"matchLabels": {"app": APP}},
                     "template": {"metadata": {"labels": {"app": APP}}, "spec": {
                         "terminationGracePeriodSeconds": 5,
                         "affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{
                             "weight": 100, "podAffinityTerm": {
                                 "labelSelector": {"matchLabels": {"app": APP}},
                                 "topologyKey": "kubernetes.io/hostname"}}]}},
                         "containers": [{"name": "web", "image": lab.busybox, "command": [
                             "/bin/busybox", "sh", "-c",
                             "/bin/busybox httpd -f -p 8080 -h / & trap 'kill $!; exit 0' TERM; wait"],
                             "readinessProbe": {"tcpSocket": {"port": 8080}, "periodSeconds": 1}}]}}}}
        self.budget(min_available, deployment)
        return self.spread()

    def budget(self, min_available, deployment=None):
        items = [deployment] if deployment else []
        items.append({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": APP},
                      "spec": {"minAvailable": min_available, "selector": {"matchLabels": {"app": APP}}}})
        rc, _, err = self.lab.kubectl("apply", "-f", "-", inp=json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
        need(rc == 0, "kubectl apply %s: %s" % (APP, err.strip()))
        def settled():
            b = self.lab.kube_json("get", "pdb", APP)
            s = b.get("status") or {}
            return s if s.get("observedGeneration") == b["metadata"]["generation"] and s.get("currentHealthy") == 3 else None
        return wait_until("the budget counting three healthy pods", settled, 120, 1)

    def spread(self):
        """{node: [pod]} of the workload's Ready pods, once there are three, one per node. A
        node left with two (its neighbour's replica moved there by a drain) gives one up: its
        replacement prefers the node without one."""
        def probe():
            by_node, settling = {}, False
            for p in self.lab.kube_json("get", "pods", "-l", "app=" + APP)["items"]:
                ready = [c for c in p.get("status", {}).get("conditions") or [] if c["type"] == "Ready"]
                if not p["metadata"].get("deletionTimestamp") and ready and ready[0]["status"] == "True":
                    by_node.setdefault(p["spec"]["nodeName"], []).append(p)
                else:
                    settling = True
            if sum(len(v) for v in by_node.values()) == 3 and len(by_node) == 3:
                return by_node
            crowded = [ps for ps in by_node.values() if len(ps) > 1]
            if crowded and not settling:
                self.lab.kubectl("delete", "pod", crowded[0][0]["metadata"]["name"], "--wait=false")
            return None
        return wait_until("three Ready replicas, one per node", probe, 180, 1)

    def reboot(self, name, node, *flags):
        self.created.append(name)
        p = subprocess.run([self.lab.flexnode, "op", "--kubeconfig", self.lab.kubeconfig, "create", "reboot",
                            "--node", node, "--name", name, *flags], capture_output=True, text=True, timeout=60)
        need(p.returncode == 0, "flexnode op create reboot %s: %s" % (name, (p.stderr or p.stdout).strip()))

    def kube_proxy(self, node):
        """(uid, restartCount) of NODE's kube-proxy pod: a DaemonSet's, which a drain leaves."""
        pods = [p for p in self.lab.kube_json("get", "pods", "-n", "kube-system", "-l", "k8s-app=kube-proxy")["items"]
                if p["spec"].get("nodeName") == node]
        need(len(pods) == 1, "%s runs %d kube-proxy pods" % (node, len(pods)))
        st = (pods[0]["status"].get("containerStatuses") or [{}])[0]
        return pods[0]["metadata"]["uid"], st.get("restartCount", 0)

    def cordon(self, node):
        """(unschedulable, the drain's mark) of NODE."""
        n = self.lab.kube_json("get", "node", node)
        return bool(n["spec"].get("unschedulable")), (n["metadata"].get("annotations") or {}).get(MARK)

    def restarted_at(self, node, op):
        """When NODE's agent went from the drain to the machine's restart for OP (its journal)."""
        out = self.lab.node_sh(node, "/opt/flexnode/bin/flexnode history -o json")
        entries = json.loads(out)["entries"]
        at = [e["at"] for e in entries if "Restarting" in e["to"] and "Draining" in e["from"]]
        need(at, "%s's journal shows no step from the drain to the restart: %s" % (node, [e["to"] for e in entries][-6:]))
        return parse_time(at[-1]) if isinstance(at[-1], str) else at[-1] / 1000.0

    def c_drain_reboot(self):
        """A NodeReboot of a node running one replica: the Node cordoned with the agent's mark,
        the replica evicted and Ready on another node before the machine restarts, kube-proxy
        (a DaemonSet's pod) left and restarted with the machine, never fewer than 2 Ready, the
        Node uncordoned after. The suite's pods bound to their nodes go first: no controller
        would make them again, so a cautious drain refuses them."""
        lab = self.lab
        rc, _, err = lab.kubectl("delete", "pods", "-l", "app=flexnode-native-suite", "--wait=true", timeout=120)
        need(rc == 0, "deleting the suite's bound pods: %s" % err.strip())
        by_node = self.workload()
        node = "node-2"
        before = by_node[node][0]
        proxy = self.kube_proxy(node)
        watch = BudgetWatch(lab)
        watch.start()
        name = "native-suite-drain-reboot"
        t = time.time()
        self.reboot(name, node)
        seen = wait_until("%s cordoned with the agent's mark" % node,
                          lambda: (lambda c: c if c[0] and c[1] else None)(self.cordon(node)), 60, 0.5)
        v = self.expect(name, "Complete", "Succeeded", 300, "NodeReboot completed")
        took = time.time() - t
        fewest, samples = watch.result()
        need(fewest >= MIN_AVAILABLE, "only %d replicas were Ready at one point" % fewest)
        restart = self.restarted_at(node, name)
        with watch.lock:
            elsewhere = [(n, at) for uid, (n, at) in watch.ready_at.items()
                         if n != node and uid not in {p["metadata"]["uid"] for ps in by_node.values() for p in ps}]
        need(elsewhere, "no replacement replica became Ready on another node")
        first = min(at for _, at in elsewhere)
        need(first <= restart, "the replacement was Ready %.1f s after the machine's restart began" % (first - restart))
        gone = [p for p in lab.kube_json("get", "pods", "-l", "app=" + APP)["items"]
                if p["metadata"]["uid"] == before["metadata"]["uid"]]
        need(not gone, "%s's replica %s is still there" % (node, before["metadata"]["name"]))
        after = wait_until("%s's kube-proxy restarted with the machine" % node,
                           lambda: (lambda k: k if k[1] > proxy[1] else None)(self.kube_proxy(node)), 120, 1)
        need(after[0] == proxy[0], "%s's kube-proxy pod was replaced (evicted?)" % node)
        need(self.cordon(node) == (False, None), "%s is left %s" % (node, self.cordon(node)))
        detail("%s cordoned (%s), %s evicted, its replacement Ready on %s %.1f s before the restart; "
               "fewest Ready %d over %d samples; kube-proxy kept (restarts %d -> %d); Complete in %.1f s, "
               "uncordoned" % (node, seen[1], before["metadata"]["name"], elsewhere[0][0], restart - first,
                               fewest, samples, proxy[1], after[1], took))

    def c_drain_timeout(self):
        """A budget that can never be met (minAvailable 3 of 3): the NodeReboot fails at its
        20 s drain timeout naming the pod and the budget, the Node uncordoned, the machine not
        restarted."""
        lab = self.lab
        self.budget(3)
        by_node = self.spread()
        node = "node-1"
        proxy = self.kube_proxy(node)
        name = "native-suite-drain-held"
        self.reboot(name, node, "--drain-timeout", "20s")
        v = self.expect(name, "Failed", "ExecutionFailed", 180)
        pod = by_node[node][0]["metadata"]["name"]
        want = "drain timed out after 20s: 1 pod left: default/%s held by budget default/%s" % (pod, APP)
        need(v[2] == want, "%s's message %r, expected %r" % (name, v[2], want))
        need(self.kube_proxy(node) == proxy, "%s's machine restarted after a failed drain" % node)
        need(self.cordon(node) == (False, None), "%s is left %s" % (node, self.cordon(node)))
        need(len(self.spread()) == 3, "a replica left its node")
        detail("Failed %r after %.0f s; nothing restarted, uncordoned"
               % (v[2], parse_time(v[3]) - parse_time(v[4])))

    def c_drain_crash(self):
        """The agent SIGKILLed during a drain held by the budget: its successor resumes the
        drain (the Node still cordoned with the mark), which ends once the budget allows; the
        machine restarts once (kube-proxy's restarts +1), the Node uncordoned."""
        lab = self.lab
        node = "node-3"
        proxy = self.kube_proxy(node)
        name = "native-suite-drain-crash"
        self.reboot(name, node)
        wait_until("%s's drain held by the budget" % name,
                   lambda: "held by budget default/" + APP in ((lab.get_op(name) or {}).get("status") or {}).get("message", ""),
                   90, 1)
        pid = lab.node_sh(node, "systemctl show -P MainPID flexnode-agent").strip()
        lab.node_sh(node, "systemctl kill -s KILL flexnode-agent")
        wait_until("%s's agent started again" % node,
                   lambda: (lambda p: p not in ("0", "", pid))(lab.node_sh(node, "systemctl show -P MainPID flexnode-agent").strip()),
                   60, 1)
        need(self.cordon(node)[1], "%s lost the drain's cordon when its agent died" % node)
        watch = BudgetWatch(lab)
        watch.start()
        self.budget_patch(MIN_AVAILABLE)
        self.expect(name, "Complete", "Succeeded", 300, "NodeReboot completed")
        fewest, _ = watch.result()
        need(fewest >= MIN_AVAILABLE, "only %d replicas were Ready at one point" % fewest)
        after = wait_until("%s's kube-proxy restarted with the machine" % node,
                           lambda: (lambda k: k if k[1] > proxy[1] else None)(self.kube_proxy(node)), 120, 1)
        need(after[1] == proxy[1] + 1, "%s's machine restarted %d times" % (node, after[1] - proxy[1]))
        need(self.cordon(node) == (False, None), "%s is left %s" % (node, self.cordon(node)))
        detail("agent pid %s killed mid-drain; the drain resumed and ended when the budget allowed; "
               "one restart; fewest Ready %d" % (pid, fewest))

    def budget_patch(self, min_available):
        rc, _, err = self.lab.kubectl("patch", "pdb", APP, "--type", "merge", "-p",
                                      json.dumps({"spec": {"minAvailable": min_available}}))
        need(rc == 0, "kubectl patch pdb: %s" % err.strip())

    def c_drain_rollout(self):
        """`flexnode rollout reboot` over the three nodes, one at a time, each drained: every
        operation Complete, never fewer than 2 replicas Ready, every Node uncordoned."""
        lab = self.lab
        self.spread()
        watch = BudgetWatch(lab)
        watch.start()
        name = "native-suite-drained-rollout"
        t = time.time()
        p = subprocess.run([lab.flexnode, "rollout", "--kubeconfig", lab.kubeconfig, "reboot", "--selector",
                            "app.kubernetes.io/managed-by=flexnode", "--max-unavailable", "1", "--name", name,
                            "--wave-timeout", "5m"], capture_output=True, text=True, timeout=1200)
        need(p.returncode == 0, "flexnode rollout: rc %d: %s" % (p.returncode, (p.stderr or p.stdout).strip()[-400:]))
        fewest, samples = watch.result()
        for n in lab.nodes:
            mine = [o for o in self.watch.names() if o.startswith(name + "-" + n + "-")]
            need(len(mine) == 1, "%s got operations %s" % (n, mine))
            self.created.append(mine[0])
            phases = [row[1] for row in self.watch.history(mine[0])]
            need(phases and phases[-1] == "Complete", "%s's %s went %s" % (n, mine[0], phases))
            need(self.cordon(n) == (False, None), "%s is left %s" % (n, self.cordon(n)))
        need(fewest >= MIN_AVAILABLE, "only %d replicas were Ready at one point" % fewest)
        detail("three drained reboots in %.0f s; fewest Ready %d over %d samples" % (time.time() - t, fewest, samples))

    def c_operator_cordon(self):
        """An operator's cordon (no mark) outlives a drained NodeReboot of its node."""
        lab = self.lab
        node = "node-3"
        rc, _, err = lab.kubectl("cordon", node)
        need(rc == 0, "kubectl cordon: %s" % err.strip())
        try:
            name = "native-suite-drain-cordoned"
            self.reboot(name, node)
            self.expect(name, "Complete", "Succeeded", 300, "NodeReboot completed")
            need(self.cordon(node) == (True, None), "%s's cordon is %s after the operation" % (node, self.cordon(node)))
        finally:
            lab.kubectl("uncordon", node)
        detail("%s still cordoned by the operator after its NodeReboot" % node)
