#!/usr/bin/env python3
"""bench/anchor-daemon.py BIN [--idle SECS] [--out FILE] — the Go agent's daemon
(`aks-flex-node daemon`, github.com/Azure/AKSFlexNode, built by bench/run from ANCHOR_SRC)
idle against a lab API server, measured like benches/footprint.rs measures flexnode's: RSS
after a minute and at the end of the window, CPU seconds per idle hour, and its API requests
in the window from the audit log. Run as root; never part of CI.

What it needs, read from its source at ae5ad0b (pkg/daemon, pkg/config, pkg/kubeauth and
unbounded's daemoncred): no kubeconfig — the API server from `node.kubelet.clusterFQDN`, its
CA from `caCertData`, and a client certificate it keeps in
/etc/aks-flex-node/daemon-credentials/ (CN system:node:<node>, O system:nodes and
aks-flex-node-daemons; with one there, the bootstrap token is never used); an AKS resource ID
that only has to parse; the `in-cluster` machine client pointed at a path the API server
answers 404 (no Machine: the daemon waits for a node signal). It watches every
MachineOperation of the cluster (the CRD the lab installs). /etc/aks-flex-node must not exist
(a real install is never touched); it is removed afterwards.
"""

import argparse
import base64
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CP = os.path.join(ROOT, "e2e", "controlplane", "run")
ETC = "/etc/aks-flex-node"
NODE = "flex-bench"
USER = f"system:node:{NODE}"


def run(*args, **kw):
    return subprocess.run(args, check=True, capture_output=True, text=True, **kw).stdout


def state(lab, key):
    for line in open(os.path.join(lab, "state")):
        if line.startswith(key + "="):
            return line.split("=", 1)[1].strip()
    sys.exit(f"{key} not in the lab's state")


