#!/usr/bin/env python3
"""bench/report.py OUT — the tables of docs/benchmarks.md between its `bench/report.py`
markers, and docs/fleet.png, from what bench/run wrote to OUT (fleet.json, footprint.json,
handoff.json, staging.json, tcg-staging.json, effects.txt, image/sizes.json; anchor-daemon.json, from
bench/anchor-daemon.py, when there is one). A file that is missing leaves its table out
with a line saying so; nothing is invented."""

import json
import math
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOC = os.path.join(ROOT, "docs", "benchmarks.md")
PLOT = os.path.join(ROOT, "docs", "fleet.png")
BEGIN = "<!-- bench/report.py: begin (generated; edit bench/report.py) -->"
END = "<!-- bench/report.py: end -->"

# The Go agent at commit ae5ad0b on this machine kind (issue 13), used without ANCHOR_SRC.
ANCHOR_BYTES = 56_800_000
ANCHOR_VERSION_RSS_MIB = 60.3


def load(out, name):
    path = os.path.join(out, name)
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def fmt(v, digits=1):
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "—"
    if isinstance(v, float):
        return f"{v:,.{digits}f}"
    return f"{v:,}"


def verdict(ok):
    return "**met**" if ok else "**missed**"


def ratio(a, b):
    return a / b if b else float("nan")


FLEET_METRICS = [
    ("claim p50 (ms)", lambda r: r["claim_ms"]["p50"], 0),
    ("claim p95 (ms)", lambda r: r["claim_ms"]["p95"], 0),
    ("claim p99 (ms)", lambda r: r["claim_ms"]["p99"], 0),
    ("complete p50 (ms)", lambda r: r["complete_ms"]["p50"], 0),
    ("complete p99 (ms)", lambda r: r["complete_ms"]["p99"], 0),
    ("operation watch events per agent (mean)", lambda r: r["events_per_agent"], 1),
    ("API requests per operation", lambda r: r["requests_per_operation"], 1),
    ("agent CPU per operation (ms)", lambda r: r["agent_cpu_ms_per_operation"], 1),
    ("memory per agent (MiB)", lambda r: r["memory_mib_per_agent"], 2),
    ("API server CPU in the phase (s)", lambda r: r["apiserver_cpu_secs"], 1),
    ("API server RSS (MiB)", lambda r: r["apiserver_rss_mib"], 0),
]


def fleet_target(n, phase, metric, sel, rows_by):
    # N = 1's target is for sequential operations (the trickle); the burst's is one sample.
    if metric == "claim p99 (ms)":
        if n == 1 and phase == "trickle":
            return f"≤ 25 ms: {verdict(sel <= 25)}"
        if n == 1000 and phase == "burst":
            return f"≤ 250 ms: {verdict(sel <= 250)}"
    # In the burst every agent has one operation of its own, whatever N.
    if metric.startswith("operation watch events") and phase == "burst":
        smallest = min(rows_by)
        base = rows_by[smallest].get("selected")
        if base and n != smallest:
            r = ratio(sel, base["events_per_agent"])
            return f"independent of N ({fmt(r, 2)}× N={smallest}'s): {verdict(r <= 1.5)}"
    return ""


def fleet_tables(rows):
    lines = []
    for phase, what in [("burst", "one NodeReboot per node, created at once"),
                        ("trickle", "100 NodeReboots at 10 per second, round robin")]:
        by_n = {}
        for r in rows:
            if r["phase"] == phase:
                by_n.setdefault(r["nodes"], {})[r["strategy"]] = r
        if not by_n:
            continue
        lines += [f"**{phase.capitalize()}** ({what}):", "",
                  "| N | figure | flexnode (selectable field) | every operation, filtered locally (the Go agent's) | ratio | target |",
                  "|---|---|---|---|---|---|"]
        for n in sorted(by_n):
            sel, all_ = by_n[n].get("selected"), by_n[n].get("all")
            if not sel or not all_:
                continue
            bad = [f"{s}: {r['failed']} failed, {r['unfinished']} unfinished"
                   for s, r in (("selected", sel), ("all", all_)) if r["failed"] or r["unfinished"]]
            for name, get, d in FLEET_METRICS:
                a, b = get(sel), get(all_)
                lines.append(f"| {n:,} | {name} | {fmt(a, d)} | {fmt(b, d)} | {fmt(ratio(b, a), 2)}× | "
                             f"{fleet_target(n, phase, name, a, by_n)} |")
            if bad:
                lines.append(f"| {n:,} | operations not Complete | {'; '.join(bad)} | | | |")
        lines.append("")
    return lines


