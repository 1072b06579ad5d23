"""e2e/host/security_checks.py — what both install suites check of the security review
(docs/reliability.md, "Security review") on a whole install: no secret the lab planted in any
process of the guest, and the agent's units as sandboxed as recorded. A mixin of the suites'
`Suite` classes (beside `lab.SuiteBase`); the suite sets `MODE` ("host" or "container") and
may list more secrets in `planted_secrets()`. Python 3 stdlib only.
"""

import base64
import os
import re

from lab import detail, need

UNITS = ("flexnode-agent.service", "flexnode-agent-recovery.service", "flexnode-reset.service",
         "flexnode-bootstrap.service")
DOC = "/etc/flexnode/README.md"   # src/units.rs DOC_PATH

# Every process of the guest (the machines' too): PID, then its command line and environment,
# NUL as space. The secrets are compared on this side: none of them is sent to the guest.
PROCESSES = r"""
for p in /proc/[0-9]*; do
  c=$(tr '\0' ' ' < $p/cmdline 2>/dev/null) || continue
  e=$(tr '\0' ' ' < $p/environ 2>/dev/null) || continue
  printf '%s\t%s\t%s\n' "${p#/proc/}" "$c" "$e"
done
"""


def recorded_exposure(repo, mode):
    """{unit: exposure} for `mode`, from tests/support/sandbox.rs (the one record of them)."""
    with open(os.path.join(repo, "tests/support/sandbox.rs")) as fh:
        text = fh.read()
    return {u: float(e) for m, u, e in re.findall(r'\("(\w+)", "([\w.-]+)", ([0-9.]+)\)', text) if m == mode}


def capability_mask(repo, mode):
    """The capabilities the units of `mode` keep, as /proc/PID/status shows a set: the host's
    from tests/support/sandbox.rs's HOST_CAPABILITIES, the container's also its
    CONTAINER_EXTRA_CAPABILITIES."""
    with open(os.path.join(repo, "tests/support/sandbox.rs")) as fh:
        text = fh.read()
    names = ["HOST_CAPABILITIES"] + (["CONTAINER_EXTRA_CAPABILITIES"] if mode == "container" else [])
    mask = 0
    for name in names:
        table = re.search(r"const %s: &\[\(&str, u32\)\] = &\[(.*?)\];" % name, text, re.S)
        need(table, "no %s in tests/support/sandbox.rs" % name)
        mask |= sum(1 << int(n) for n in re.findall(r'\("CAP_\w+", (\d+)\)', table.group(1)))
    return mask


def excerpts(text, key, where):
    """40 characters from the middle of the value of `key` in a kubeconfig's `text` (YAML or
    JSON; base64 of a PEM), and 40 from the middle of that PEM's body: a key leaked as PEM
    holds only the second."""
    m = re.search(r'%s"?\s*:\s*"?([A-Za-z0-9+/=]{200,})' % re.escape(key), text)
    if not m:
        raise AssertionError("no %s in %s" % (key, where))
    pem = base64.b64decode(m.group(1)).decode()
    body = "".join(l for l in pem.splitlines() if not l.startswith("-----"))
    return [m.group(1)[100:140], body[100:140]]


class SecurityChecks:
    MODE = None

    def planted_secrets(self):
        """(what, secret) pairs the suite planted beyond the lab's own."""
        return []

    def lab_secrets(self):
        d = self.lab.dir
        # The lab's minted credential, or the key the node made itself (a token join).
        minted = os.path.join(d, "node.kubeconfig")
        if os.path.exists(minted):
            with open(minted) as fh:
                stored, pem = excerpts(fh.read(), "client-key-data", minted)
        else:
            stored, pem = excerpts(self.lab.sh("cat /etc/flexnode/kubeconfig"), "client-key-data",
                                   "the node's /etc/flexnode/kubeconfig")
        out = [("the node's private key (base64 as stored)", stored), ("the node's private key (its PEM)", pem)]
        for what, name in (("the registry password", "registry.password"), ("the bootstrap token", "bootstrap-token")):
            with open(os.path.join(d, name)) as fh:
                s = fh.read().strip()
            need(len(s) >= 16, "the lab's %s is too short to look for" % what)
            out.append((what, s))
        return out + self.planted_secrets()

    def c_secrets_and_sandbox(self):
        """No planted secret in any process's command line or environment (the agent's, the
        machines' kubelet and containerd, ctr on the container install), and every unit no
        more exposed than recorded (`systemd-analyze security` in the guest), documented by a
        file that exists, its daemon (host install) without new privileges, with seccomp."""
        lab = self.lab
        secrets = self.lab_secrets()
        rows = [l.split("\t") for l in lab.sh(PROCESSES, 120).splitlines() if l.count("\t") == 2]
        # the whole table (a QEMU guest's kernel threads too; a native node has none)
        need(len(rows) > 10, "only %d processes read in the guest" % len(rows))
        need(any("flexnode daemon" in r[1] or "/usr/bin/flexnode daemon" in r[1] for r in rows),
             "no agent daemon among the guest's %d processes" % len(rows))
        need(any("kubelet" in r[1] for r in rows) and any("containerd" in r[1] for r in rows),
             "no kubelet or no containerd among the guest's processes")
        for pid, cmdline, environ in rows:
            for what, s in secrets:
                need(s not in cmdline, "%s is on the command line of pid %s" % (what, pid))
                need(s not in environ, "%s is in the environment of pid %s (%s)" % (what, pid, cmdline[:80]))
        want = recorded_exposure(lab.repo, self.MODE)
        need(set(want) == set(UNITS), "tests/support/sandbox.rs records %s for %s" % (sorted(want), self.MODE))
        seen = []
        for unit in UNITS:
            out = lab.sh("systemd-analyze security --no-pager %s | tail -1; "
                         "systemctl show -P Documentation %s" % (unit, unit))
            m = re.search(r"Overall exposure level for \S+: ([0-9.]+)", out)
            need(m, "no exposure for %s: %r" % (unit, out[-300:]))
            level = float(m.group(1))
            need(level <= want[unit], "%s is more exposed (%.1f) than recorded (%.1f)" % (unit, level, want[unit]))
            need("file://" + DOC in out, "%s's Documentation= is not file://%s: %r" % (unit, DOC, out[-200:]))
            seen.append("%s %.1f" % (unit.replace("flexnode-", "").replace(".service", ""), level))
        lab.sh("test -s %s" % DOC)
        main = lab.sh("grep -E '^(NoNewPrivs|Seccomp|CapBnd):' /proc/$(systemctl show -P MainPID flexnode-agent)/status")
        need("NoNewPrivs:\t1" in main and "Seccomp:\t2" in main,
             "flexnode-agent's main process is not sandboxed: %r" % main)
        if self.MODE == "container":
            # ctr (the unit's main process) hands its capabilities to the privileged container
            # (units/container/flexnode-agent.service): both hold exactly the recorded set.
            mask = "%016x" % capability_mask(lab.repo, self.MODE)
            need("CapBnd:\t" + mask in main, "ctr's bounding set is not %s: %r" % (mask, main))
            pid = (lab.facts().get("task") or "").split()[0]
            agent = lab.sh("grep -E '^CapEff:' /proc/%s/status" % int(pid))
            need("CapEff:\t" + mask in agent,
                 "the agent's container does not hold exactly %s: %r" % (mask, agent))
        detail("%d processes, %d secrets looked for; exposure %s" % (len(rows), len(secrets), ", ".join(seen)))
