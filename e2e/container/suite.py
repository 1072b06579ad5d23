#!/usr/bin/env python3
"""e2e/container/suite.py — the container-install suite, run by `e2e/container/run suite`.

  suite.py --lab DIR [--only a,b,...] [--list]

DIR is a lab `e2e/container/run` brought up: the guest provisioned by Ignition from `flexnode
ignition`'s config and rebooted into its first boot, where the bootstrap unit joins. Same
output and rules as e2e/host/suite.py (its runner and lab helpers are shared: ../host/lab.py):
`PASS name (s)` / `FAIL name (s): why`, `N passed, M failed, K not run in T s`; every guest
script under `set -e`; negative checks wait for the daemon's own account first.
Python 3 stdlib only.
"""

import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "host"))

from lab import (BOTH, MSG_REBOOT_DONE, MSG_UPGRADE_DONE, NATIVE, QEMU, Fail, Lab, SuiteBase, detail, need, op_view,  # noqa: E402
                 run_suite, show_guest, wait_until)
from node_checks import NodeChecks, node_context  # noqa: E402
from security_checks import SecurityChecks  # noqa: E402

AGENT_IMAGE_NAME = "flexnode.invalid/agent"   # src/effects/host/layout.rs
CTR = "ctr --namespace flexnode"


class ContainerLab(Lab):
    def __init__(self, d):
        super().__init__(d)
        self.images = {k[len("IMAGE_"):].lower(): v for k, v in self.st.items() if k.startswith("IMAGE_")}
        self.reg = self.st["GUEST_REG"]

    def facts(self):
        """One ssh round trip: the agent unit, its container, the selection, boot_id."""
        out = self.sh(r"""
systemctl show flexnode-agent -p ActiveState,SubState,MainPID,NRestarts,Result,ExecMainStartTimestamp,LoadState | sed 's/^/agent./'
systemctl show flexnode-bootstrap -p ActiveState,Result,ExecMainStatus,LoadState | sed 's/^/bootstrap./'
echo "selected=$(sed -n 's/^FLEXNODE_AGENT_IMAGE=//p' /etc/flexnode/agent-image.env 2>/dev/null)"
echo "last_good=$(sed -n 's/^FLEXNODE_AGENT_IMAGE=//p' /etc/flexnode/agent-image.last-good.env 2>/dev/null)"
echo "task=$(ctr --namespace flexnode tasks ls 2>/dev/null | awk '$1 == "flexnode-agent" { print $2 " " $3 }')"
echo "boot_id=$(cat /proc/sys/kernel/random/boot_id)"
""")
        f = {}
        for line in out.splitlines():
            k, _, v = line.partition("=")
            f[k] = v
        return f

    def agent_cli(self, args, timeout=120):
        """`flexnode ARGS` where the node's flexnode is: in the agent's container. `ctr tasks
        exec` can lose a short process's output to its IO setup (an empty stdout with status
        0, seen on native nodes): asked again, a few times, until it answers."""
        for _ in range(10):
            out = self.sh("%s tasks exec --exec-id suite-$$ flexnode-agent /usr/bin/flexnode %s"
                          % (CTR, args), timeout)
            if out.strip():
                return out
            time.sleep(0.5)
        raise Fail("`flexnode %s` in the agent's container printed nothing, 10 times" % args)

    def status_json(self):
        return json.loads(self.agent_cli("status -o json"))

    def phase(self):
        """The node's phase as the agent's store has it (`flexnode status -o json`)."""
        return self.status_json().get("phase")

    def image_ref(self, name):
        return "%s@%s" % (AGENT_IMAGE_NAME, self.images[name])

    def registry(self, what):
        p = subprocess.run([os.path.join(self.repo, "e2e/container/run"), "registry", what, "--dir", self.dir],
                           capture_output=True, text=True, timeout=60)
        need(p.returncode == 0, "registry %s: %s" % (what, p.stderr.strip()))
        # From the node: `/v2/` answers exactly while the registry is up (a relay or QEMU's
        # forward may still take the connection, but nothing answers behind it).
        # (Plain HTTP to its TLS port: Go's server answers `HTTP/1.0 400`.)
        host, port = self.reg.split(":")

        def answers():
            out = self.sh("timeout 10 bash -c 'exec 3<>/dev/tcp/%s/%s && printf \"GET /v2/ HTTP/1.0\\r\\n\\r\\n\" >&3 "
                          "&& head -c 12 <&3' 2>/dev/null || true" % (host, port), 60)
            return out.startswith("HTTP/")
        if what == "start":
            wait_until("the registry to answer at %s" % self.reg, answers, 60, 1)
        else:
            need(not answers(), "after `registry stop` the registry still answers at %s" % self.reg)

    def provision(self, kubelet=True, **settings):
        """The first boot's provisioning again, for a re-join: `flexnode ignition` renders the
        lab's join config with `settings` changed, upstream Ignition's fetch-offline and files
        stages apply it to the guest's root, the units Ignition's preset names are enabled
        and the bootstrap unit is started. Without `kubelet` the config names no node image:
        the machine is the minimal tree, and the join waits for no Node (the re-joins that
        check the agent's own side, where a node image's unpack would only cost time)."""
        conf = {}
        with open(os.path.join(self.dir, "join.yaml")) as fh:
            for line in fh:
                if ":" in line and not line.startswith("#"):
                    k, _, v = line.partition(":")
                    conf[k.strip()] = v.strip()
        if not kubelet:
            # The token stays when the agent joins with it (apiServer).
            for k in ("nodeImages", "sandboxImage") + (() if "apiServer" in conf else ("bootstrapTokenFile",)):
                conf.pop(k, None)
        conf.update(settings)
        n = len([x for x in os.listdir(self.dir) if x.startswith("reprovision-")])
        out = os.path.join(self.dir, "reprovision-%d" % n)
        os.mkdir(out, 0o700)
        cfg = os.path.join(out, "join.yaml")
        fd = os.open(cfg, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write("".join("%s: %s\n" % kv for kv in conf.items()))
        p = subprocess.run([self.flexnode, "ignition", "--config", cfg, "--out", out],
                           capture_output=True, text=True, timeout=60)
        need(p.returncode == 0, "flexnode ignition: %s" % p.stderr.strip())
        ign = subprocess.run([os.path.join(self.repo, "e2e/ignition/build"), "ignition"],
                             capture_output=True, text=True, timeout=900)
        need(ign.returncode == 0, "e2e/ignition/build ignition: %s" % ign.stderr.strip()[-300:])
        self.push(ign.stdout.strip(), "/root/ignition")
        self.push(os.path.join(out, "config.ign"), "/root/config.ign")
        self.sh("""chmod 600 /root/config.ign; mkdir -p /run/ignition; rm -f /run/ignition.json
for stage in fetch-offline files; do
  IGNITION_CONFIG_FILE=/root/config.ign /root/ignition -platform file -stage $stage -root / -log-to-stdout \
    > /root/ignition-$stage.log 2>&1 || { tail -20 /root/ignition-$stage.log; exit 1; }
done
rm -f /root/ignition /root/config.ign /run/ignition.json
systemctl daemon-reload
for u in $(sed -n 's/^enable //p' /etc/systemd/system-preset/20-ignition.preset); do systemctl preset "$u"; done
systemctl reset-failed flexnode-bootstrap 2>/dev/null || true
systemctl start --no-block flexnode-bootstrap""", 300)


class Suite(SuiteBase, NodeChecks, SecurityChecks):
    MODE = "container"

    def planted_secrets(self):
        return [("the URL query token", "c0ffee-secret"), ("the URL password", "hunter2-secret")]

    def wait_agent(self, timeout=600, pid_not=None):
        def up():
            f = self.lab.facts()
            ok = f.get("agent.ActiveState") == "active" and f.get("task", "").endswith("RUNNING")
            return f if ok and (pid_not is None or f.get("task", "").split()[0] != pid_not) else None
        return wait_until("flexnode-agent active with its container running", up, timeout, 5)

    def version(self):
        return self.lab.agent_cli("version").strip()

    def upgrade(self, name, which, tag=None):
        lab = self.lab
        self.created.append(name)
        p = subprocess.run([lab.flexnode, "op", "--kubeconfig", lab.kubeconfig, "create", "upgrade",
                            "--node", lab.node, "--name", name,
                            "--image", "oci://%s/flexnode/agent:%s" % (lab.reg, tag or which),
                            "--digest", lab.images[which]], capture_output=True, text=True, timeout=60)
        need(p.returncode == 0, "flexnode op create upgrade %s: rc %d: %s" % (name, p.returncode, (p.stderr or p.stdout).strip()))

    def upgrade_ok(self, name, which):
        """An AgentUpgrade to image `which`: Complete/Succeeded, the agent's container runs it
        (selected, and its `version`), the image it left is the last good one."""
        lab = self.lab
        f0 = self.wait_agent(120)
        was = f0.get("selected")
        t0 = time.time()
        since = int(lab.sh("date +%s").strip())
        self.upgrade(name, which)
        self.expect(name, "Complete", "Succeeded", 600, MSG_UPGRADE_DONE)
        f = self.wait_agent(300)
        need(f.get("selected") == lab.image_ref(which), "agent-image.env selects %r, not %r" % (f.get("selected"), lab.image_ref(which)))
        need(f.get("last_good") == was, "the last good image is %r, not the one the upgrade left (%r)" % (f.get("last_good"), was))
        ver = self.version()
        want = "flexnode " + (lab.ver_next if which == "next" else lab.ver_base)
        need(ver == want, "the agent's container answers %r, expected %r" % (ver, want))
        detail("%s -> %s in %.0f s" % (was, f.get("selected"), time.time() - t0))
        self.measure_upgrade(name, since)
        self.one_result(name)

    def rejected(self, name, params, forbidden):
        self.create_raw(name, "AgentUpgrade", params)
        v = self.terminal(name, 300)
        need((v[0], v[1]) == ("Failed", "InvalidParameters"), "%s ended %s/%s (%r)" % (name, v[0], v[1], v[2]))
        for word in forbidden:
            need(word not in v[2], "%s: the message echoes %r: %r" % (name, word, v[2]))
        j = self.lab.journal("-u flexnode-agent -o cat --since -10min")
        for word in forbidden:
            need(word not in j, "%s: the agent's journal echoes %r" % (name, word))
        detail("%s: %r" % (name, v[2]))
        self.one_result(name)

    def swap_off(self):
        """The lab's swap file was on at first boot; the join turned it off for good: no
        active swap, its unit masked, its fstab line commented out."""
        out = self.lab.sh("swapon --show --noheadings; echo unit=$(systemctl is-enabled swapfile.swap || true); "
                          "grep -c '^# flexnode: swap off.*/swapfile' /etc/fstab || true")
        lines = out.strip().splitlines()
        need(len(lines) == 2 and lines[0] == "unit=masked" and lines[1] == "1",
             "swap is not off for good: %r" % out)

    def nothing_left(self):
        """What a reset leaves of the agent (empty when nothing): units and their links,
        selection files, containers, the machine, the runtime files."""
        return self.lab.sh(r"""
find /etc/systemd/system -name 'flexnode*' | sed 's/^/unit file: /'
systemctl list-units --all --plain --no-legend 'flexnode*' | awk '$2 != "not-found" && $3 != "inactive" {print "unit: " $0}'
ctr --namespace flexnode containers ls -q | sed 's/^/container: /'
for m in kube1 kube2; do
  if [ "$(systemctl is-active systemd-nspawn@$m || true)" = active ]; then echo "machine $m still running"; fi
  if [ -e /var/lib/machines/$m ]; then echo "machine tree /var/lib/machines/$m left"; fi
  for f in /etc/systemd/nspawn/$m.nspawn /etc/systemd/system/systemd-nspawn@$m.service.d/flexnode.conf; do
    if [ -e $f ]; then echo "left: $f"; fi
  done
done
if [ -e /etc/flexnode ]; then echo "left: /etc/flexnode ($(ls -A /etc/flexnode | tr '\n' ' '))"; fi
if [ -e /etc/modules-load.d/flexnode.conf ]; then echo "left: /etc/modules-load.d/flexnode.conf"; fi
""").strip()

    def reset_leaves_nothing(self, how):
        def clean():
            left = self.nothing_left()
            if left:
                raise Fail(left.replace("\n", "; "))
            return True
        wait_until("no flexnode unit, link, container, machine or runtime file left after %s" % how, clean, 300, 5)

    def rejoined(self, which, timeout=900):
        """After a re-provisioning: the bootstrap unit joined, the agent runs image `which`,
        and finished operations are not run again."""
        lab = self.lab
        f = self.wait_agent(timeout)
        need(f.get("selected") == lab.image_ref(which), "re-joined on %r, not %r" % (f.get("selected"), lab.image_ref(which)))
        b = wait_until("the bootstrap unit done", lambda: (lambda g: g if g.get("bootstrap.Result") == "success"
                                                            and g.get("bootstrap.ActiveState") == "active" else None)(lab.facts()), 300, 3)
        need(b.get("bootstrap.ExecMainStatus") == "0", "bootstrap: %s" % b)
        need(lab.phase() == "Ready", "phase %r after the re-join" % lab.phase())
        for name in self.created:
            self.one_result(name)

    # ------------------------------------------------------------------ checks
    def c_first_boot(self):
        """First boot from the rendered Ignition: the bootstrap unit pulled the install's
        image (TLS + auth through containerd's hosts.toml) and joined; the agent runs the
        image by its local name, in a container inside its unit's cgroup; the bootstrap
        inputs are gone; /usr is read-only; swap is off for good; the kernel modules the
        machines need were loaded by the host's modprobe through host-exec."""
        self.first_join(self.wait_agent(900))
        self.swap_off()

    def c_provisioned_joins(self):
        """A native node has no first boot of its own: the rendered Ignition config applied
        to the running node (`provision()`, as for every re-join) starts the bootstrap unit;
        then what `first-boot-joins` asserts but swap (the node has none of its own) — its
        kernel's modules are this host's, present already: none loaded, none logged."""
        self.lab.provision()
        self.first_join(self.wait_agent(900))

    def first_join(self, f):
        lab = self.lab
        need(f.get("bootstrap.Result") == "success" and f.get("bootstrap.ExecMainStatus") == "0",
             "bootstrap unit: %s/%s status %s" % (f.get("bootstrap.ActiveState"), f.get("bootstrap.Result"),
                                                   f.get("bootstrap.ExecMainStatus")))
        need(f.get("selected") == lab.image_ref("base"),
             "agent-image.env selects %r, not the install's image %r" % (f.get("selected"), lab.image_ref("base")))
        pid = f.get("task", "").split()[0]
        cg = lab.sh("grep '^0::' /proc/%s/cgroup" % pid).strip()
        need(cg == "0::/system.slice/flexnode-agent.service",
             "the agent's container is in cgroup %r, not under its unit's" % cg)
        out = lab.sh("test ! -e /etc/flexnode/bootstrap && echo gone; "
                     "findmnt -no OPTIONS /usr; if touch /usr/.flexnode-probe 2>/dev/null; then echo writable; fi")
        need("gone" in out, "the bootstrap inputs are still in /etc/flexnode/bootstrap")
        need(out.splitlines()[1].startswith("ro") and "writable" not in out, "/usr is not read-only: %r" % out)
        # The join ran in a container: the host's modprobe ran by host-exec (chroot /host).
        self.kernel_modules(lab.sh("journalctl -o cat -u flexnode-bootstrap"))
        st = lab.status_json()
        need(st.get("phase") == "Ready" and (st.get("node") or {}).get("installMode") == "container",
             "flexnode status: phase %r, node %s" % (st.get("phase"), st.get("node")))
        # Joined with what a cluster gives out (the lab mints no certificate for the node): its
        # key made on the node, its certificate asked by the bootstrap token bound to it and
        # approved by `flexnode approver`.
        with open(os.path.join(lab.dir, "bootstrap-token")) as fh:
            token_id = fh.read().strip().split(".")[0]
        rc, out, err = lab.kubectl("get", "csr", "-o", "json")
        need(rc == 0, "kubectl get csr: %s" % err.strip())
        mine = [c for c in json.loads(out)["items"]
                if c["metadata"]["name"].startswith("flexnode-%s-" % lab.node)
                and c["spec"]["username"] == "system:bootstrap:" + token_id]
        need(mine, "no certificate request of %s sent by its bootstrap token" % lab.node)
        newest = max(mine, key=lambda c: c["metadata"]["creationTimestamp"])
        approved = [c.get("reason") for c in newest["status"].get("conditions") or [] if c["type"] == "Approved"]
        need(approved == ["BoundBootstrapToken"] and newest["status"].get("certificate")
             and newest["status"]["certificate"] in lab.sh("cat /etc/flexnode/kubeconfig"),
             "%s's request %s: %s" % (lab.node, newest["metadata"]["name"], newest["status"].get("conditions")))
        detail("joined with the bootstrap token alone: %s approved BoundBootstrapToken"
               % newest["metadata"]["name"])

    def c_no_agent_files(self):
        """Walks the host's filesystem: nothing of the agent outside /etc/flexnode and
        /var/lib/flexnode (its units, their links, the kernel modules' boot list, the machine
        units' drop-in, the PrivateTmp= directories systemd makes for the units while they
        run, and containerd's own stores aside) — no file
        named after it, no copy of its binary (by content), nothing in /opt or /usr/local."""
        lab = self.lab
        pid = self.wait_agent(60).get("task", "").split()[0]
        out = lab.sh(r"""
agent=$(sha256sum /proc/%s/exe | cut -d' ' -f1)
echo "agent=$agent"
# the root's filesystem, and /usr and /root where they are others (a native node's binds)
roots=/; for d in /usr /root; do [ "$(stat -c %%d $d)" = "$(stat -c %%d /)" ] || roots="$roots $d"; done
find $roots -xdev \( -path /proc -o -path /sys -o -path /run -o -path /etc/flexnode -o -path /var/lib/flexnode \
  -o -path /var/lib/containerd -o -path /var/lib/machines -o -path /var/log/journal \) -prune \
  -o -name '*flexnode*' -print \
  | grep -v -E '^(/etc/systemd/system/([a-z.-]+\.wants/)?flexnode-[a-z-]+\.service|/etc/modules-load\.d/flexnode\.conf|/etc/systemd/system/systemd-nspawn@kube[12]\.service\.d/flexnode\.conf|/(var/)?tmp/systemd-private-[0-9a-f]+-flexnode-[a-z-]+\.service-[A-Za-z0-9]+)$' \
  | sed 's/^/named=/' || true
find $roots -xdev \( -path /proc -o -path /sys -o -path /run -o -path /var/lib/containerd \) -prune \
  -o -type f -size +4M -print0 | xargs -0 -r sha256sum | awk -v a="$agent" '$1 == a { print "copy=" $2 }'
find /opt /usr/local -mindepth 1 \( -type f -o -name '*flexnode*' \) | sed 's/^/optlocal=/'
""" % pid, 600)
        named = [l[6:] for l in out.splitlines() if l.startswith("named=")]
        copies = [l[5:] for l in out.splitlines() if l.startswith("copy=")]
        need(not named, "agent files on the host: %s" % named)
        need(not copies, "copies of the agent binary on the host: %s" % copies)
        need(not any(l.startswith("optlocal=") for l in out.splitlines()), "/opt or /usr/local is not empty: %s" % out)
        detail("no agent file outside /etc/flexnode, /var/lib/flexnode; the binary (%s…) only in containerd"
               % out.splitlines()[0][6:18])

    def c_stop_semantics(self):
        """Stopping the agent unit while its daemon ignores SIGTERM still ends the container,
        by SIGKILL at TimeoutStopSec: the container is in the unit's cgroup. The daemon is
        the lab's stubborn image (ready, then deaf to SIGTERM) selected for the test; then
        the agent's own image again, and the agent starts."""
        lab = self.lab
        f0 = self.wait_agent(60)
        stubborn = lab.images["stubborn"]
        pinned = "%s/flexnode/agent@%s" % (lab.reg, stubborn)
        lab.sh("%s images pull --hosts-dir /etc/containerd/certs.d %s > /dev/null && %s images tag --force %s %s"
               % (CTR, pinned, CTR, pinned, lab.image_ref("stubborn")), 300)
        lab.sh("cp -p /etc/flexnode/agent-image.env /root/agent-image.env.saved && "
               "echo FLEXNODE_AGENT_IMAGE=%s > /etc/flexnode/agent-image.env && "
               "mkdir -p /run/systemd/system/flexnode-agent.service.d && "
               "printf '[Service]\\nTimeoutStopSec=15s\\n' > /run/systemd/system/flexnode-agent.service.d/stop.conf && "
               "systemctl daemon-reload && systemctl restart flexnode-agent" % lab.image_ref("stubborn"), 300)
        try:
            f = self.wait_agent(120)
            pid = f.get("task", "").split()[0]
            need(lab.agent_cli("version").strip() == "flexnode 0.0.0-stubborn", "the stubborn image does not run")
            t = time.time()
            lab.sh("systemctl stop flexnode-agent", 180)
            took = time.time() - t
            left = lab.sh("test -d /proc/%s && echo alive || true; %s tasks ls | awk '$1 == \"flexnode-agent\"'; "
                          "cat /sys/fs/cgroup/system.slice/flexnode-agent.service/cgroup.procs 2>/dev/null || true" % (pid, CTR))
            need(not left.strip(), "after the stop: %r" % left)
            need(took >= 14, "the stop took %.1f s: the daemon did not ignore SIGTERM" % took)
            need(took < 45, "the stop took %.1f s, well over TimeoutStopSec=15s" % took)
            j = lab.journal("-u flexnode-agent -o cat --since -3min")
            need("State 'stop-sigterm' timed out. Killing." in j, "the journal shows no SIGKILL at the stop timeout")
            detail("the stubborn daemon (pid %s) ignored SIGTERM; the unit stopped in %.1f s, container gone" % (pid, took))
        finally:
            lab.ssh("mv /root/agent-image.env.saved /etc/flexnode/agent-image.env; "
                    "rm -rf /run/systemd/system/flexnode-agent.service.d; systemctl daemon-reload; "
                    "systemctl reset-failed flexnode-agent; systemctl start flexnode-agent; "
                    "%s images rm %s > /dev/null" % (CTR, lab.image_ref("stubborn")), 300)
        f = self.wait_agent(300)
        need(f.get("selected") == f0.get("selected"), "the agent's image is not selected again")

    def c_upgrade(self):
        """An AgentUpgrade to the next image; the pod on the node keeps running."""
        pod = self.pod_container()
        self.upgrade_ok("c-upgrade", "next")
        self.pods_untouched(pod, "the agent's upgrade")

    def c_node_reboot(self):
        """NodeReboot restarts machine kube1: Complete `NodeReboot completed` once the
        Node is Ready again, with a new bootID, the kubelet's Rebooted Event and the pod back."""
        self.wait_agent(60)
        boot_id = self.node_boot_id()
        since = int(time.time()) - 1
        t = time.time()
        self.create("reboot", "c-reboot")
        self.expect("c-reboot", "Complete", "Succeeded", 600, MSG_REBOOT_DONE)
        new = self.kubelet_rebooted(boot_id, since)
        detail("Node bootID %s -> %s; Complete after %.0f s" % (boot_id, new, time.time() - t))

    def c_rollback(self):
        """A broken image passes the check, crash-loops as the daemon; the recovery unit runs
        the last good image, which selects itself again: Failed/DaemonFailed."""
        lab = self.lab
        f0 = self.wait_agent(60)
        rec0 = int(lab.sh("systemctl show -P ExecMainStartTimestampMonotonic flexnode-agent-recovery").strip() or 0)
        self.upgrade("c-broken", "broken")
        self.expect("c-broken", "Failed", "DaemonFailed", 600)
        f = self.wait_agent(300)
        need(f.get("selected") == f0.get("selected"), "after the rollback %r is selected, was %r" % (f.get("selected"), f0.get("selected")))
        rec = int(lab.sh("systemctl show -P ExecMainStartTimestampMonotonic flexnode-agent-recovery").strip() or 0)
        need(rec > rec0, "the recovery unit did not run during the operation")
        need(self.version() == "flexnode " + lab.ver_next, "the agent does not run the next build again")
        self.one_result("c-broken")

    def c_invalid_no_digest(self):
        self.rejected("c-invalid-no-digest", {"downloadURL": "oci://%s/flexnode/agent:next" % self.lab.reg}, [])

    def c_invalid_digest_in_url(self):
        lab = self.lab
        self.rejected("c-invalid-digest-in-url", {
            "downloadURL": "oci://%s/flexnode/agent@%s" % (lab.reg, lab.images["next"]),
            "sha256": lab.images["next"][len("sha256:"):]}, [])

    def c_invalid_archive_url(self):
        self.rejected("c-invalid-archive-url", {
            "downloadURL": "https://%s/flexnode.tar.gz?sig=c0ffee-secret" % self.lab.reg,
            "sha256": self.lab.images["next"][len("sha256:"):]}, ["c0ffee-secret"])

    def c_invalid_reference(self):
        self.rejected("c-invalid-reference", {
            "downloadURL": "oci://user:hunter2-secret@%s/Not A/Repo" % self.lab.reg,
            "sha256": self.lab.images["next"][len("sha256:"):]}, ["hunter2-secret", "Not A"])

    def c_upgrade_back(self):
        self.upgrade_ok("c-upgrade-back", "base")

    def c_broken_image_removed(self):
        """The broken image, pulled by an upgrade and never to run again, is gone from
        containerd; the install's image (not pulled by an upgrade) and the selected ones stay."""
        lab = self.lab
        out = lab.sh("%s images ls | awk 'NR > 1 { print $1, $3 }'" % CTR)
        held = [l for l in out.splitlines() if lab.images["broken"] in l]
        need(not held, "the broken image is still in containerd: %s" % held)
        need(any(lab.images["base"] in l for l in out.splitlines()), "the install's image is gone: %s" % out)
        detail("images: %s" % "; ".join(out.splitlines()))

    def c_guest_reboot(self):
        """`systemctl reboot`: the agent back on the same image, `/usr` read-only and swap off
        again, Ready; the Node Ready again and the pod's container started since."""
        lab = self.lab
        f0 = self.wait_agent(60)
        t = lab.reboot(f0.get("boot_id"))
        f = self.wait_agent(600)
        need(f.get("selected") == f0.get("selected"), "another image is selected after the reboot")
        ro = lab.sh("findmnt -no OPTIONS /usr").strip()
        need(ro.startswith("ro"), "/usr is %r after the reboot" % ro)
        self.swap_off()
        need(lab.phase() == "Ready", "phase %r after the reboot" % lab.phase())
        self.node_ready(600, int(t))
        self.pod_running_since(int(t), 660)
        detail("Node Ready and the pod running again %.0f s after the reboot began" % (time.time() - t))

    def c_power_cut_during_pull(self):
        """Power cut while the upgrade pulls an image containerd has never held (its pull
        progress is in the journal, the operation not finished): after the cold boot, one
        terminal result, and the node runs the image that result says."""
        lab = self.lab
        f0 = self.wait_agent(60)
        cursor = lab.cursor()
        self.upgrade("c-cut-pull", "fresh")
        wait_until("the pull to be under way", lambda: "pull progress" in lab.journal_after(cursor, "-u flexnode-agent -o cat"),
                   300, 0.5)
        need(op_view(lab.get_op("c-cut-pull"))[0] not in ("Complete", "Failed"), "the upgrade ended before the cut")
        self.power_cycle()
        v = self.terminal("c-cut-pull", 900)
        self.in_flight_at_cut("c-cut-pull")
        f = self.wait_agent(600)
        want = lab.image_ref("fresh") if v[0] == "Complete" else f0.get("selected")
        need(f.get("selected") == want, "%s/%s but %r is selected" % (v[0], v[1], f.get("selected")))
        detail("after the power cut: %s/%s, running %s" % (v[0], v[1], f.get("selected")))
        self.one_result("c-cut-pull")

    def c_power_cut_after_switch(self):
        """Power cut right after the image switch (agent-image.env changed): one terminal
        result, and the node runs the image that result says."""
        lab = self.lab
        f0 = self.wait_agent(60)
        target = "base" if f0.get("selected") != lab.image_ref("base") else "next"
        self.upgrade("c-cut-switch", target)
        wait_until("agent-image.env to select %s" % target,
                   lambda: lab.facts().get("selected") == lab.image_ref(target), 600, 0.5)
        self.power_cycle()
        v = self.terminal("c-cut-switch", 900)
        self.in_flight_at_cut("c-cut-switch")
        f = self.wait_agent(600)
        want = lab.image_ref(target) if v[0] == "Complete" else f0.get("selected")
        need(f.get("selected") == want, "%s/%s but %r is selected" % (v[0], v[1], f.get("selected")))
        detail("after the power cut: %s/%s, running %s" % (v[0], v[1], f.get("selected")))
        self.one_result("c-cut-switch")

    def c_agent_reset(self):
        """AgentReset: nothing left; re-join naming an explicit image (the next build's)."""
        self.wait_agent(60)
        self.create("reset", "c-reset")
        self.expect("c-reset", "Complete", "Succeeded", 600)
        self.reset_leaves_nothing("AgentReset")
        self.one_result("c-reset")
        lab = self.lab
        lab.provision(kubelet=False, agentImage="oci://%s/flexnode/agent:next" % lab.reg,
                      agentImageDigest=lab.images["next"])
        self.rejoined("next")

    def c_reset_unit(self):
        """`flexnode reset` through the reset unit: nothing left (the unit removes itself);
        re-join with the registry unreachable: the install's image containerd holds."""
        lab = self.lab
        self.wait_agent(60)
        lab.sh("systemctl start flexnode-reset", 600)
        self.reset_leaves_nothing("the reset unit")
        cursor = lab.cursor()
        lab.registry("stop")
        try:
            lab.provision(kubelet=False)
            self.rejoined("base")
            j = lab.journal_after(cursor, "-u flexnode-bootstrap -o cat")
            # The pull's own error (ctr's resolve of the image at the registry), not any
            # line that says "failed".
            pulls = [line for line in j.splitlines()
                     if "failed to resolve reference" in line and lab.reg in line
                     and any(why in line for why in ("connection refused", "connection reset", "EOF"))]
            need(pulls, "the bootstrap's pull did not fail to reach %s: %s" % (lab.reg, j[-2000:]))
            detail("the pull failed: %s" % pulls[0][-300:])
        finally:
            lab.registry("start")

    def c_offline_join(self):
        """An offline re-join: the registry down and the install's image gone from containerd;
        the config names the image's OCI archive on the node's disk, which the bootstrap unit
        imports under the image's pinned name."""
        lab = self.lab
        self.wait_agent(60)
        lab.sh("systemctl start flexnode-reset", 600)
        self.reset_leaves_nothing("the reset unit")
        base = lab.images["base"]
        lab.registry("stop")
        try:
            lab.sh("for i in $(%s images ls -q | grep -F %s); do %s images rm --sync $i > /dev/null; done; "
                   "! %s images ls -q | grep -F %s" % (CTR, base, CTR, CTR, base), 120)
            archive = "/var/lib/flexnode-offline/agent.oci.tar"
            lab.sh("mkdir -p /var/lib/flexnode-offline")
            lab.push(os.path.join(lab.dir, "images/base.oci.tar"), archive)
            lab.provision(kubelet=False, agentImageArchive=archive)
            self.rejoined("base")
            names = lab.sh("%s images ls -q" % CTR)
            need("%s/flexnode/agent:base" % lab.reg in names, "no image came from the archive: %s" % names)
            detail("joined from %s with the registry down; images: %s" % (archive, " ".join(names.split())))
        finally:
            lab.ssh("rm -rf /var/lib/flexnode-offline")
            lab.registry("start")

    def c_bootstrap_78(self):
        """On the node the deletion signal reset: a bootstrap with an impossible setting
        exits 78 and is not retried; then the lab's own config joins again, with the node
        image (a kubelet and the Node Ready again)."""
        lab = self.lab
        self.reset_leaves_nothing("the deletion signal")
        # A credential the API server refuses (a bootstrap token it does not know) cannot start
        # working by retrying: Ignition cannot know that, the join in the bootstrap container
        # does.
        secret = "%016x" % (os.getpid() * 7919)
        bogus = os.path.join(lab.dir, "refused-token")
        fd = os.open(bogus, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write("abcdef.%s\n" % secret[-16:])
        lab.provision(bootstrapTokenFile=bogus)
        samples = lab.sh(
            "for i in $(seq 15); do systemctl show flexnode-bootstrap -p ActiveState,SubState,ExecMainStatus,NRestarts,Result "
            "| tr '\\n' ' '; echo; sleep 1; done", 240)
        rows = [dict(kv.split("=", 1) for kv in line.split()) for line in samples.splitlines() if line.strip()]
        last = rows[-1]
        need(all(r.get("NRestarts") == "0" for r in rows), "flexnode-bootstrap was restarted: %s" % last)
        need(last.get("ExecMainStatus") == "78" and last.get("ActiveState") == "failed", "final state %s" % last)
        j = lab.journal("-u flexnode-bootstrap -o cat --since -5min")
        need("Credential" in j, "the bootstrap unit's journal does not name the check")
        need(secret[-16:] not in j, "the journal shows the credential")
        detail(" ".join("%s=%s" % kv for kv in sorted(last.items())))
        lab.sh("systemctl reset-failed flexnode-bootstrap; rm -rf /etc/flexnode")
        lab.provision()
        self.rejoined("base")


CHECKS = [
    ("first-boot-joins", Suite.c_first_boot, QEMU),
    ("provisioned-by-ignition-joins", Suite.c_provisioned_joins, NATIVE),
    ("node-runs-a-pod", Suite.c_pod_runs, BOTH),
    # before the power cuts (e2e/README.md, "Open findings")
    ("guest-reboot", Suite.c_guest_reboot, QEMU),
    ("no-agent-files-on-host", Suite.c_no_agent_files, NATIVE),
    ("stop-ends-container-ignoring-sigterm", Suite.c_stop_semantics, NATIVE),
    ("node-reboot", Suite.c_node_reboot, NATIVE),
    ("upgrade", Suite.c_upgrade, NATIVE),
    ("rollback-broken-image", Suite.c_rollback, NATIVE),
    ("invalid-params-no-digest", Suite.c_invalid_no_digest, NATIVE),
    ("invalid-params-digest-in-url", Suite.c_invalid_digest_in_url, NATIVE),
    ("invalid-params-archive-url", Suite.c_invalid_archive_url, NATIVE),
    ("invalid-params-unparsable-reference", Suite.c_invalid_reference, NATIVE),
    ("upgrade-back", Suite.c_upgrade_back, NATIVE),
    ("broken-image-removed", Suite.c_broken_image_removed, NATIVE),
    ("power-cut-during-pull", Suite.c_power_cut_during_pull, QEMU),
    ("power-cut-after-switch", Suite.c_power_cut_after_switch, QEMU),
    ("agent-reset-then-rejoin-explicit-image", Suite.c_agent_reset, NATIVE),
    ("reset-unit-then-rejoin-registry-unreachable", Suite.c_reset_unit, NATIVE),
    ("offline-rejoin-from-oci-archive", Suite.c_offline_join, NATIVE),
    # the Node object outlives its kubelet: the signal works on it; the reset it makes is
    # the next check's starting point
    ("deletion-signal-resets", Suite.c_deletion_signal, NATIVE),
    # its re-join is the one with a node image since the first boot: a Node for what follows
    ("bootstrap-impossible-setting-78-then-rejoin", Suite.c_bootstrap_78, NATIVE),
    ("repave-broken-new-side-rolls-back", Suite.c_repave_rolls_back, NATIVE),
    # the version change: the lab joins at the previous minor
    ("repave-kube1-to-kube2", Suite.c_repave, NATIVE),
    ("repave-back-without-the-bootstrap-token", Suite.c_repave_back_without_the_token, NATIVE),
    ("no-secret-in-processes-units-sandboxed", Suite.c_secrets_and_sandbox, NATIVE),
    ("deletion-signal-halves-change-nothing", Suite.c_deletion_signal_halves, NATIVE),
    ("one-terminal-result-per-operation", Suite.c_one_result_each, BOTH),
]


def diagnose(lab):
    """Context after a failure: the guest's flexnode journal tail and containers, the pod and its kubelet."""
    show_guest(lab, "journalctl --no-pager -o short-precise -n 40 -u 'flexnode*'; "
               "%s tasks ls; %s images ls -q" % (CTR, CTR))
    node_context(lab)


def main():
    def skipped_first(_suite):
        pass
    return run_suite(__doc__, CHECKS, Suite, ContainerLab, diagnose, "first-boot-joins", skipped_first)


if __name__ == "__main__":
    sys.exit(main())
