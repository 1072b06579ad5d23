#!/usr/bin/env python3
"""e2e/native/suite.py — the native multi-node suite, run by `e2e/native/lab suite` in a fresh
lab of three nodes.

  suite.py --lab DIR [--only a,b,...] [--list]

DIR is a lab `e2e/native/lab up` brought up (its `state` file names the nodes, the control
plane, the binaries). Each named check prints `PASS name (1.2 s)` or `FAIL name (1.2 s):
reason`; the run ends with `N passed, M failed, K not run in T s` and exits 1 if any check
failed (the harness of e2e/host/lab.py). Checks assert what the API and the nodes show:
Nodes, their pod ranges and pods (kubectl with the admin kubeconfig), MachineOperations
(recorded by the operation watch from the start), each node's `flexnode status -o json` and
its machine's files. Python 3 stdlib only.
"""

import ipaddress
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "host"))

from lab import (NATIVE, Fail, Lab, SuiteBase, detail, need, parse_time, read_state, run_suite,  # noqa: E402
                 wait_until)

POD_LABEL = "flexnode-native-suite"
SELECTOR = "app.kubernetes.io/managed-by=flexnode"


class NativeLab:
    """The lab as the checks see it: the admin's kubectl and flexnode, and a shell on each
    node (nsenter into the node's namespaces by `e2e/native/run exec`)."""

    def __init__(self, d):
        self.dir = d
        self.st = st = read_state(d)
        self.nodes = ["node-%d" % i for i in range(1, int(st["NODES"]) + 1)]
        self.kubectl_bin = st["KUBECTL"]
        self.kubeconfig = st["KUBECONFIG"]
        self.flexnode = st["FLEXNODE_BIN"]
        self.recorder = st["RECORDER_BIN"]
        self.cp_dir = st["CP_DIR"]
        self.k8s_version = st["K8S_VERSION"]
        self.join_version = st["JOIN_VERSION"]
        self.lab_script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "lab")
        self.busybox = "10.0.2.100:5000/flexnode/busybox@" + st["BUSYBOX_IMAGE"]
        self.native_run = os.path.join(os.path.dirname(os.path.abspath(__file__)), "run")

    def drop_ssh(self):
        """Nothing to drop: the nodes are reached through their namespaces."""

    # The API side is the QEMU labs': the admin's kubectl, operations and their Events.
    kubectl = Lab.kubectl
    get_op = Lab.get_op
    events_for = Lab.events_for
    op_create = Lab.op_create   # with node=: there is no one node

    def kube_json(self, *args):
        rc, out, err = self.kubectl(*args, "-o", "json")
        need(rc == 0, "kubectl %s: %s" % (" ".join(args), err.strip()))
        return json.loads(out)

    def node_sh(self, node, script, timeout=120):
        """stdout of a root shell script on NODE, run under `set -e`."""
        p = subprocess.run([self.native_run, "exec", node, "sh", "-c", "set -e\n" + script],
                           capture_output=True, text=True, timeout=timeout)
        if p.returncode != 0:
            raise Fail("%s: command failed (rc %d): %s: %s"
                       % (node, p.returncode, script[:120], (p.stderr or p.stdout).strip()[-400:]))
        return p.stdout