def plot(rows):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "no plot: python3-matplotlib is not installed (bench/run installs it)"
    burst = [r for r in rows if r["phase"] == "burst"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(8, 3), dpi=80)
    for strategy, label, style in [("selected", "flexnode (selectable field)", "o-"),
                                   ("all", "every operation (Go agent's)", "s--")]:
        pts = sorted((r["nodes"], r) for r in burst if r["strategy"] == strategy)
        ns = [n for n, _ in pts]
        left.plot(ns, [r["claim_ms"]["p99"] for _, r in pts], style, label=label)
        right.plot(ns, [r["events_per_agent"] for _, r in pts], style, label=label)
    for ax, title in [(left, "claim p99 (ms), burst"), (right, "operation events per agent, burst")]:
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("agents (N)")
        ax.set_title(title, fontsize=10)
        ax.grid(True, which="major", alpha=0.3)
    left.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(PLOT)
    return None


def footprint_table(fp, sizes, anchor_daemon):
    lines = ["| figure | flexnode | the Go agent | target |", "|---|---|---|---|"]
    fl = fp["flexnode"]
    anchor = fp.get("anchor")
    a_bytes = anchor["bytes"] if anchor else ANCHOR_BYTES
    a_rss = anchor["version_peak_rss_mib"] if anchor else ANCHOR_VERSION_RSS_MIB
    src = "" if anchor else " (issue 13's figure)"
    mb = fl["bytes"] / 1e6
    lines.append(f"| stripped binary | {mb:.1f} MB | {a_bytes / 1e6:.1f} MB{src} (flexnode: {fl['bytes'] / a_bytes:.2f}×) | "
                 f"≤ 17 MB: {verdict(mb <= 17)} |")
    lines.append(f"| `version`: peak RSS · wall | {fl['version_peak_rss_mib']:.1f} MiB · {fl['version_wall_ms']:.0f} ms | "
                 f"{a_rss:.1f} MiB{src}" + (f" · {anchor['version_wall_ms']:.0f} ms" if anchor else "") + " | |")
    d, g = fp["daemon"], anchor_daemon
    go = (lambda text: text) if g else (lambda text: "not measured (no ANCHOR_SRC, or its daemon did not start: bench/run's log)")
    lines.append(f"| idle RSS after {d['idle_window_secs'] / 60 + 1:.0f} min (after 1 min) | {d['rss_mib_idle']:.1f} MiB "
                 f"({d['rss_mib_after_1min']:.1f}) | "
                 + go(g and f"{g['rss_mib_idle']:.1f} MiB ({g['rss_mib_after_1min']:.1f}) (flexnode: {d['rss_mib_idle'] / g['rss_mib_idle']:.2f}×)")
                 + f" | ≤ 12 MiB: {verdict(d['rss_mib_idle'] <= 12)} |")
    lines.append(f"| CPU per idle hour | {d['cpu_secs_per_idle_hour']:.2f} s | "
                 + go(g and f"{g['cpu_secs_per_idle_hour']:.2f} s") + " | |")

    def reqs(x):
        return ", ".join(f"{k} ×{v}" for k, v in sorted(x["requests_in_window"].items())) or "none"

    nw = d["non_watch_requests_per_idle_minute"]
    lines.append(f"| API requests in the idle window ({d['idle_window_secs']:.0f} s, audit log) | {reqs(d)}; "
                 f"beyond the watches: {nw:.2f} per minute | "
                 + go(g and f"{reqs(g)}; beyond the watches: {g['non_watch_requests_per_idle_minute']:.2f} per minute")
                 + f" | none: {verdict(nw == 0)} |")
    lines.append(f"| `systemctl restart` of the joined agent: systemd's `Starting` → `Started` (`READY=1`: store opened, "
                 f"a pending hand-off judged, the outbox published; median of {len(d['ready_runs_ms'])}) | "
                 f"{d['ready_ms']:.0f} ms | | |")
    st = fp["store"]
    lines.append(f"| SQLite commit (`synchronous=FULL`, WAL, the cache's disk): intent · outcome | "
                 f"{st['intent_commit_ms']:.2f} ms · {st['outcome_commit_ms']:.2f} ms | | |")
    if sizes:
        amd = sizes.get("amd64", {})
        c, u = amd.get("compressed", 0) / 1e6, amd.get("unpacked", 0) / 1e6
        lines.append(f"| agent image (amd64): compressed · unpacked | {c:.2f} MB · {u:.1f} MB | | "
                     f"≤ 10 MB compressed: {verdict(c <= 10)} |")
    else:
        lines.append("| agent image | not built in this run | | |")
    return lines


