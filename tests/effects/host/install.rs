//! The host effects of a join: the running build installed into its slot, the container
//! install's images, the layout's owners.

use super::*;

#[tokio::test]
async fn join_installs_the_running_build_replacing_a_seed_idempotently() {
    let fx = fixture();
    let l = &fx.layout;
    // An image builder placed a seed binary at bin/flexnode.
    write_exec(&l.bin_link(), "#!/bin/sh\necho seed\n");

    fx.host
        .install_agent(InstallMode::Host, &BLUE)
        .await
        .expect("install");

    let binary = l.slot_binary(Slot::Blue);
    assert_eq!(
        std::fs::read(&binary).expect("slot binary"),
        b"\x7fELF the running agent"
    );
    assert_eq!(mode(&binary), 0o755);
    assert_eq!(mode(&l.slot_dir(Slot::Blue)), 0o755);
    assert_eq!(mode(&l.agent_dir()), 0o755);
    assert_eq!(link(&l.current_link()), "lib/flexnode-blue");
    assert_eq!(link(&l.bin_link()), BIN_LINK_TARGET);
    assert_eq!(
        std::fs::read(l.bin_link()).expect("through the links"),
        b"\x7fELF the running agent"
    );
    assert!(!l.last_good_link().exists());
    assert_eq!(
        fx.host.selected_agent(InstallMode::Host).await,
        Ok(Some(BLUE))
    );
    let inode = std::fs::metadata(&binary).expect("meta").ino();

    // Again: nothing changes.
    fx.host
        .install_agent(InstallMode::Host, &BLUE)
        .await
        .expect("install again");
    assert_eq!(std::fs::metadata(&binary).expect("meta").ino(), inode);
    assert_eq!(link(&l.current_link()), "lib/flexnode-blue");
    for dir in [
        l.agent_dir(),
        l.slot_dir(Slot::Blue),
        l.bin_dir(),
        l.lib_dir(),
    ] {
        assert_eq!(leftovers(&dir), Vec::<String>::new(), "{}", dir.display());
    }

    // What the daemon learns about itself.
    assert_eq!(running_build(l, &l.bin_link()), Some(BLUE));
    assert_eq!(running_build(l, &binary), Some(BLUE));
    assert_eq!(running_build(l, &fx.root.join("usr/lib/os-release")), None);
}

#[tokio::test]
async fn install_replaces_different_bytes() {
    let fx = joined().await;
    let binary = fx.layout.slot_binary(Slot::Blue);
    std::fs::write(&binary, b"stale").expect("write");
    std::fs::set_permissions(&binary, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    fx.host
        .install_agent(InstallMode::Host, &BLUE)
        .await
        .expect("install");
    assert_eq!(
        std::fs::read(&binary).expect("read"),
        b"\x7fELF the running agent"
    );
    assert_eq!(mode(&binary), 0o755);
}

#[tokio::test]
async fn container_install_selects_images() {
    let fx = fixture();
    let d1 = sha(b"one");
    let d2 = sha(b"two");
    let image = |d: &Sha256Hex| AgentBuild::Image { digest: d.clone() };
    // The runtime directory holds the credential: private, also when it was not.
    std::fs::create_dir_all(fx.layout.runtime_dir()).expect("runtime dir");
    std::fs::set_permissions(
        fx.layout.runtime_dir(),
        std::fs::Permissions::from_mode(0o755),
    )
    .expect("chmod");
    assert_eq!(
        fx.host.selected_agent(InstallMode::Container).await,
        Ok(None)
    );
    fx.host
        .install_agent(InstallMode::Container, &image(&d1))
        .await
        .expect("install");
    assert_eq!(
        std::fs::read_to_string(fx.layout.agent_image_env()).expect("env"),
        format!(
            "FLEXNODE_AGENT_IMAGE=flexnode.invalid/agent@sha256:{}\n",
            d1.as_str()
        )
    );
    assert_eq!(
        fx.host.selected_agent(InstallMode::Container).await,
        Ok(Some(image(&d1)))
    );
    assert_eq!(mode(&fx.layout.runtime_dir()), 0o700);
    fx.host
        .select_agent(InstallMode::Container, &image(&d2), &image(&d1))
        .await
        .expect("select");
    assert_eq!(
        fx.host.selected_agent(InstallMode::Container).await,
        Ok(Some(image(&d2)))
    );
    assert_eq!(
        std::fs::read_to_string(fx.layout.agent_image_last_good_env()).expect("env"),
        format!(
            "FLEXNODE_AGENT_IMAGE=flexnode.invalid/agent@sha256:{}\n",
            d1.as_str()
        )
    );
    // Modes and builds must agree.
    failed(fx.host.install_agent(InstallMode::Host, &image(&d1)).await);
    failed(fx.host.install_agent(InstallMode::Container, &BLUE).await);
    failed(
        fx.host
            .select_agent(InstallMode::Host, &image(&d1), &image(&d1))
            .await,
    );
}

/// A layout directory another user owns could have its contents replaced under the agent (a
/// build root runs): it is refused, not used, and left as it is.
#[tokio::test]
async fn layout_directories_of_another_user_are_refused() {
    let fx = fixture();
    let l = &fx.layout;
    std::fs::create_dir_all(l.agent_dir()).expect("agent dir");
    std::os::unix::fs::chown(l.agent_dir(), Some(1000), Some(1000)).expect("chown");
    let m = failed(fx.host.install_agent(InstallMode::Host, &BLUE).await);
    assert!(m.contains("owned by uid 1000"), "{m}");
    assert!(!l.slot_binary(Slot::Blue).exists());
    assert_eq!(
        std::fs::metadata(l.agent_dir()).expect("meta").uid(),
        1000,
        "left as it was"
    );

    std::fs::create_dir_all(l.machines_dir()).expect("machines dir");
    std::os::unix::fs::chown(l.machines_dir(), Some(1000), None).expect("chown");
    let m = failed(fx.host.provision_machine(Side::Kube1, "1.33.2").await);
    assert!(m.contains("owned by uid 1000"), "{m}");
    assert!(!l.machine_dir(Side::Kube1).exists());
}
