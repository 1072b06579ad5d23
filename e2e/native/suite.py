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

import base64
import ipaddress
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "host"))

from lab import (NATIVE, Fail, Lab, SuiteBase, detail, need, parse_time, read_state, run_suite,  # noqa: E402
                 wait_until)
from drain import DrainChecks  # noqa: E402
from goal import GoalChecks  # noqa: E402

POD_LABEL = "flexnode-native-suite"
SELECTOR = "app.kubernetes.io/managed-by=flexnode"


def approval(csr):
    """The reason a certificate request was approved with, else None."""
    return next((c.get("reason") for c in (csr.get("status") or {}).get("conditions") or []
                 if c["type"] == "Approved"), None)


class NativeLab:
    """The lab as the checks see it: the admin's kubectl and flexnode, and a shell on each
    node (nsenter into the node's namespaces by `e2e/native/run exec`)."""

    def __init__(self, d):
        self.dir = d
        self.st = st = read_state(d)
        self.nodes = ["node-%d" % i for i in range(1, int(st["NODES"]) + 1)]
        # Nodes whose agent's credential is an exec plugin (`flexnode token`); the others
        # joined with a bootstrap token.
        self.exec_nodes = st.get("EXEC_NODES", "").split()
        self.token_nodes = [n for n in self.nodes if n not in self.exec_nodes]
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

    def node_write(self, node, path, text):
        """TEXT in PATH on NODE, mode 0600, replaced whole (never on a command line)."""
        self.node_sh(node, 'umask 077; cat > "$0.test"; mv "$0.test" "$0"'.replace("$0", path), inp=text)

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

    def node_sh(self, node, script, timeout=120, inp=None):
        """stdout of a root shell script on NODE, run under `set -e` (INP: its stdin)."""
        p = subprocess.run([self.native_run, "exec", node, "sh", "-c", "set -e\n" + script],
                           input=inp, capture_output=True, text=True, timeout=timeout)
        if p.returncode != 0:
            raise Fail("%s: command failed (rc %d): %s: %s"
                       % (node, p.returncode, script[:120], (p.stderr or p.stdout).strip()[-400:]))
        return p.stdout