PULL = re.compile(r"^containerd (\S+) \(([^)]*)\): (.+?): median (\d+) ms")


def pull_rows(text):
    by = {}
    for line in text.splitlines():
        m = PULL.match(line)
        if m:
            by.setdefault(m.group(1), {})[m.group(3)] = int(m.group(4))
    lines = []
    for version, ways in sorted(by.items()):
        ours = ways.get("flexnode pull, TLS + token")
        plain = ways.get("flexnode pull, plain http")
        for way, ms in sorted(ways.items()):
            if way.startswith("ctr"):
                lines.append(f"| pull + unpack, 10 MB image, containerd {version}: flexnode (plain http · TLS + token) against {way} | "
                             f"{plain} ms · {ours} ms against {ms} ms | {ratio(plain, ms):.2f}× · {ratio(ours, ms):.2f}× | |")
    return lines


def handoff_table(h):
    def row(what, key, target=None):
        v = h[key]["median_ms"]
        runs = h[key]["runs_ms"]
        t = f"≤ {target} ms: {verdict(v <= target)}" if target else ""
        return f"| {what} | **{v:.1f} ms** ({min(runs):.1f}–{max(runs):.1f}) | {t} |"
    return ["| figure (median of %d upgrades) | result (range) | target |" % h["runs"], "|---|---|---|",
            row("**hand-off gap**: old daemon exited (`Deactivated successfully`) → new daemon ready (`Started`)", "gap", 300),
            row("**claim → Complete excluding staging**: `Switching` → new daemon ready", "after_staging"),
            row("— switch (`current` link, `last-good`) and the restart timer scheduled", "switch"),
            row("— the restart timer (delay, accuracy, the transient service's `busctl` calls) until systemd stops the old daemon", "timer"),
            row("— the old daemon's stop (SIGTERM → exit)", "stop"),
            row("— the new daemon's start: the old one's exit → the new one's first line", "start"),
            row(f"—— systemd: the fork, the unit's mount sandbox ({h['mounts']} mounts in the container), the exec", "unit_start"),
            row("—— the daemon's own start-up (`init_ms` of its first line: configuration, TLS client, D-Bus, store)", "init"),
            row("— the judgement (`DaemonStarted`)", "judge"),
            row("— the result published → `READY=1` (`Started`)", "publish"),
            row(f"staging ({h['archive_bytes'] / 1e6:.1f} MB archive, {h['binary_bytes'] / 1e6:.1f} MB binary; "
                "from loopback, the container's tmpfs)", "staging")]


