//! Test tiers can be skipped only with their variable set to exactly `1`
//! (`tests/support/tier.rs`). A skipped test (`#[tier(name)]`, tests/tier-macro) is then
//! compiled as ignored, with the reason
//! `SKIPPED <tier>: <variable>=1`, so libtest lists it and counts it among the ignored.

const TIERS: [(&str, &str); 7] = [
    ("controlplane", "FLEXNODE_SKIP_CONTROLPLANE"),
    ("nspawn", "FLEXNODE_SKIP_NSPAWN"),
    ("containerd", "FLEXNODE_SKIP_CONTAINERD"),
    ("qemu", "FLEXNODE_SKIP_QEMU"),
    ("host-suite", "FLEXNODE_SKIP_HOST_SUITE"),
    ("container-suite", "FLEXNODE_SKIP_CONTAINER_SUITE"),
    ("native-suite", "FLEXNODE_SKIP_NATIVE_SUITE"),
];

fn main() {
    let names: Vec<String> = TIERS.iter().map(|(t, _)| format!("\"{t}\"")).collect();
    println!(
        "cargo::rustc-check-cfg=cfg(flexnode_skip, values({}))",
        names.join(", ")
    );
    for (tier, var) in TIERS {
        println!("cargo::rerun-if-env-changed={var}");
        // Any other value is refused by the test itself (it runs, and fails naming it).
        if std::env::var(var).as_deref() == Ok("1") {
            println!("cargo::rustc-cfg=flexnode_skip=\"{tier}\"");
        }
    }
}