def rss_mib(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def cpu_secs(pid):
    stat = open(f"/proc/{pid}/stat").read()
    f = stat[stat.rfind(")") + 2:].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


def audited(lab, start=0):
    """The daemon's requests after byte `start`, by `verb resource` (a watch when it starts)."""
    path = os.path.join(lab, "logs", "audit.log")
    by = {}
    if not os.path.exists(path):
        return by
    with open(path, "rb") as f:
        f.seek(start)
        for line in f:
            try:
                e = json.loads(line)
            except ValueError:
                continue
            if e.get("user", {}).get("username") != USER:
                continue
            verb = e.get("verb", "")
            if e.get("stage") != ("ResponseStarted" if verb == "watch" else "ResponseComplete"):
                continue
            key = f"{verb} {e.get('objectRef', {}).get('resource', e.get('requestURI', '-'))}"
            by[key] = by.get(key, 0) + 1
    return by


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("bin")
    ap.add_argument("--idle", type=int, default=600)
    ap.add_argument("--out", default="anchor-daemon.json")
    a = ap.parse_args()
    if os.path.exists(ETC):
        sys.exit(f"{ETC} exists: this host has the Go agent installed; not touching it")
    parent = tempfile.mkdtemp(prefix="flexnode-anchor-")
    lab = os.path.join(parent, "cp")
    daemon = None
    try:
        run(CP, "up", "--no-kcm", "--audit-agents", "--dir", lab)
        kubectl = [CP, "kubectl", "--dir", lab, "--"]
        run(*kubectl, "create", "clusterrolebinding", "aks-flex-node-daemons",
            "--clusterrole=cluster-admin", "--group=aks-flex-node-daemons")
        creds = os.path.join(ETC, "daemon-credentials")
        os.makedirs(creds, mode=0o700)
        key, crt, csr = (os.path.join(creds, n) for n in ("client.key", "client.crt", "client.csr"))
        pki = os.path.join(lab, "pki")
        run("openssl", "genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", key)
        os.chmod(key, 0o600)
        run("openssl", "req", "-new", "-key", key, "-out", csr,
            "-subj", f"/O=system:nodes/O=aks-flex-node-daemons/CN={USER}")
        ext = os.path.join(parent, "client.ext")
        with open(ext, "w") as f:
            f.write("[ext]\nbasicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\n"
                    "extendedKeyUsage=clientAuth\n")
        run("openssl", "x509", "-req", "-in", csr, "-CA", os.path.join(pki, "ca.crt"),
            "-CAkey", os.path.join(pki, "ca.key"), "-set_serial", "0x" + os.urandom(16).hex(),
            "-days", "365", "-sha256", "-extfile", ext, "-extensions", "ext", "-out", crt)
        os.remove(csr)
        url = state(lab, "APISERVER_URL")
        ca = base64.b64encode(open(os.path.join(pki, "ca.crt"), "rb").read()).decode()
        config = {
            "azure": {
                "bootstrapToken": {"token": "abcdef.0123456789abcdef"},
                "targetCluster": {"resourceId": "/subscriptions/00000000-0000-0000-0000-000000000000/"
                                                "resourceGroups/rg/providers/Microsoft.ContainerService/"
                                                "managedClusters/local"},
            },
            "agent": {
                "nodeName": NODE,
                "logDir": os.path.join(lab, "logs", "anchor"),
                "machineClient": {"mode": "in-cluster", "endpointUrl": "/aks-flex-noop"},
            },
            "node": {"kubelet": {"clusterFQDN": url.removeprefix("https://"), "caCertData": ca}},
        }
        cfg = os.path.join(parent, "config.json")
        with open(cfg, "w") as f:
            json.dump(config, f)
        log = open(os.path.join(lab, "logs", "anchor-daemon.log"), "w")
        started = time.monotonic()
        daemon = subprocess.Popen([a.bin, "daemon", "--config", cfg], stdout=log, stderr=log)
        # In sync once it has listed the operations (client-go lists by a streaming watch).
        while not {"list machineoperations", "watch machineoperations"} & set(audited(lab)):
            if daemon.poll() is not None or time.monotonic() - started > 120:
                log.flush()
                tail = open(os.path.join(lab, "logs", "anchor-daemon.log")).read()[-3000:]
                sys.exit(f"the Go agent's daemon did not watch MachineOperations; its log ends:\n{tail}\n"
                         f"its requests: {audited(lab)}")
            time.sleep(0.2)
        listed = time.monotonic() - started
        print(f"anchor-daemon: watching operations {listed:.2f} s after spawn; idle {a.idle} s", file=sys.stderr)
        time.sleep(min(60, a.idle))
        window_start = os.path.getsize(os.path.join(lab, "logs", "audit.log"))
        rss_warm, cpu0, t0 = rss_mib(daemon.pid), cpu_secs(daemon.pid), time.monotonic()
        while time.monotonic() - t0 < max(0, a.idle - 60):
            time.sleep(min(60, max(1, a.idle - 60 - (time.monotonic() - t0))))
            print(f"anchor-daemon: RSS {rss_mib(daemon.pid):.1f} MiB", file=sys.stderr)
        window = time.monotonic() - t0
        rss_end, cpu = rss_mib(daemon.pid), cpu_secs(daemon.pid) - cpu0
        requests = audited(lab, window_start)
        non_watch = sum(n for k, n in requests.items() if not k.startswith("watch "))
        result = {
            "listed_secs": listed,
            "rss_mib_after_1min": rss_warm,
            "rss_mib_idle": rss_end,
            "idle_window_secs": window,
            "cpu_secs_per_idle_hour": cpu * 3600 / window,
            "requests_in_window": requests,
            "non_watch_requests_per_idle_minute": non_watch * 60 / window,
        }
        print(f"anchor-daemon: {json.dumps(result)}", file=sys.stderr)
        with open(a.out, "w") as f:
            json.dump(result, f, indent=2)
    finally:
        if daemon and daemon.poll() is None:
            daemon.terminate()
            try:
                daemon.wait(timeout=15)
            except subprocess.TimeoutExpired:
                daemon.kill()
        shutil.rmtree(ETC, ignore_errors=True)
        subprocess.run([CP, "down", "--dir", lab], capture_output=True)
        shutil.rmtree(parent, ignore_errors=True)


if __name__ == "__main__":
    main()
