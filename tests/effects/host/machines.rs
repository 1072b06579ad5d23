//! Machines and runtime files (`src/effects/host/machines.rs`, `kernel.rs`): trees
//! provisioned and removed, the os-release they need, runtime files and kernel modules.

use super::*;

#[tokio::test]
async fn provision_and_remove_machines() {
    let fx = fixture();
    let l = &fx.layout;
    assert_eq!(fx.host.machine_rootfs(Side::Kube1).await, Ok(None));
    fx.host
        .provision_machine(Side::Kube1, "1.33.2")
        .await
        .expect("provision");

    let m = l.machine_dir(Side::Kube1);
    assert_eq!(m, fx.root.join("var/lib/machines/kube1"));
    for (name, target) in [
        ("bin", "usr/bin"),
        ("sbin", "usr/sbin"),
        ("lib", "usr/lib"),
        ("lib64", "usr/lib64"),
    ] {
        assert_eq!(link(&m.join(name)), target, "{name}");
    }
    for dir in [
        "usr", "etc", "var", "tmp", "proc", "sys", "dev", "run", "root",
    ] {
        let meta = std::fs::symlink_metadata(m.join(dir)).expect(dir);
        assert!(meta.is_dir(), "{dir}");
    }
    assert_eq!(mode(&m.join("tmp")), 0o1777);
    assert_eq!(mode(&m.join("root")), 0o700);
    // The trees hold set-id programs: no other user reaches into them.
    assert_eq!(mode(&l.machines_dir()), 0o700);
    assert_eq!(
        std::fs::read_to_string(m.join("etc/os-release")).expect("os-release"),
        "ID=test\nNAME=\"Test OS\"\n"
    );
    assert_eq!(
        std::fs::read(m.join("etc/machine-id")).expect("machine-id"),
        b""
    );
    let nspawn = std::fs::read_to_string(fx.root.join("etc/systemd/nspawn/kube1.nspawn"))
        .expect("nspawn file");
    assert_eq!(nspawn, NSPAWN_SETTINGS);
    assert!(nspawn.contains("[Exec]\nPrivateUsers=no\n"));
    assert!(nspawn.contains("[Files]\nBindReadOnly=/usr\n"));
    assert!(nspawn.contains("[Network]\nVirtualEthernet=no\n"));
    let marker: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(m.join("etc/flexnode-machine.json")).expect("marker"),
    )
    .expect("json");
    assert_eq!(marker, serde_json::json!({"kubernetesVersion": "1.33.2"}));
    assert_eq!(
        fx.host.machine_rootfs(Side::Kube1).await,
        Ok(Some(bare_tree("1.33.2")))
    );
    assert_eq!(fx.host.machine_rootfs(Side::Kube2).await, Ok(None));

    // Again, then for another version.
    fx.host
        .provision_machine(Side::Kube1, "1.33.2")
        .await
        .expect("again");
    fx.host
        .provision_machine(Side::Kube1, "1.34.0")
        .await
        .expect("new version");
    assert_eq!(
        fx.host.machine_rootfs(Side::Kube1).await,
        Ok(Some(bare_tree("1.34.0")))
    );
    assert_eq!(leftovers(&m.join("etc")), Vec::<String>::new());

    // Removal never follows a symlink out of the tree.
    let outside = fx.root.join("precious");
    std::fs::create_dir_all(&outside).expect("outside");
    std::fs::write(outside.join("keep"), b"keep").expect("keep");
    std::os::unix::fs::symlink(&outside, m.join("var/escape")).expect("escape link");
    fx.host
        .provision_machine(Side::Kube2, "1.33.2")
        .await
        .expect("kube2");
    fx.host.remove_machine(Side::Kube1).await.expect("remove");
    assert!(std::fs::symlink_metadata(&m).is_err());
    assert!(!l.nspawn_file(Side::Kube1).exists());
    assert!(outside.join("keep").exists());
    assert_eq!(fx.host.machine_rootfs(Side::Kube1).await, Ok(None));
    assert_eq!(leftovers(&l.machines_dir()), Vec::<String>::new());
    // The other side is untouched; absent is fine.
    assert_eq!(
        fx.host.machine_rootfs(Side::Kube2).await,
        Ok(Some(bare_tree("1.33.2")))
    );
    assert!(l.nspawn_file(Side::Kube2).exists());
    fx.host.remove_machine(Side::Kube1).await.expect("again");
}