class Suite(SuiteBase):
    def pods(self):
        return {p["spec"]["nodeName"]: p for p in self.lab.kube_json(
            "get", "pods", "-l", "app=" + POD_LABEL)["items"]}

    def ranges(self):
        return {n["metadata"]["name"]: n["spec"].get("podCIDR", "")
                for n in self.lab.kube_json("get", "nodes")["items"]}

    def pods_running(self, timeout=120):
        def probe():
            pods = self.pods()
            ok = all(pods.get(n, {}).get("status", {}).get("phase") == "Running"
                     and pods[n]["status"].get("podIP") for n in self.lab.nodes)
            return pods if ok else None
        return wait_until("a pod Running on every node", probe, timeout, 1)

    def c_join(self):
        lab = self.lab
        nodes = {n["metadata"]["name"]: n for n in lab.kube_json("get", "nodes")["items"]}
        need(sorted(nodes) == lab.nodes, "the Nodes are %s, not %s" % (sorted(nodes), lab.nodes))
        for name in lab.nodes:
            n = nodes[name]
            ready = [c for c in n["status"]["conditions"] if c["type"] == "Ready"]
            need(ready and ready[0]["status"] == "True", "%s is not Ready: %s" % (name, ready))
            need(n["status"]["nodeInfo"]["kubeletVersion"] == lab.join_version,
                 "%s runs kubelet %s" % (name, n["status"]["nodeInfo"]["kubeletVersion"]))
            addr = [a["address"] for a in n["status"]["addresses"] if a["type"] == "InternalIP"]
            need(addr == ["10.0.2.%d" % (10 + int(name.split("-")[1]))],
                 "%s's InternalIP is %s, not its bridge address" % (name, addr))
            m = lab.kube_json("get", "machines", name)
            need(m.get("status", {}).get("phase") == "Ready", "Machine %s is %s" % (name, m.get("status")))
            st = json.loads(lab.node_sh(name, "/opt/flexnode/bin/flexnode status -o json"))
            need(st.get("phase") == "Ready", "%s: flexnode status phase %s" % (name, st.get("phase")))
            need(lab.node_sh(name, "systemctl is-active flexnode-agent").strip() == "active",
                 "%s: flexnode-agent is not active" % name)
            kube1 = lab.node_sh(name, "machinectl show kube1 -p State --value").strip()
            need(kube1 == "running", "%s: machine kube1 is %r" % (name, kube1))
        detail("3 Nodes Ready at %s, Machines Ready, agents active, kube1 running" % lab.join_version)

    def c_token_join(self):
        """Each node joined from the API server's URL and CA and a bootstrap token bound to it
        alone (e2e/native/lab: no certificate minted with the cluster's CA key): one CSR per
        node, sent by its token, approved by `flexnode approver` for that binding; the
        agent's kubeconfig (0600) holds the certificate it issued; the token's secret in no
        journal, log, command line or environment."""
        lab = self.lab
        csrs = lab.kube_json("get", "csr")["items"]
        for name in lab.nodes:
            conf = lab.node_sh(name, "cat /root/join.yaml")
            need("apiServer: https://" in conf and "kubeconfig:" not in conf,
                 "%s's join configuration names a kubeconfig:\n%s" % (name, conf))
            token = lab.node_sh(name, "cat /root/bootstrap-token").strip()
            token_id, secret = token.split(".")
            mine = [c for c in csrs if c["metadata"]["name"].startswith("flexnode-%s-" % name)]
            need(len(mine) == 1, "%s: %d certificate requests" % (name, len(mine)))
            csr = mine[0]
            need(csr["spec"]["username"] == "system:bootstrap:" + token_id,
                 "%s's request was sent by %s" % (name, csr["spec"]["username"]))
            approved = [c for c in csr["status"].get("conditions") or [] if c["type"] == "Approved"]
            need(approved and approved[0].get("reason") == "BoundBootstrapToken",
                 "%s's request: %s" % (name, csr["status"].get("conditions")))
            issued = csr["status"].get("certificate")
            kc = lab.node_sh(name, "stat -c %a /etc/flexnode/kubeconfig; cat /etc/flexnode/kubeconfig")
            mode, _, text = kc.partition("\n")
            need(mode == "600", "%s: /etc/flexnode/kubeconfig is mode %s" % (name, mode))
            need(issued and issued in text, "%s's kubeconfig does not hold its issued certificate" % name)
            # The pattern from a file: no command line here carries the secret either.
            leaks = lab.node_sh(name, "umask 077; cut -d. -f2 /root/bootstrap-token > /run/leak.pat; "
                                      "journalctl --no-pager -o cat | grep -c -F -f /run/leak.pat || true; "
                                      "grep -l -F -f /run/leak.pat /proc/[0-9]*/cmdline "
                                      "/proc/[0-9]*/environ 2>/dev/null | wc -l; rm -f /run/leak.pat").split()
            need(leaks == ["0", "0"], "%s: the token's secret in %s journal lines and %s process "
                 "command lines or environments" % (name, leaks[0], leaks[1]))
            with open(os.path.join(lab.dir, "logs", "join-%s.log" % name)) as f:
                need(secret not in f.read(), "%s's join log holds the token's secret" % name)
            need(secret not in text, "%s's kubeconfig holds the token's secret" % name)
        with open(os.path.join(lab.dir, "logs", "approver.log")) as f:
            approver = f.read()
        need(approver.count("BoundBootstrapToken") >= len(lab.nodes),
             "the approver's log shows %d approvals" % approver.count("BoundBootstrapToken"))
        detail("%d nodes joined with node-bound bootstrap tokens alone: one CSR each, approved "
               "BoundBootstrapToken; no secret in journals, logs or process lines" % len(lab.nodes))

    def c_pod_ranges(self):
        ranges = self.ranges()
        nets = {n: ipaddress.ip_network(r) for n, r in ranges.items() if r}
        need(len(nets) == len(self.lab.nodes), "Nodes without a pod range: %s" % ranges)
        cluster = ipaddress.ip_network("10.244.0.0/16")
        for n, net in nets.items():
            need(net.subnet_of(cluster), "%s's range %s is not in %s" % (n, net, cluster))
            for m, other in nets.items():
                need(m == n or not net.overlaps(other), "%s and %s overlap: %s %s" % (n, m, net, other))
            # containerd rendered the machine's bridge network from flexnode's template.
            conf = json.loads(self.lab.node_sh(
                n, "cat /var/lib/machines/kube1/etc/cni/net.d/10-containerd-net.conflist"))
            subnet = conf["plugins"][0]["ipam"]["ranges"][0][0]["subnet"]
            need(subnet == str(net), "%s's bridge network has range %s, its Node %s" % (n, subnet, net))
        detail("ranges: %s" % ", ".join("%s %s" % kv for kv in sorted(ranges.items())))

    def c_pod_on_every_node(self):
        for i, n in enumerate(self.lab.nodes, 1):
            self.start_pod(i, n)
        self.pods_served()

    def start_pod(self, i, n):
        """Pod web-I on node N: busybox's httpd serving its node's name on 8080, which ends on
        SIGTERM (a PID 1 without a handler would hold its machine's stop for 90 s)."""
        pod = {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "web-%d" % i, "labels": {"app": POD_LABEL, "node": n}},
            "spec": {"nodeName": n, "dnsPolicy": "Default", "terminationGracePeriodSeconds": 5,
                     "containers": [{"name": "web", "image": self.lab.busybox, "command": [
                         "/bin/busybox", "sh", "-c",
                         "mkdir -p /www; echo served-by-%s > /www/index.html; echo up on %s; "
                         "/bin/busybox httpd -f -p 8080 -h /www & trap 'kill $!; exit 0' TERM; wait"
                         % (n, n)]}]}}
        rc, _, err = self.lab.kubectl("apply", "-f", "-", inp=json.dumps(pod))
        need(rc == 0, "kubectl apply web-%d: %s" % (i, err.strip()))

    def pods_served(self):
        """Each node's pod runs with an address in its node's range; its logs and exec reach
        its kubelet."""
        lab = self.lab
        pods = self.pods_running()
        ranges = self.ranges()
        for n in lab.nodes:
            ip = ipaddress.ip_address(pods[n]["status"]["podIP"])
            need(ip in ipaddress.ip_network(ranges[n]), "%s's pod has %s, outside %s" % (n, ip, ranges[n]))
            name = pods[n]["metadata"]["name"]
            rc, out, err = lab.kubectl("logs", name)
            need(rc == 0 and out.strip() == "up on %s" % n, "kubectl logs %s: %r %s" % (name, out, err.strip()))
            rc, out, err = lab.kubectl("exec", name, "--", "/bin/busybox", "cat", "/www/index.html")
            need(rc == 0 and out.strip() == "served-by-%s" % n, "kubectl exec %s: %r %s" % (name, out, err.strip()))
        detail("pods: %s" % ", ".join("%s %s" % (n, pods[n]["status"]["podIP"]) for n in lab.nodes))

    def fetch(self, pod, addr, port):
        """(rc, page, stderr) of POD's HTTP GET of ADDR:PORT."""
        rc, out, err = self.lab.kubectl(
            "exec", pod, "--", "/bin/busybox", "sh", "-c",
            "printf 'GET / HTTP/1.0\\r\\n\\r\\n' | /bin/busybox nc -w 5 %s %d" % (addr, port), timeout=30)
        return rc, out.strip(), err.strip()

    def across(self):
        """Every pod fetches every other pod's page by its pod IP."""
        lab = self.lab
        pods = self.pods_running()
        for a in lab.nodes:
            for b in lab.nodes:
                ip = pods[b]["status"]["podIP"]
                rc, out, err = self.fetch(pods[a]["metadata"]["name"], ip, 8080)
                need(rc == 0 and out.endswith("served-by-%s" % b),
                     "the pod on %s did not reach the pod on %s at %s: %r %s" % (a, b, ip, out[-200:], err))
        return len(lab.nodes) ** 2

    def services(self):
        """Service web-NODE (ClusterIP, port 80) for each node's pod, made once: NODE -> its
        ClusterIP."""
        lab = self.lab
        for n in lab.nodes:
            svc = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web-" + n},
                   "spec": {"selector": {"app": POD_LABEL, "node": n},
                            "ports": [{"port": 80, "targetPort": 8080}]}}
            rc, _, err = lab.kubectl("apply", "-f", "-", inp=json.dumps(svc))
            need(rc == 0, "kubectl apply service web-%s: %s" % (n, err.strip()))
        return {n: lab.kube_json("get", "service", "web-" + n)["spec"]["clusterIP"] for n in lab.nodes}

    def through_services(self, timeout=60):
        """Every pod fetches every node's Service by its ClusterIP (its own node's too: a pod
        reaching itself through a Service). kube-proxy programs a Service's rules a moment
        after its endpoints change: each fetch is asked again for up to TIMEOUT."""
        lab = self.lab
        pods = self.pods_running()
        ips = self.services()
        for a in lab.nodes:
            for b in lab.nodes:
                def fetched():
                    rc, out, err = self.fetch(pods[a]["metadata"]["name"], ips[b], 80)
                    if rc == 0 and out.endswith("served-by-%s" % b):
                        return True
                    raise Fail("rc %d: %r %s" % (rc, out[-200:], err))
                wait_until("the pod on %s reaching Service web-%s at %s:80" % (a, b, ips[b]),
                           fetched, timeout, 1)
        return len(lab.nodes) ** 2

    def c_pod_to_pod(self):
        detail("%d pod-to-pod fetches by pod IP, across every pair of nodes" % self.across())

    def c_services(self):
        """kube-proxy (a DaemonSet, e2e/native/kube-proxy.yaml) runs on every node, and every
        pod reaches every node's pod through its Service's ClusterIP."""
        lab = self.lab
        ds = lab.kube_json("-n", "kube-system", "get", "daemonset", "kube-proxy")
        ready = ds.get("status", {}).get("numberReady")
        need(ready == len(lab.nodes), "kube-proxy is ready on %s of %d nodes" % (ready, len(lab.nodes)))
        proxies = {p["spec"]["nodeName"]: p["status"].get("phase") for p in lab.kube_json(
            "-n", "kube-system", "get", "pods", "-l", "k8s-app=kube-proxy")["items"]}
        need(proxies == {n: "Running" for n in lab.nodes}, "kube-proxy pods: %s" % proxies)
        ips = self.services()
        detail("Services %s; %d fetches by ClusterIP, every pod to every node's Service"
               % (", ".join("web-%s %s" % kv for kv in sorted(ips.items())), self.through_services()))

    def c_rollout(self):
        lab = self.lab
        since = {n: self.pods()[n]["status"]["containerStatuses"][0]["restartCount"] for n in lab.nodes}
        name = "native-suite-reboot"
        t = time.time()
        p = subprocess.run([lab.flexnode, "rollout", "--kubeconfig", lab.kubeconfig, "reboot",
                            "--selector", SELECTOR, "--max-unavailable", "1", "--name", name,
                            "--wave-timeout", "5m"], capture_output=True, text=True, timeout=900)
        took = time.time() - t
        detail(p.stdout.strip().splitlines()[-1] if p.stdout.strip() else "(no output)")
        need(p.returncode == 0, "flexnode rollout: rc %d: %s" % (p.returncode, (p.stderr or p.stdout).strip()[-400:]))
        ops = {}
        for n in lab.nodes:
            mine = [o for o in self.watch.names() if o.startswith(name + "-" + n + "-")]
            need(len(mine) == 1, "%s got operations %s" % (n, mine))
            self.created.append(mine[0])
            phases = [row[1] for row in self.watch.history(mine[0])]
            need(phases and phases[-1] == "Complete", "%s's %s went %s" % (n, mine[0], phases))
            op = lab.get_op(mine[0])
            ops[n] = (parse_time(op["status"]["startedAt"]), parse_time(op["status"]["completedAt"]))
        # Waves of one: each node's operation starts after the one before it completed.
        for a, b in zip(lab.nodes, lab.nodes[1:]):
            need(ops[b][0] >= ops[a][1], "%s started at %s before %s completed at %s" % (b, ops[b][0], a, ops[a][1]))
        def restarted():
            pods = self.pods_running(30)
            ok = all(pods[n]["status"]["containerStatuses"][0]["restartCount"] > since[n]
                     and pods[n]["status"]["containerStatuses"][0].get("ready") for n in lab.nodes)
            return pods if ok else None
        wait_until("every pod restarted with its machine and ready", restarted, 120, 1)
        detail("in order: %s; the rollout took %.1f s" % (
            ", ".join("%s %.1f s" % (n, ops[n][1] - ops[n][0]) for n in lab.nodes), took))
        detail("%d pod-to-pod fetches after the reboots, %d through Services"
               % (self.across(), self.through_services()))


    def c_two_upgrades(self):
        """node-1 and node-3 upgraded at once (throttled downloads, so both run together):
        each Complete on the next build, and — by the API server's audit log — every
        operation write of each agent (status, metadata) is to an operation of its own node,
        and each of the two operations was written by its own node's agent only."""
        lab = self.lab
        pair = ("node-1", "node-3")
        names = {n: "native-suite-upgrade-" + n for n in pair}
        url = "http://10.0.2.100:8080/slow/flexnode-good.tar.gz"
        for n in pair:
            self.create("upgrade", names[n], node=n, url=url, sha=lab.st["SHA_GOOD"])
        runs = {}
        for n in pair:
            v = self.expect(names[n], "Complete", "Succeeded", 300)
            runs[n] = (parse_time(v[4]), parse_time(v[3]))
            ver = lab.node_sh(n, "/opt/flexnode/current/flexnode version").strip()
            need(ver == "flexnode " + lab.st["VERSION_NEXT"], "%s runs %r after its upgrade" % (n, ver))
        a, b = runs[pair[0]], runs[pair[1]]
        need(a[0] < b[1] and b[0] < a[1], "the two upgrades did not overlap: %s" % runs)
        machine_ref = {}
        writers = {names[n]: set() for n in pair}
        seen = 0
        with open(os.path.join(lab.cp_dir, "logs/audit.log")) as fh:
            for line in fh:
                e = json.loads(line)
                ref = e.get("objectRef") or {}
                code = (e.get("responseStatus") or {}).get("code", 0)
                if (e.get("stage") != "ResponseComplete" or e.get("verb") not in ("update", "patch")
                        or ref.get("resource") != "machineoperations" or not 200 <= code < 300):
                    continue
                user = e["user"]["username"]
                need(user.startswith("system:flexnode:"), "an operation written by %s" % user)
                op = ref["name"]
                if op not in machine_ref:
                    machine_ref[op] = ((lab.get_op(op) or {}).get("spec") or {}).get("machineRef")
                need(user == "system:flexnode:%s" % machine_ref[op],
                     "%s wrote %s, an operation of %s" % (user, op, machine_ref[op]))
                writers.get(op, set()).add(user)
                seen += 1
        for n in pair:
            need(writers[names[n]] == {"system:flexnode:" + n}, "%s was written by %s" % (names[n], writers[names[n]]))
        detail("overlapping %.1f s; %d operation writes in the audit log, each by its own node's agent"
               % (min(a[1], b[1]) - max(a[0], b[0]), seen))

    def c_repave(self):
        """node-2's Machine goes to the control plane's version and its Node is deleted: the
        agent repaves it to kube2 from that version's node image. The new Node is Ready at the
        new version; its range is the cluster's anew (the lab routes it again), its pod runs
        again with an address in it, and every pod reaches every other by pod IP again; the
        other nodes' machines were not touched."""
        lab = self.lab
        node = "node-2"
        others = {n: lab.node_sh(n, "machinectl show kube1 -p Leader --value").strip()
                  for n in lab.nodes if n != node}
        patch = json.dumps({"spec": {"kubernetes": {"version": lab.k8s_version}}})
        rc, out, err = lab.kubectl("patch", "machines", node, "--type", "merge", "-p", patch, "-o", "json")
        need(rc == 0, "kubectl patch machine: %s" % err.strip())
        gen = json.loads(out)["metadata"]["generation"]
        t = time.time()
        rc, _, err = lab.kubectl("delete", "node", node, "--wait=true", timeout=120)
        need(rc == 0, "kubectl delete node: %s" % err.strip())

        def applied():
            st = json.loads(lab.node_sh(node, "/opt/flexnode/bin/flexnode status -o json"))
            n = st.get("node") or {}
            return st if (st.get("phase") == "Ready" and n.get("activeSide") == "kube2"
                          and n.get("appliedGeneration") == gen) else None
        st = wait_until("%s Ready on kube2 at generation %d" % (node, gen), applied, 300, 1)
        need((st.get("node") or {}).get("appliedKubernetesVersion") == lab.k8s_version,
             "flexnode status after the repave: %s" % st.get("node"))

        def ready():
            rc, out, _ = lab.kubectl("get", "node", node, "-o", "json")
            if rc != 0:
                return None
            n = json.loads(out)
            ok = [c for c in n["status"].get("conditions", []) if c["type"] == "Ready" and c["status"] == "True"]
            return n if ok and n["spec"].get("podCIDR") else None
        n = wait_until("Node %s Ready with a pod range" % node, ready, 120, 1)
        took = time.time() - t
        need(n["status"]["nodeInfo"]["kubeletVersion"] == lab.k8s_version,
             "%s's kubelet is %s after the repave" % (node, n["status"]["nodeInfo"]["kubeletVersion"]))
        gone = lab.node_sh(node, "test -e /var/lib/machines/kube1 && echo left || echo gone").strip()
        need(gone == "gone", "kube1's tree is %s after the repave" % gone)
        for other, leader in others.items():
            now = lab.node_sh(other, "machinectl show kube1 -p Leader --value").strip()
            need(now == leader, "%s's machine restarted during %s's repave (%s -> %s)" % (other, node, leader, now))
        p = subprocess.run([lab.lab_script, "routes", "--dir", lab.dir], capture_output=True, text=True, timeout=120)
        need(p.returncode == 0, "e2e/native/lab routes: %s" % (p.stderr or p.stdout).strip()[-300:])
        # The pod bound to the Node (the same name again) is run anew by the new kubelet, in
        # the new range.
        net = ipaddress.ip_network(n["spec"]["podCIDR"])

        def anew():
            p = self.pods().get(node) or {}
            ip = p.get("status", {}).get("podIP")
            ready = [c for c in p.get("status", {}).get("conditions", []) if c["type"] == "Ready"]
            return p if ip and ipaddress.ip_address(ip) in net and ready and ready[0]["status"] == "True" else None
        wait_until("%s's pod running again in %s" % (node, net), anew, 120, 1)
        self.pods_served()
        detail("%s repaved kube1 -> kube2 (%s -> %s, range %s) in %.1f s from the Node's deletion; "
               "%d pod-to-pod fetches after, %d through Services"
               % (node, lab.join_version, lab.k8s_version, n["spec"]["podCIDR"], took, self.across(),
                  self.through_services(120)))


