"""e2e/native/goal.py — the native suite's checks of the Machine driving the node (issue 31):
a fleet's version moved by its Machines alone, the Machine's labels and taints and the
configuration's kubelet settings on the Node, a goal whose version has no image refused before
the running side stops, an air-gapped node's images from archives. Mixed into e2e/native/suite.py's Suite; Python 3 stdlib only."""

import hashlib
import importlib.machinery
import importlib.util
import ipaddress
import json
import os
import subprocess
import tarfile
import tempfile
import time

from lab import Fail, detail, need, wait_until

# What the lab's join configuration gives every node's kubelet (e2e/native/lab).
MAX_PODS = "50"
REPO = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))


def image_build():
    """image/build as a module: its registry client (the same the lab pushes with)."""
    loader = importlib.machinery.SourceFileLoader("image_build", os.path.join(REPO, "image", "build"))
    spec = importlib.util.spec_from_loader("image_build", loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


class GoalChecks:
    def status(self, node):
        """NODE's `flexnode status -o json` (a daemon restarting may answer nothing parseable
        for a moment: that is a Fail, which waits retry)."""
        out = self.lab.node_sh(node, "/opt/flexnode/bin/flexnode status -o json")
        try:
            return json.loads(out)
        except ValueError:
            raise Fail("%s: flexnode status printed %r" % (node, out[-200:]))

    def repave_to(self, node, spec, timeout=300):
        """NODE's Machine patched (spec.kubernetes merged with SPEC) and its Node deleted: the
        agent applies the new generation by a repave. Returns its `flexnode status`, the new
        Node Ready with a pod range, and the seconds from the Node's deletion."""
        lab = self.lab
        patch = json.dumps({"spec": {"kubernetes": spec}})
        rc, out, err = lab.kubectl("patch", "machines", node, "--type", "merge", "-p", patch, "-o", "json")
        need(rc == 0, "kubectl patch machine %s: %s" % (node, err.strip()))
        gen = json.loads(out)["metadata"]["generation"]
        t = time.time()
        rc, _, err = lab.kubectl("delete", "node", node, "--wait=true", "--ignore-not-found", timeout=120)
        need(rc == 0, "kubectl delete node %s: %s" % (node, err.strip()))

        def applied():
            st = self.status(node)
            n = st.get("node") or {}
            return st if st.get("phase") == "Ready" and n.get("appliedGeneration") == gen else None
        st = wait_until("%s applied generation %d" % (node, gen), applied, timeout, 1)

        def ready():
            rc, out, _ = lab.kubectl("get", "node", node, "-o", "json")
            if rc != 0:
                return None
            n = json.loads(out)
            ok = [c for c in n["status"].get("conditions", []) if c["type"] == "Ready" and c["status"] == "True"]
            return n if ok and n["spec"].get("podCIDR") else None
        n = wait_until("Node %s Ready with a pod range" % node, ready, 120, 1)
        return st, n, time.time() - t

    def pods_back(self, nodes):
        """The routes to the repaved NODES' new ranges, and their pods running there again."""
        lab = self.lab
        p = subprocess.run([lab.lab_script, "routes", "--dir", lab.dir], capture_output=True, text=True, timeout=120)
        need(p.returncode == 0, "e2e/native/lab routes: %s" % (p.stderr or p.stdout).strip()[-300:])
        for node in nodes:
            net = ipaddress.ip_network(lab.kube_json("get", "node", node)["spec"]["podCIDR"])

            def anew():
                pod = self.pods().get(node) or {}
                ip = pod.get("status", {}).get("podIP")
                ready = [c for c in pod.get("status", {}).get("conditions", []) if c["type"] == "Ready"]
                return pod if ip and ipaddress.ip_address(ip) in net and ready and ready[0]["status"] == "True" else None
            wait_until("%s's pod running again in %s" % (node, net), anew, 120, 1)
        self.pods_served()

    def c_dns(self):
        """Every node's kubelet names the cluster's DNS (the configuration's clusterDNS: CoreDNS
        from pinned modules, e2e/controlplane/run dns): a pod on each node has it in its
        resolv.conf, with the cluster's search domains, and resolves every node's Service by its
        name to its ClusterIP."""
        lab = self.lab
        pods = self.pods_running()
        ips = self.services()
        for a in lab.nodes:
            pod = pods[a]["metadata"]["name"]
            rc, conf, err = lab.kubectl("exec", pod, "--", "/bin/busybox", "cat", "/etc/resolv.conf")
            need(rc == 0, "resolv.conf of %s: %s" % (pod, err.strip()))
            need("nameserver %s" % lab.st["CLUSTER_DNS"] in conf and "svc.cluster.local" in conf,
                 "%s's resolv.conf: %r" % (pod, conf))
            for b in lab.nodes:
                name = "web-%s.default.svc.cluster.local" % b

                def resolved():
                    rc, out, err = lab.kubectl("exec", pod, "--", "/bin/busybox", "nslookup", name, timeout=30)
                    if rc == 0 and ips[b] in out:
                        return True
                    raise Fail("rc %d: %r %s" % (rc, out[-200:], err.strip()))
                wait_until("the pod on %s resolving %s" % (a, name), resolved, 30, 1)
        detail("every pod resolves every node's Service by name through %s (clusterDNS on every node)"
               % lab.st["CLUSTER_DNS"])

    def c_fleet_upgrade(self):
        """The rest of the fleet (node-1, node-3) moves to the control plane's version by its
        Machines alone, one node at a time: each Machine patched, its Node deleted. No node's
        configuration changes (its `nodeImage` pattern names no version): each agent resolves
        the version's tag, and `flexnode status` shows the digest it recorded, the one the lab
        pushed; each Node is Ready at the new version, with the configuration's maxPods."""
        lab = self.lab
        configs = {n: lab.node_sh(n, "sha256sum /etc/flexnode/config.yaml") for n in lab.nodes}
        took = {}
        for node in ("node-1", "node-3"):
            st, n, took[node] = self.repave_to(node, {"version": lab.k8s_version})
            need(n["status"]["nodeInfo"]["kubeletVersion"] == lab.k8s_version,
                 "%s's kubelet is %s" % (node, n["status"]["nodeInfo"]["kubeletVersion"]))
            image = (st.get("node") or {}).get("nodeImage", "")
            need(":%s@" % lab.k8s_version in image and image.endswith(lab.st["NODE_IMAGE"]),
                 "%s's flexnode status shows the node image %r, not the tag of %s at %s"
                 % (node, image, lab.k8s_version, lab.st["NODE_IMAGE"]))
        for node in lab.nodes:
            n = lab.kube_json("get", "node", node)
            need(n["status"]["nodeInfo"]["kubeletVersion"] == lab.k8s_version,
                 "%s is at %s after the fleet's upgrade" % (node, n["status"]["nodeInfo"]["kubeletVersion"]))
            need(n["status"]["capacity"].get("pods") == MAX_PODS,
                 "%s's pod capacity is %s, not the configured maxPods %s"
                 % (node, n["status"]["capacity"].get("pods"), MAX_PODS))
            need(lab.node_sh(node, "sha256sum /etc/flexnode/config.yaml") == configs[node],
                 "%s's configuration changed" % node)
        self.pods_back(("node-1", "node-3"))
        detail("node-1 repaved to %s in %.1f s, node-3 repaved to %s in %.1f s (the Node's deletion to Ready); "
               "no configuration changed; every Node's pod capacity %s"
               % (lab.k8s_version, took["node-1"], lab.k8s_version, took["node-3"], MAX_PODS))

    def c_node_settings(self):
        """node-2's Machine names labels (one of the topology labels a kubelet may set) and a
        taint: after the repave its Node has them, from the same node image bytes (the version
        did not change, so its tag is not resolved again). A second generation changes a
        label, drops the other and the taint: the next Node has exactly that."""
        lab = self.lab
        node = "node-2"
        image = (self.status(node).get("node") or {}).get("nodeImage")
        labels = {"flexnode.io/pool": "edge", "topology.kubernetes.io/zone": "lab-a"}
        taint = {"key": "flexnode.io/dedicated", "value": "suite", "effect": "NoSchedule"}
        st, n, first = self.repave_to(node, {"nodeLabels": labels,
                                             "registerWithTaints": ["flexnode.io/dedicated=suite:NoSchedule"]})
        got = n["metadata"].get("labels") or {}
        need(all(got.get(k) == v for k, v in labels.items()), "%s's labels: %s" % (node, got))
        need(taint in (n["spec"].get("taints") or []), "%s's taints: %s" % (node, n["spec"].get("taints")))
        shown = st.get("node") or {}
        need(shown.get("nodeImage") == image, "the node image changed with the labels: %s -> %s"
             % (image, shown.get("nodeImage")))
        need(shown.get("nodeLabels") == labels, "flexnode status shows the labels %s" % shown.get("nodeLabels"))
        st, n, second = self.repave_to(node, {"nodeLabels": {"flexnode.io/pool": "core",
                                                             "topology.kubernetes.io/zone": None},
                                              "registerWithTaints": None})
        got = n["metadata"].get("labels") or {}
        need(got.get("flexnode.io/pool") == "core" and "topology.kubernetes.io/zone" not in got,
             "%s's labels after the second generation: %s" % (node, got))
        need(not [t for t in n["spec"].get("taints") or [] if t["key"] == taint["key"]],
             "%s keeps the taint: %s" % (node, n["spec"].get("taints")))
        self.pods_back((node,))
        detail("labels and taint on the Node %.1f s after its deletion, changed by the next generation in %.1f s; "
               "node image unchanged (%s)" % (first, second, image))

    def c_downloads_refused(self):
        """node-3's Machine names spec.agent.downloads: its agent says on the Machine that this
        node takes its components from its node image (DownloadsIgnored, naming them), and
        nothing on the node changes; with the downloads gone, so is the condition. (Both
        patches are new generations: node-3 is left with a goal that waits for its Node's
        deletion, which no later check makes.)"""
        lab = self.lab
        node = "node-3"
        leader = lab.node_sh(node, "machinectl show %s -p Leader --value"
                             % self.status(node)["node"]["activeSide"]).strip()
        downloads = {"kubernetes": {"version": "v1.35.0"},
                     "containerd": {"baseURL": "https://downloads.example/containerd", "version": "2.1.0"}}
        patch = json.dumps({"spec": {"agent": {"downloads": downloads}}})
        rc, _, err = lab.kubectl("patch", "machines", node, "--type", "merge", "-p", patch)
        need(rc == 0, "kubectl patch machine: %s" % err.strip())

        def condition(want):
            def probe():
                s = lab.kube_json("get", "machines", node).get("status") or {}
                c = [c for c in s.get("conditions", []) if c["type"] == "DownloadsIgnored"]
                return (c[0] if c else None) if want else (True if not c else None)
            return probe
        c = wait_until("DownloadsIgnored on Machine %s" % node, condition(True), 60, 1)
        need(c["status"] == "True" and c["reason"] == "NodeImage"
             and "spec.agent.downloads (kubernetes, containerd) is ignored" in c["message"],
             "the condition: %s" % c)
        rc, _, err = lab.kubectl("patch", "machines", node, "--type", "merge", "-p",
                                 json.dumps({"spec": {"agent": {"downloads": None}}}))
        need(rc == 0, "kubectl patch machine: %s" % err.strip())
        wait_until("DownloadsIgnored gone from Machine %s" % node, condition(False), 60, 1)
        now = lab.node_sh(node, "machinectl show %s -p Leader --value"
                          % self.status(node)["node"]["activeSide"]).strip()
        need(now == leader, "%s's machine restarted (%s -> %s)" % (node, leader, now))
        detail("said: %r; removed with the downloads; the machine untouched" % c["message"])

    def c_missing_version(self):
        """node-1's Machine names a version no node image is tagged for: the repave fails before
        the running side is touched (its machine never stops), the Machine says why naming the
        image reference, `flexnode status` shows the goal waiting. The next generation, back at
        the running version, repaves as usual."""
        lab = self.lab
        node = "node-1"
        st = self.status(node)
        active = st["node"]["activeSide"]
        leader = lab.node_sh(node, "machinectl show %s -p Leader --value" % active).strip()
        missing = "v1.34.99"
        patch = json.dumps({"spec": {"kubernetes": {"version": missing}}})
        rc, _, err = lab.kubectl("patch", "machines", node, "--type", "merge", "-p", patch)
        need(rc == 0, "kubectl patch machine: %s" % err.strip())
        rc, _, err = lab.kubectl("delete", "node", node, "--wait=true", timeout=120)
        need(rc == 0, "kubectl delete node: %s" % err.strip())

        def failed():
            s = lab.kube_json("get", "machines", node).get("status") or {}
            why = [c for c in s.get("conditions", []) if c["type"] == "NodeUpdated" and missing in c["message"]]
            return why[0] if s.get("phase") == "Failed" and why else None
        s = wait_until("Machine %s Failed naming %s" % (node, missing), failed, 120, 1)
        reference = "flexnode/node:%s" % missing
        need(reference in s["message"] and "not found" in s["message"], "the Machine says: %s" % s["message"])
        now = lab.node_sh(node, "machinectl show %s -p Leader --value" % active).strip()
        need(now == leader, "%s's running machine restarted (%s -> %s)" % (node, leader, now))
        st = self.status(node)
        waiting = ((st.get("daemon") or {}).get("waitingGoal") or {})
        need(waiting.get("kubernetesVersion") == missing and st["node"]["activeSide"] == active,
             "flexnode status: %s, waiting %s" % (st.get("node"), waiting))
        _, n, took = self.repave_to(node, {"version": lab.k8s_version})
        need(n["status"]["nodeInfo"]["kubeletVersion"] == lab.k8s_version, "back at %s" % n["status"]["nodeInfo"])
        self.pods_back((node,))
        detail("refused with %r; %s kept running; the next generation repaved in %.1f s"
               % (s["message"], active, took))

    def c_offline_node(self):
        """An air-gapped node: node-4 joins with the registry's port refused in its network
        namespace (`e2e/native/lab offline-node`), its node images and the pod sandbox image
        from OCI archives on its disk (nodeImageArchive, sandboxImageArchive). Its Node is
        Ready at the join's version, a pod runs there (the sandbox image as its container,
        never pulled), and its Machine alone repaves it to the control plane's version, all
        with the registry still refused; `flexnode status` shows the archives' digests, the
        ones the lab built."""
        lab = self.lab
        node = "node-4"
        p = subprocess.run([lab.lab_script, "offline-node", node, "--dir", lab.dir],
                           capture_output=True, text=True, timeout=600)
        need(p.returncode == 0, "e2e/native/lab offline-node: %s" % (p.stderr or p.stdout).strip()[-600:])
        joined = p.stderr.strip().splitlines()[-1].partition("offline: ")[2] if p.stderr.strip() else ""
        reg = "10.0.2.100:5000"

        def refused():
            rules = lab.node_sh(node, "ip rule list")
            need("dport 5000 prohibit" in rules, "%s's rules: %s" % (node, rules))
            probe = lab.node_sh(node, "if timeout 5 bash -c 'exec 3<>/dev/tcp/10.0.2.100/5000' 2>/dev/null; "
                                      "then echo reached; else echo refused; fi").strip()
            need(probe == "refused", "%s: the registry %s" % (node, probe))
        refused()
        n = lab.kube_json("get", "node", node)
        need(n["status"]["nodeInfo"]["kubeletVersion"] == lab.join_version,
             "%s's kubelet is %s" % (node, n["status"]["nodeInfo"]["kubeletVersion"]))
        image = (self.status(node).get("node") or {}).get("nodeImage", "")
        need(image.endswith(lab.st["PREV_NODE_IMAGE"]), "%s runs the node image %r" % (node, image))
        pause = "%s/flexnode/pause@%s" % (reg, lab.st["PAUSE_IMAGE"])
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "offline"},
               "spec": {"nodeName": node, "terminationGracePeriodSeconds": 1,
                        "tolerations": [{"operator": "Exists"}],
                        "containers": [{"name": "pause", "image": pause, "imagePullPolicy": "IfNotPresent"}]}}
        rc, _, err = lab.kubectl("apply", "-f", "-", inp=json.dumps(pod))
        need(rc == 0, "kubectl apply the offline pod: %s" % err.strip())

        def running():
            s = lab.kube_json("get", "pod", "offline").get("status") or {}
            if s.get("phase") == "Running":
                return s
            waiting = [c.get("state", {}).get("waiting") for c in s.get("containerStatuses") or []]
            raise Fail("pod offline: %s %s" % (s.get("phase"), waiting))
        wait_until("the pod on %s running" % node, running, 120, 1)
        rc, _, err = lab.kubectl("delete", "pod", "offline", "--wait=true", timeout=60)
        need(rc == 0, "kubectl delete pod offline: %s" % err.strip())
        st, n, took = self.repave_to(node, {"version": lab.k8s_version})
        need(n["status"]["nodeInfo"]["kubeletVersion"] == lab.k8s_version,
             "%s's kubelet is %s after the repave" % (node, n["status"]["nodeInfo"]["kubeletVersion"]))
        image = (st.get("node") or {}).get("nodeImage", "")
        need(":%s@" % lab.k8s_version in image and image.endswith(lab.st["NODE_IMAGE"]),
             "%s's flexnode status shows the node image %r after the repave" % (node, image))
        refused()
        detail("%s %s; a pod ran on the sandbox image from its archive; repaved to %s in %.1f s with the "
               "registry refused throughout" % (node, joined, lab.k8s_version, took))

    def c_node_image_command(self):
        """The operator's command (`image/node build`, docs/node.md) makes the node image of the
        control plane's version with the kubelet built from the pinned upstream module (a
        generated module, checked by Go's checksum database), pushes it by digest and tagged
        with the version, and writes an OCI archive of it; built again into another layout
        from the same inputs it has the same digest. The registry serves that digest for the
        tag; the archive's index names it; the image's kubelet reports the version."""
        lab = self.lab
        version = lab.k8s_version
        cache = os.environ.get("FLEXNODE_CACHE") or os.path.expanduser("~/.cache/flexnode")
        host = "127.0.0.1:%s" % lab.st["REG_PORT"]
        ca, creds = os.path.join(lab.dir, "pki", "ca.pem"), os.path.join(lab.dir, "host-credentials.json")
        with tempfile.TemporaryDirectory(dir=cache, prefix="node-image-check.") as t:
            def build(out, *extra):
                start = time.time()
                p = subprocess.run([os.path.join(REPO, "image", "node"), "build", "--kubernetes", version,
                                    "--out", os.path.join(t, out), *extra],
                                   capture_output=True, text=True, timeout=1800)
                need(p.returncode == 0, "image/node build: %s" % (p.stderr or p.stdout).strip()[-800:])
                return p.stdout.strip().splitlines()[-1], p.stderr, time.time() - start
            archive = os.path.join(t, "node.oci.tar")
            first, log, took = build("a", "--archive", archive, "--push", host + "/flexnode/node-operator",
                                     "--ca", ca, "--credentials", creds)
            pin = "%s/flexnode/node-operator:%s@%s" % (host, version, first)
            need("pushed: " + pin in log, "image/node build did not report the pin %s:\n%s" % (pin, log[-800:]))
            again, _, took_again = build("b")
            need(again == first, "built twice from the same inputs: %s, then %s" % (first, again))
            ib = image_build()
            reg = ib.Registry(host, "flexnode/node-operator", ca, creds, False)
            for ref in (version, first):
                r = reg.request("HEAD", "/v2/flexnode/node-operator/manifests/%s" % ref, headers={
                    "Accept": "application/vnd.oci.image.index.v1+json"})
                need(r.status == 200 and r.headers.get("Docker-Content-Digest") == first,
                     "the registry answers %s for %s: %s" % (r.status, ref, r.headers.get("Docker-Content-Digest")))
            with tarfile.open(archive) as tar:
                index = json.load(tar.extractfile("index.json"))
            need(index["manifests"][0]["digest"] == first, "the archive's index: %s" % index)
            kubelet = os.path.join(cache, "node-image", "kubelet", version, "kubelet")
            out = subprocess.run([kubelet, "--version"], capture_output=True, text=True, timeout=30).stdout.strip()
            need(out == "Kubernetes %s" % version, "the module's kubelet says %r" % out)
            with open(os.path.join(t, "a", "index.json")) as f:
                top = json.load(f)["manifests"][0]["digest"]
            blob = lambda d: os.path.join(t, "a", "blobs", "sha256", d.split(":", 1)[1])  # noqa: E731
            with open(blob(top)) as f:
                manifest = json.load(open(blob(json.load(f)["manifests"][0]["digest"])))
            labels = json.load(open(blob(manifest["config"]["digest"])))["config"]["Labels"]
            with open(kubelet, "rb") as f:
                sha = hashlib.sha256(f.read()).hexdigest()
            need(labels.get("io.flexnode.kubelet-sha256") == sha
                 and labels.get("io.flexnode.kubernetes-version") == version, "the image's labels: %s" % labels)
        detail("%s built in %.0f s (the kubelet from k8s.io/kubernetes@%s), again in %.0f s with the same digest; "
               "pushed as %s; the archive holds it" % (version, took, version, took_again, pin))