#[tokio::test]
async fn provision_needs_an_os_release() {
    let fx = fixture();
    std::fs::remove_file(fx.root.join("usr/lib/os-release")).expect("rm");
    let m = failed(fx.host.provision_machine(Side::Kube2, "1.33.2").await);
    assert!(m.contains("os-release"), "{m}");
    assert_eq!(fx.host.machine_rootfs(Side::Kube2).await, Ok(None));

    let source = fx.root.join("elsewhere-os-release");
    std::fs::write(&source, "ID=other\n").expect("write");
    let host = fx.host.clone().with_os_release(&source);
    host.provision_machine(Side::Kube2, "1.33.2")
        .await
        .expect("provision");
    assert_eq!(
        std::fs::read_to_string(fx.layout.machine_dir(Side::Kube2).join("etc/os-release"))
            .expect("read"),
        "ID=other\n"
    );
}

#[tokio::test]
async fn runtime_files_are_found_and_wiped() {
    let fx = fixture();
    assert_eq!(fx.host.runtime_present().await, Ok(false));
    fx.host.wipe_runtime().await.expect("absent is fine");
    let dir = fx.root.join("etc/flexnode");
    std::fs::create_dir_all(dir.join("credentials")).expect("dir");
    std::fs::write(dir.join("config.yaml"), b"node: x").expect("config");
    std::fs::write(dir.join("credentials/key"), b"secret").expect("key");
    assert_eq!(fx.host.runtime_present().await, Ok(true));
    fx.host.wipe_runtime().await.expect("wipe");
    assert_eq!(fx.host.runtime_present().await, Ok(false));
    assert!(fx.root.join("etc").exists());
}

/// The module list for boots is written (once) and counts as a runtime file: a reset removes
/// it. This kernel has both modules (built in or loaded), so nothing runs `modprobe` here; the
/// suites' guests load them (e2e/host/lab.py, `kernel_modules`).
#[tokio::test]
async fn kernel_modules_are_listed_for_boots_and_wiped() {
    let fx = fixture();
    for (name, probe) in flexnode::effects::host::KERNEL_MODULES {
        let present = probe.present().expect("probe");
        assert!(present, "this test needs {name} in the kernel already");
    }
    fx.host.load_kernel_modules().await.expect("load");
    let list = fx.root.join("etc/modules-load.d/flexnode.conf");
    let text = std::fs::read_to_string(&list).expect("listed");
    assert!(text.ends_with("overlay\nbr_netfilter\n"), "{text}");
    let written = std::fs::metadata(&list)
        .expect("meta")
        .modified()
        .expect("mtime");
    fx.host.load_kernel_modules().await.expect("again");
    assert_eq!(
        std::fs::metadata(&list)
            .expect("meta")
            .modified()
            .expect("mtime"),
        written,
        "an unchanged list is not rewritten"
    );
    assert_eq!(fx.host.runtime_present().await, Ok(true));
    fx.host.wipe_runtime().await.expect("wipe");
    assert!(!list.exists());
    assert_eq!(fx.host.runtime_present().await, Ok(false));
}

/// A minimal tree's marker as `machine_rootfs` reads it.
fn bare_tree(version: &str) -> flexnode::effects::MachineTree {
    flexnode::effects::MachineTree {
        kubernetes_version: version.to_string(),
        image: None,
        generation: None,
    }
}