CHECKS = [
    ("three-nodes-join", Suite.c_join, NATIVE),
    ("joined-with-bootstrap-tokens-alone", Suite.c_token_join, NATIVE),
    ("pod-ranges-from-the-cluster", Suite.c_pod_ranges, NATIVE),
    ("pod-on-every-node", Suite.c_pod_on_every_node, NATIVE),
    ("pod-to-pod-across-nodes", Suite.c_pod_to_pod, NATIVE),
    ("service-clusterip-from-every-node", Suite.c_services, NATIVE),
    ("rollout-reboot-in-waves-of-one", Suite.c_rollout, NATIVE),
    ("repave-one-node-pods-across-after", Suite.c_repave, NATIVE),
    ("two-nodes-upgraded-at-once-each-its-own", Suite.c_two_upgrades, NATIVE),
    ("one-terminal-result-per-operation", Suite.c_one_result_each, NATIVE),
]


def diagnose(lab):
    """Context after a failure: each node's agent journal tail and its machine's kubelet."""
    for n in lab.nodes:
        try:
            out = lab.node_sh(n, "journalctl --no-pager -o short-precise -n 8 -u 'flexnode*'; "
                                 "machinectl list --no-legend || true")
        except Fail as e:
            out = str(e)
        print("---- %s\n%s" % (n, out.rstrip()), flush=True)
    rc, out, _ = lab.kubectl("get", "nodes,pods", "-o", "wide")
    print(out.rstrip(), flush=True)


def main():
    return run_suite(__doc__, CHECKS, Suite, NativeLab, diagnose, "three-nodes-join", lambda suite: None,
                     tier=NATIVE)


if __name__ == "__main__":
    sys.exit(main())