class Suite(DrainChecks, GoalChecks, SuiteBase):
    def __init__(self, lab):
        super().__init__(lab)
        self.started = time.time()
        self.invocations = {}

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
            self.invocations[name] = self.invocation(name)
        detail("3 Nodes Ready at %s, Machines Ready, agents active, kube1 running" % lab.join_version)

    def c_token_join(self):
        """Each node joined from the API server's URL and CA and a bootstrap token bound to it
        alone (e2e/native/lab: no certificate minted with the cluster's CA key): one CSR per
        node, sent by its token, approved by `flexnode approver` for that binding; the
        agent's kubeconfig (0600) holds the certificate it issued; the token's secret in no
        journal, log, command line or environment."""
        lab = self.lab
        csrs = lab.kube_json("get", "csr")["items"]
        need(lab.token_nodes, "no node joined with a bootstrap token")
        for name in lab.token_nodes:
            conf = lab.node_sh(name, "cat /root/join.yaml")
            need("apiServer: https://" in conf and "kubeconfig:" not in conf,
                 "%s's join configuration names a kubeconfig:\n%s" % (name, conf))
            token = lab.node_sh(name, "cat /root/bootstrap-token").strip()
            token_id, secret = token.split(".")
            mine = self.requests(csrs, name)
            by_token = [c for c in mine if c["spec"]["username"] == "system:bootstrap:" + token_id]
            need(len(by_token) == 1 and by_token[0] is mine[0],
                 "%s's requests were sent by %s" % (name, [c["spec"]["username"] for c in mine]))
            need(approval(by_token[0]) == "BoundBootstrapToken",
                 "%s's request: %s" % (name, by_token[0]["status"].get("conditions")))
            # Any later one is a renewal (the suite's certificates live 600 s, renewed every
            # 30 s or so): the kubeconfig holds the newest issued once its renewal is written,
            # so a renewal between the list and the read is looked at again.
            def holds_newest():
                newest = [c["status"]["certificate"] for c in self.requests(lab.kube_json("get", "csr")["items"], name)
                          if c["status"].get("certificate")]
                kc = lab.node_sh(name, "stat -c %a /etc/flexnode/kubeconfig; cat /etc/flexnode/kubeconfig")
                mode, _, text = kc.partition("\n")
                need(mode == "600", "%s: /etc/flexnode/kubeconfig is mode %s" % (name, mode))
                if newest and newest[-1] in text:
                    return text
                raise Fail("%s's kubeconfig does not hold its newest issued certificate" % name)
            text = wait_until("%s's kubeconfig holding its newest certificate" % name, holds_newest, 20, 1)
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
            self.not_published(name, secret, "the token's secret")
        with open(os.path.join(lab.dir, "logs", "approver.log")) as f:
            approver = f.read()
        need(approver.count("BoundBootstrapToken") >= len(lab.token_nodes),
             "the approver's log shows %d approvals" % approver.count("BoundBootstrapToken"))
        detail("%s joined with node-bound bootstrap tokens alone: one CSR each by its token, "
               "approved BoundBootstrapToken; no secret in journals, logs or process lines"
               % ", ".join(lab.token_nodes))

    def c_exec_join(self):
        """Each node of EXEC_NODES joined with an exec credential: its agent's kubeconfig runs
        `flexnode token` (a client secret from a 0600 file, the lab's identity provider), and the
        API server's JWT authenticator maps the token to the agent's identity — every request
        of the agent in the audit log is system:flexnode:NODE in flexnode:agents with the
        token's subject as uid; no certificate was asked for; the identity provider issued it
        tokens; the secret in no journal line, process command line or environment."""
        lab = self.lab
        need(lab.exec_nodes, "no node joined with an exec credential")
        csrs = lab.kube_json("get", "csr")["items"]
        for n in lab.exec_nodes:
            kc = lab.node_sh(n, "stat -c %a /etc/flexnode/kubeconfig; cat /etc/flexnode/kubeconfig")
            need(kc.startswith("600\n") and "command: flexnode" in kc and "client-certificate" not in kc,
                 "%s's kubeconfig is not the exec plugin's:\n%s" % (n, kc))
            need(not self.requests(csrs, n), "%s asked for a certificate" % n)
            users = self.audited_as("system:flexnode:" + n, "flexnode:agents")
            need(users == {(n, True)}, "%s's agent's requests were made as %s" % (n, users))
            leaks = lab.node_sh(n, "journalctl --no-pager -o cat | grep -c -F -f /etc/flexnode/client-secret || true; "
                                   "grep -l -F -f /etc/flexnode/client-secret /proc/[0-9]*/cmdline "
                                   "/proc/[0-9]*/environ 2>/dev/null | wc -l").split()
            need(leaks == ["0", "0"], "%s: the client secret in %s journal lines and %s process "
                 "command lines or environments" % (n, leaks[0], leaks[1]))
            self.not_published(n, lab.node_sh(n, "cat /etc/flexnode/client-secret").strip(), "the client secret")
            # Its kubelet runs the same plugin (the agent's binary copied into the machine) for
            # the audience kubelet: no bootstrap token, no certificate of its own.
            machine = lab.node_sh(n, "cat /var/lib/machines/kube1/etc/kubernetes/kubelet.kubeconfig; "
                                     "test ! -e /var/lib/machines/kube1/etc/kubernetes/bootstrap.kubeconfig; "
                                     "cmp /var/lib/machines/kube1/usr/local/libexec/flexnode/flexnode "
                                     "/opt/flexnode/current/flexnode && echo same-binary")
            need('"command":"/usr/local/libexec/flexnode/flexnode"' in machine
                 and '"--audience","kubelet"' in machine and "same-binary" in machine,
                 "%s's kubelet does not run the agent's plugin:\n%s" % (n, machine[-600:]))
            token_id = lab.node_sh(n, "cut -d. -f1 /etc/flexnode/bootstrap-token").strip()
            need(not [c for c in csrs if c["spec"]["username"] in ("system:bootstrap:" + token_id,
                                                                    "system:node:" + n)],
                 "%s's kubelet asked for a certificate" % n)
            kubelet = self.audited_as("system:node:" + n, "system:nodes")
            need(kubelet == {(n, True)}, "%s's kubelet's requests were made as %s" % (n, kubelet))
        with open(os.path.join(lab.cp_dir, "logs/issuer-requests.log")) as f:
            issued = [line.split() for line in f]
        for n in lab.exec_nodes:
            mine = [r for r in issued if r[1:3] == ["POST", "/token"] and r[4] == n]
            need(mine and all(r[3] == "200" for r in mine), "%s's token requests: %s" % (n, mine))
            audiences = {r[5] for r in mine}
            need(audiences == {"flexnode", "kubelet"}, "%s's tokens were for %s" % (n, audiences))
        detail("%s joined through `flexnode token` and the API server's JWT authenticator: no "
               "certificate; its agent's and its kubelet's requests as system:flexnode:NODE and "
               "system:node:NODE (uid the token's subject); the kubelet runs the agent's binary "
               "in the machine" % ", ".join(lab.exec_nodes))

    def c_plugin_follows_upgrade(self):
        """After its AgentUpgrade, an exec node's kubelet runs the upgraded build: the daemon
        that took over copied itself into the machine, and the Node stays Ready."""
        lab = self.lab
        need(lab.exec_nodes, "no node joined with an exec credential")
        for n in lab.exec_nodes:
            side = self.status(n)["node"]["activeSide"]
            ver = lab.node_sh(n, "/var/lib/machines/%s/usr/local/libexec/flexnode/flexnode version" % side).strip()
            need(ver == "flexnode " + lab.st["VERSION_NEXT"], "%s's kubelet runs %r" % (n, ver))
            node = lab.kube_json("get", "node", n)
            ready = [c for c in node["status"]["conditions"] if c["type"] == "Ready"]
            need(ready and ready[0]["status"] == "True", "%s is not Ready: %s" % (n, ready))
        detail("%s's kubelet plugin is %s after the upgrade" % (", ".join(lab.exec_nodes), lab.st["VERSION_NEXT"]))

    def audited_as(self, user, group):
        """How USER's requests were authenticated, by the API server's audit log: the set of
        (uid, whether in GROUP)."""
        seen = set()
        with open(os.path.join(self.lab.cp_dir, "logs/audit.log")) as fh:
            for line in fh:
                u = json.loads(line)["user"]
                if u["username"] == user:
                    seen.add((u.get("uid"), group in u.get("groups", [])))
        return seen

    def not_published(self, node, secret, what):
        """SECRET in none of NODE's `flexnode status`, no Event, Machine or certificate request."""
        lab = self.lab
        need(len(secret) >= 16, "%s is too short to look for" % what)
        status = lab.node_sh(node, "/opt/flexnode/bin/flexnode status -o json")
        rc, out, err = lab.kubectl("get", "events,machines,csr", "-A", "-o", "json")
        need(rc == 0, "kubectl get events,machines,csr: %s" % err.strip())
        need(secret not in status and secret not in out,
             "%s: %s in its status or the cluster's Events, Machines or requests" % (node, what))

    def requests(self, csrs, node):
        """NODE's agent's certificate requests (named flexnode-NODE-<key>), oldest first."""
        return sorted((c for c in csrs if c["metadata"]["name"].startswith("flexnode-%s-" % node)),
                      key=lambda c: c["metadata"]["creationTimestamp"])

    def invocation(self, node):
        """NODE's agent's systemd invocation: another one is a restart."""
        return self.lab.node_sh(node, "systemctl show flexnode-agent -p InvocationID --value").strip()

    def c_other_identity_denied(self):
        """node-1's bootstrap token asks for node-2's agent identity (a well-formed request: the
        CN and O of an agent, client auth, a P-256 key): `flexnode approver` denies it
        RequesterNotBound, naming the binding, and no certificate is issued. A leaked token
        mints its own node's identity, not the fleet's."""
        lab = self.lab
        token = lab.node_sh("node-1", "cat /etc/flexnode/bootstrap-token").strip()
        kubeconfig = os.path.join(lab.dir, "node-1-token.kubeconfig")
        url = "https://127.0.0.1:%s" % lab.st["API_PORT"]
        fd = os.open(kubeconfig, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump({"apiVersion": "v1", "kind": "Config", "current-context": "t",
                       "clusters": [{"name": "c", "cluster": {
                           "server": url, "certificate-authority": os.path.join(lab.cp_dir, "pki", "ca.crt")}}],
                       "users": [{"name": "t", "user": {"token": token}}],
                       "contexts": [{"name": "t", "context": {"cluster": "c", "user": "t"}}]}, f)
        key = os.path.join(lab.dir, "steal.key")
        p = subprocess.run(["openssl", "req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
                            "-nodes", "-keyout", key, "-subj", "/O=flexnode:agents/CN=system:flexnode:node-2"],
                           capture_output=True, text=True, timeout=30)
        need(p.returncode == 0, "openssl req: %s" % p.stderr.strip())
        name = "native-suite-node-1-asks-for-node-2"
        csr = {"apiVersion": "certificates.k8s.io/v1", "kind": "CertificateSigningRequest",
               "metadata": {"name": name},
               "spec": {"request": base64.b64encode(p.stdout.encode()).decode(),
                        "signerName": "kubernetes.io/kube-apiserver-client", "expirationSeconds": 600,
                        "usages": ["digital signature", "client auth"]}}
        p = subprocess.run([lab.kubectl_bin, "--kubeconfig", kubeconfig, "create", "-f", "-"],
                           input=json.dumps(csr), capture_output=True, text=True, timeout=60)
        need(p.returncode == 0, "node-1's token could not create a certificate request: %s" % p.stderr.strip())

        def decided():
            c = lab.kube_json("get", "csr", name)
            return c if (c.get("status") or {}).get("conditions") else None
        c = wait_until("the approver's decision on %s" % name, decided, 60, 0.5)
        conds = c["status"]["conditions"]
        need([x["type"] for x in conds] == ["Denied"] and conds[0].get("reason") == "RequesterNotBound",
             "node-1's token asking for node-2: %s" % conds)
        need(c["spec"]["username"].startswith("system:bootstrap:"), "sent by %s" % c["spec"]["username"])
        need("system:bootstrappers:flexnode:node-2" in conds[0].get("message", ""),
             "the denial does not name the binding: %s" % conds[0].get("message"))
        time.sleep(2)
        need(not lab.kube_json("get", "csr", name)["status"].get("certificate"), "a certificate was issued")
        detail("Denied RequesterNotBound: %s" % conds[0]["message"])

    def c_expired(self):
        """node-1 back with a certificate that expired while it was off (minted with the cluster
        CA, valid one day in 2020): its agent asks for a new one with the node's bootstrap
        token (approved BoundBootstrapToken) and runs on. Then again with the token gone from
        the cluster: the agent stops with CertificateExpired in its journal and `flexnode
        status` names the fix, and `flexnode join` exits 78; a new token bound to the node,
        put where the fault says, and a restart bring it back."""
        lab, node = self.lab, "node-1"
        need(node in lab.token_nodes, "%s did not join with a bootstrap token" % node)
        cp = os.path.join(os.path.dirname(lab.lab_script), "..", "controlplane", "run")
        p = subprocess.run([cp, "node-cert", node, "--expired", "--dir", lab.cp_dir],
                           capture_output=True, text=True, timeout=60)
        need(p.returncode == 0, "node-cert --expired: %s" % p.stderr.strip())
        with open(p.stdout.strip()) as f:
            expired = f.read().replace("server: https://127.0.0.1:%s" % lab.st["API_PORT"],
                                       "server: https://10.0.2.100:6443")
        need("10.0.2.100:6443" in expired, "the expired kubeconfig names another server")

        def put_expired():
            lab.node_sh(node, "systemctl stop flexnode-agent")
            lab.node_write(node, "/etc/flexnode/kubeconfig", expired)
        token_id = lab.node_sh(node, "cut -d. -f1 /etc/flexnode/bootstrap-token").strip()
        before = len(self.requests(lab.kube_json("get", "csr")["items"], node))
        put_expired()
        status = json.loads(lab.node_sh(node, "/opt/flexnode/bin/flexnode status -o json || true"))
        need(any(pr.get("reason") == "CertificateExpired" for pr in status.get("problems") or []),
             "flexnode status with the agent stopped shows no expired certificate: %s" % status.get("problems"))
        t = time.time()
        lab.node_sh(node, "systemctl start flexnode-agent")
        replaced = self.replaced_by_token(node, before, "system:bootstrap:" + token_id)
        took = time.time() - t
        need(lab.node_sh(node, "systemctl is-active flexnode-agent || true").strip() == "active",
             "%s's agent is not active after replacing its certificate" % node)
        journal = lab.node_sh(node, "journalctl --no-pager -o cat -u flexnode-agent --since=-%ds" % (took + 30))
        need("expired certificate was replaced through the bootstrap token" in journal,
             "%s's journal does not say the certificate was replaced" % node)

        # The token deleted from the cluster: nothing can replace the certificate.
        rc, _, err = lab.kubectl("-n", "kube-system", "delete", "secret", "bootstrap-token-" + token_id)
        need(rc == 0, "delete the token: %s" % err.strip())
        # The API server keeps a token's authentication for 10 s.
        time.sleep(11)
        put_expired()
        lab.node_sh(node, "systemctl start flexnode-agent || true")

        def stopped():
            state = lab.node_sh(node, "systemctl show flexnode-agent -p ActiveState -p Result --value").split()
            return state if "failed" in state or "inactive" in state else None
        state = wait_until("%s's agent stopping on the expired certificate" % node, stopped, 90, 1)
        journal = lab.node_sh(node, "journalctl --no-pager -o cat -u flexnode-agent -n 30")
        need("CertificateExpired" in journal or "expired and the bootstrap token did not replace" in journal,
             "%s's journal does not name the fault:\n%s" % (node, journal[-800:]))
        status = json.loads(lab.node_sh(node, "/opt/flexnode/bin/flexnode status -o json || true"))
        fault = [pr for pr in status.get("problems") or [] if pr.get("reason") == "CertificateExpired"]
        need(fault and "bootstrap-token" in json.dumps(fault[0]), "flexnode status: %s" % status.get("problems"))
        rc = subprocess.run([lab.native_run, "exec", node, "/root/flexnode", "join", "--config", "/root/join.yaml"],
                            capture_output=True, text=True, timeout=180)
        need(rc.returncode == 78, "flexnode join with a dead token exits %d, not 78: %s"
             % (rc.returncode, (rc.stderr or rc.stdout).strip()[-400:]))

        # The fix the fault names: a new token bound to the node in /etc/flexnode/bootstrap-token.
        p = subprocess.run([cp, "bootstrap-token", "--groups",
                            "system:bootstrappers:flexnode,system:bootstrappers:flexnode:" + node,
                            "--dir", lab.cp_dir], capture_output=True, text=True, timeout=60)
        need(p.returncode == 0, "bootstrap-token: %s" % p.stderr.strip())
        with open(p.stdout.strip()) as f:
            new = [line.split("token:", 1)[1].strip() for line in f if line.strip().startswith("token:")]
        need(len(new) == 1, "no token in %s" % p.stdout.strip())
        lab.node_write(node, "/etc/flexnode/bootstrap-token", new[0] + "\n")
        before = len(self.requests(lab.kube_json("get", "csr")["items"], node))
        lab.node_sh(node, "systemctl reset-failed flexnode-agent || true; systemctl start flexnode-agent")
        self.replaced_by_token(node, before, "system:bootstrap:" + new[0].split(".")[0])
        detail("replaced through the token in %.1f s; with the token gone: agent %s, status and "
               "journal name CertificateExpired, join exits 78; a new token and a restart: running again"
               % (took, "/".join(state)))

    def replaced_by_token(self, node, before, sender):
        """NODE's next certificate request after its first BEFORE, sent by SENDER, approved
        BoundBootstrapToken, its certificate in the kubeconfig and the agent Ready."""
        lab = self.lab

        def issued():
            mine = self.requests(lab.kube_json("get", "csr")["items"], node)[before:]
            done = [c for c in mine if c["status"].get("certificate")]
            return done[0] if done else None
        c = wait_until("%s's new certificate" % node, issued, 90, 1)
        need(c["spec"]["username"] == sender, "%s's request was sent by %s, not %s"
             % (node, c["spec"]["username"], sender))
        need(approval(c) == "BoundBootstrapToken", "%s's request: %s" % (node, c["status"].get("conditions")))

        def ready():
            st = json.loads(lab.node_sh(node, "/opt/flexnode/bin/flexnode status -o json || true"))
            kc = lab.node_sh(node, "cat /etc/flexnode/kubeconfig")
            fresh = self.requests(lab.kube_json("get", "csr")["items"], node)[-1]["status"].get("certificate")
            return st if st.get("phase") == "Ready" and fresh and fresh in kc else None
        wait_until("%s Ready on its new certificate" % node, ready, 90, 1)
        return c

    def c_renewals(self):
        """While the checks' operations ran, each agent renewed its certificate at least twice
        (the suite's lab: 600 s certificates renewed at 40-45 % of their life): each renewal
        asked by the node's own identity with a new key (requests are named by their key) and
        approved Renewal, its kubeconfig holding the newest certificate; node-2's agent, which no
        upgrade replaced, is the invocation that ran the first check (no restart); and not one
        request of an agent was refused (401/403) in the API server's audit log."""
        lab = self.lab

        # A suite quicker than two renewal intervals (30 s each) waits for the second.
        def twice():
            csrs = lab.kube_json("get", "csr")["items"]
            return csrs if all(
                len([c for c in self.requests(csrs, n)
                     if c["spec"]["username"] == "system:flexnode:" + n
                     and parse_time(c["metadata"]["creationTimestamp"]) >= self.started]) >= 2
                for n in lab.token_nodes) else None
        csrs = wait_until("two renewals of each certificate since the suite started", twice, 90, 2)
        counts = {}
        for n in lab.token_nodes:
            renewals = [c for c in self.requests(csrs, n) if c["spec"]["username"] == "system:flexnode:" + n]
            need(all(approval(c) == "Renewal" for c in renewals),
                 "%s's renewals: %s" % (n, [c["status"].get("conditions") for c in renewals]))
            during = [c for c in renewals if parse_time(c["metadata"]["creationTimestamp"]) >= self.started]
            need(len(during) >= 2, "%s renewed %d times during the suite" % (n, len(during)))
            kc = lab.node_sh(n, "cat /etc/flexnode/kubeconfig")
            need(renewals[-1]["status"].get("certificate") in kc,
                 "%s's kubeconfig does not hold its newest certificate" % n)
            counts[n] = len(during)
        need("node-2" in counts, "node-2 did not join with a bootstrap token")
        need(self.invocation("node-2") == self.invocations["node-2"], "node-2's agent restarted")
        codes = {}
        with open(os.path.join(lab.cp_dir, "logs/audit.log")) as fh:
            for line in fh:
                e = json.loads(line)
                if e.get("stage") == "ResponseComplete" and e["user"]["username"].startswith("system:flexnode:"):
                    code = (e.get("responseStatus") or {}).get("code", 0)
                    codes[code] = codes.get(code, 0) + 1
        need(not (codes.get(401) or codes.get(403)), "agents' requests refused: %s" % codes)
        detail("renewals during the suite: %s; node-2's agent never restarted; the agents' requests "
               "by code: %s" % (", ".join("%s %d" % kv for kv in sorted(counts.items())),
                                 dict(sorted(codes.items()))))

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
            "spec": {"nodeName": n, "terminationGracePeriodSeconds": 5,
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
        # No drain: the suite's pods are bound to their nodes and restart with the machine
        # (the drains' own checks are e2e/native/drain.py's).
        p = subprocess.run([lab.flexnode, "rollout", "--kubeconfig", lab.kubeconfig, "reboot",
                            "--selector", SELECTOR, "--max-unavailable", "1", "--name", name,
                            "--wave-timeout", "5m", "--no-drain"], capture_output=True, text=True,
                           timeout=900)
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
        st, n, took = self.repave_to(node, {"version": lab.k8s_version})
        shown = st.get("node") or {}
        need(shown.get("activeSide") == "kube2" and shown.get("appliedKubernetesVersion") == lab.k8s_version,
             "flexnode status after the repave: %s" % shown)
        need(n["status"]["nodeInfo"]["kubeletVersion"] == lab.k8s_version,
             "%s's kubelet is %s after the repave" % (node, n["status"]["nodeInfo"]["kubeletVersion"]))
        gone = lab.node_sh(node, "test -e /var/lib/machines/kube1 && echo left || echo gone").strip()
        need(gone == "gone", "kube1's tree is %s after the repave" % gone)
        for other, leader in others.items():
            now = lab.node_sh(other, "machinectl show kube1 -p Leader --value").strip()
            need(now == leader, "%s's machine restarted during %s's repave (%s -> %s)" % (other, node, leader, now))
        # The pod bound to the Node (the same name again) is run anew by the new kubelet, in
        # the new range.
        self.pods_back((node,))
        detail("%s repaved kube1 -> kube2 (%s -> %s, range %s) in %.1f s from the Node's deletion; "
               "%d pod-to-pod fetches after, %d through Services"
               % (node, lab.join_version, lab.k8s_version, n["spec"]["podCIDR"], took, self.across(),
                  self.through_services(120)))


CHECKS = [
    ("three-nodes-join", Suite.c_join, NATIVE),
    ("joined-with-bootstrap-tokens-alone", Suite.c_token_join, NATIVE),
    ("joined-through-an-exec-plugin", Suite.c_exec_join, NATIVE),
    ("pod-ranges-from-the-cluster", Suite.c_pod_ranges, NATIVE),
    ("pod-on-every-node", Suite.c_pod_on_every_node, NATIVE),
    ("pod-to-pod-across-nodes", Suite.c_pod_to_pod, NATIVE),
    ("service-clusterip-from-every-node", Suite.c_services, NATIVE),
    ("service-by-dns-name-from-every-node", Suite.c_dns, NATIVE),
    ("rollout-reboot-in-waves-of-one", Suite.c_rollout, NATIVE),
    ("repave-one-node-pods-across-after", Suite.c_repave, NATIVE),
    ("fleet-upgraded-by-its-machines-alone", Suite.c_fleet_upgrade, NATIVE),
    ("labels-and-taints-from-the-machine", Suite.c_node_settings, NATIVE),
    ("version-without-an-image-refused-before-the-old-side-stops", Suite.c_missing_version, NATIVE),
    ("machine-downloads-refused-out-loud", Suite.c_downloads_refused, NATIVE),
    ("node-image-built-by-one-command-twice-the-same", Suite.c_node_image_command, NATIVE),
    ("two-nodes-upgraded-at-once-each-its-own", Suite.c_two_upgrades, NATIVE),
    ("exec-node-kubelet-plugin-follows-the-upgrade", Suite.c_plugin_follows_upgrade, NATIVE),
    ("token-of-one-node-denied-another-s-identity", Suite.c_other_identity_denied, NATIVE),
    ("certificates-renewed-while-operations-ran", Suite.c_renewals, NATIVE),
    ("expired-certificate-replaced-through-the-token", Suite.c_expired, NATIVE),
    # Drains (e2e/native/drain.py): the suite's bound pods are deleted by the first.
    ("reboot-drains-budgeted-pods-elsewhere-first", Suite.c_drain_reboot, NATIVE),
    ("budget-never-met-fails-at-the-drain-timeout", Suite.c_drain_timeout, NATIVE),
    ("agent-killed-mid-drain-resumes-one-restart", Suite.c_drain_crash, NATIVE),
    ("rollout-reboot-never-breaks-the-budget", Suite.c_drain_rollout, NATIVE),
    ("operators-cordon-survives-an-operation", Suite.c_operator_cordon, NATIVE),
    ("one-terminal-result-per-operation", Suite.c_one_result_each, NATIVE),
    # Last: its node's kube-proxy pod cannot pull its image (no registry), as it should not.
    ("offline-node-joins-runs-a-pod-and-repaves-from-archives", Suite.c_offline_node, NATIVE),
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
