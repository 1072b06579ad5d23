#!/usr/bin/env python3
"""bench/tcg-staging.py — staging in the QEMU/TCG guest against the work no stager can skip,
measured in the same guest in the same run (docs/benchmarks.md, "Staging").

  tcg-staging.py --lab DIR [--runs N] --out FILE

DIR is a lab that `e2e/run lab --dir DIR --no-walkthrough` brought up (not joined yet). The
node is joined, then N AgentUpgrades (default 6) alternate between the lab's two archives:
the next build (the stripped debug build, as the suites stage it) and back to the installed
release build. Staging is claim -> `Switching` in the guest's journal: download from the
artifact server, SHA-256 while streaming, gunzip, the tar member checks, write, fsync, rename,
the candidate's `version`. After each upgrade the guest does, on the same archive (fetched
once beforehand with busybox wget, so without the download): `sha256sum`, `tar -xzf`, `sync`
of the binary and its `version` — the baseline; and, timed apart, the same download alone
(busybox wget from the artifact server). Medians per archive and the ratios (against the
baseline, and against the baseline plus the download) go to FILE (JSON). Python 3 stdlib only.
"""

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "e2e", "host"))
from lab import TERMINAL, Lab, need, op_view, upgrade_moments, wait_until  # noqa: E402

ARCHIVES = (("next", "flexnode-good.tar.gz", "SHA_GOOD"), ("base", "flexnode-base.tar.gz", "SHA_BASE"))

BASELINE = r"""
d=/var/tmp/fnbench-{which}
cd "$d"
rm -rf x && mkdir x
t0=$(date +%s%N)
busybox wget -q -O x/fetched {url}
t1=$(date +%s%N)
echo "$(( (t1 - t0) / 1000 ))"
rm x/fetched
t0=$(date +%s%N)
sha256sum a.tar.gz >/dev/null
tar -C x -xzf a.tar.gz
sync x/flexnode-linux-amd64
x/flexnode-linux-amd64 version >/dev/null
t1=$(date +%s%N)
echo "$(( (t1 - t0) / 1000 )) $(stat -c %s x/flexnode-linux-amd64) $(stat -c %s a.tar.gz)"
rm -rf x
"""


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lab", required=True)
    ap.add_argument("--runs", type=int, default=6)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    lab = Lab(a.lab)

    t = time.time()
    rc, out, err = lab.ssh("/root/flexnode join --config /root/join.yaml", 900)
    need(rc == 0, "join exited %d: %s" % (rc, (err or out).strip()[-600:]))
    print("tcg-staging: joined in %.0f s" % (time.time() - t), flush=True)
    for which, name, _ in ARCHIVES:
        lab.sh("mkdir -p /var/tmp/fnbench-%s && busybox wget -q -O /var/tmp/fnbench-%s/a.tar.gz http://%s/%s"
               % (which, which, lab.art, name), 300)

    runs = []
    for i in range(a.runs):
        which, name, sha_key = ARCHIVES[i % 2]
        op = "bench-upgrade-%d" % i
        since = int(time.time()) - 2
        lab.op_create("upgrade", op, url="http://%s/%s" % (lab.art, name), sha=lab.st[sha_key])
        wait_until("%s to finish" % op, lambda: op_view(lab.get_op(op))[0] in TERMINAL, 900, 2)
        v = op_view(lab.get_op(op))
        need(v[:2] == ("Complete", "Succeeded"), "%s ended %s/%s: %r" % (op, v[0], v[1], v[2]))
        m = wait_until("the journal to show %s's hand-off" % op,
                       lambda: upgrade_moments(lab, op, since), 60, 1)
        url = "http://%s/%s" % (lab.art, name)
        fetch, usec, binary, archive = (int(x) for x in lab.sh(BASELINE.format(which=which, url=url), 300).split())
        run = {"archive": which, "archive_bytes": archive, "binary_bytes": binary,
               "staging_ms": (m["staged"] - m["claim"]) * 1e3, "baseline_ms": usec / 1e3,
               "download_ms": fetch / 1e3}
        print("tcg-staging: %s (%s): staging %.0f ms, sha256sum + tar + sync + version %.0f ms, "
              "download alone %.0f ms" % (op, which, run["staging_ms"], run["baseline_ms"], run["download_ms"]),
              flush=True)
        runs.append(run)

    by = {}
    for which, _, _ in ARCHIVES:
        mine = [r for r in runs if r["archive"] == which]
        if not mine:
            continue
        st = statistics.median(r["staging_ms"] for r in mine)
        bl = statistics.median(r["baseline_ms"] for r in mine)
        dl = statistics.median(r["download_ms"] for r in mine)
        by[which] = {"runs": len(mine), "archive_bytes": mine[0]["archive_bytes"],
                     "binary_bytes": mine[0]["binary_bytes"], "staging_ms": st, "baseline_ms": bl,
                     "download_ms": dl, "ratio": st / bl, "ratio_with_download": st / (bl + dl)}
    with open(a.out, "w") as fh:
        json.dump({"runs": runs, "by_archive": by}, fh, indent=2)
        fh.write("\n")
    print("tcg-staging: results in %s" % a.out, flush=True)


if __name__ == "__main__":
    main()