def staging_table(st, tcg, effects):
    lines = ["| figure | result | ratio | target |", "|---|---|---|---|"]
    if st:
        r = st["ratio"]
        lines.append(f"| staging of a {st['archive_bytes'] / 1e6:.1f} MB archive ({st['binary_bytes'] / 1e6:.1f} MB binary), "
                     f"native: `ArchiveFetcher::install` against `sha256sum` + `gunzip` | {st['install_ms']:.0f} ms against "
                     f"{st['sha256sum_gunzip_ms']:.0f} ms | {r:.2f}× | ≤ 1.3×: {verdict(r <= 1.3)} |")
    for which, b in sorted((tcg or {}).get("by_archive", {}).items()):
        r = b["ratio"]
        lines.append(f"| staging of a {b['archive_bytes'] / 1e6:.1f} MB archive ({b['binary_bytes'] / 1e6:.1f} MB binary, "
                     f"the {which} build), QEMU/TCG guest: an AgentUpgrade's claim → `Switching` (download included) against "
                     f"`sha256sum` + `tar -xzf` + `sync` + `version` in the same guest (median of {b['runs']}) | "
                     f"{b['staging_ms']:.0f} ms against {b['baseline_ms']:.0f} ms | {r:.2f}× | ≤ 1.3×: {verdict(r <= 1.3)} |")
        if "download_ms" in b:
            rd = b["ratio_with_download"]
            lines.append(f"| the same against the baseline plus the download alone (busybox `wget` from the artifact "
                         f"server through QEMU's user network, {b['download_ms']:.0f} ms) | {b['staging_ms']:.0f} ms against "
                         f"{b['baseline_ms'] + b['download_ms']:.0f} ms | {rd:.2f}× | |")
    if effects:
        lines += pull_rows(effects)
    return lines


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: bench/report.py OUT")
    out = sys.argv[1]
    fleet = load(out, "fleet.json")
    fp = load(out, "footprint.json")
    st = load(out, "staging.json")
    handoff = load(out, "handoff.json")
    sizes = load(out, "image/sizes.json")
    effects_path = os.path.join(out, "effects.txt")
    effects = open(effects_path).read() if os.path.exists(effects_path) else None

    body = [BEGIN, ""]
    body += ["### Fleet", "", "`bench/run` (`cargo bench --bench fleet`): " + (
        "the agents in one child process per N and strategy, each with its own client "
        "certificate, store (tmpfs), watches and simulated host; one real API server.") , ""]
    if fleet:
        body += fleet_tables(fleet)
        note = plot(fleet)
        body += [note if note else "![claim p99 and events per agent against N](fleet.png)", ""]
    else:
        body += ["(no fleet.json in this run)", ""]
    body += ["### Footprint", "", "`bench/run` (`cargo bench --bench footprint`, the release build):", ""]
    body += (footprint_table(fp, sizes, load(out, "anchor-daemon.json"))
             if fp else ["(no footprint.json in this run)"])
    body += ["", "### Hand-off at native speed", "",
             "`bench/run` (`cargo bench --bench handoff`, the release build joined as a host install in a "
             "booted nspawn container, real systemd 252, moments from its journal):", ""]
    body += handoff_table(handoff) if handoff else ["(no handoff.json in this run)"]
    body += ["", "### Staging and pulls against the tools", "",
             "`bench/run` (`cargo bench --bench staging`, `bench/tcg-staging.py` in a QEMU/TCG lab, "
             "`cargo bench --bench effects -- pull_10mb`):", ""]
    body += staging_table(st, load(out, "tcg-staging.json"), effects)
    body += ["", END]

    with open(DOC) as f:
        doc = f.read()
    if BEGIN in doc and END in doc:
        head, rest = doc.split(BEGIN, 1)
        _, tail = rest.split(END, 1)
        doc = head + "\n".join(body) + tail
    else:
        doc = doc.rstrip("\n") + "\n\n" + "\n".join(body) + "\n"
    with open(DOC, "w") as f:
        f.write(doc)
    print(f"bench/report.py: {DOC}" + ("" if not fleet else f", {PLOT}"))


if __name__ == "__main__":
    main()
