//! Selection (`src/effects/host/slots.rs`): the links moved, rolled back, read, and what a
//! discard may never remove.

use super::*;

#[tokio::test]
async fn select_and_roll_back_move_the_links() {
    let fx = joined().await;
    let l = &fx.layout;
    let m = failed(fx.host.select_agent(InstallMode::Host, &GREEN, &BLUE).await);
    assert!(m.contains("not installed"), "{m}");
    assert_eq!(link(&l.current_link()), "lib/flexnode-blue");
    assert!(!l.last_good_link().exists());

    write_exec(
        &l.slot_binary(Slot::Green),
        "#!/bin/sh\necho 'flexnode 2.0.0'\n",
    );
    fx.host
        .select_agent(InstallMode::Host, &GREEN, &BLUE)
        .await
        .expect("switch");
    assert_eq!(link(&l.current_link()), "lib/flexnode-green");
    assert_eq!(link(&l.last_good_link()), "lib/flexnode-blue");
    assert_eq!(link(&l.bin_link()), BIN_LINK_TARGET);
    assert_eq!(
        fx.host.selected_agent(InstallMode::Host).await,
        Ok(Some(GREEN))
    );
    assert_eq!(running_build(l, &l.bin_link()), Some(GREEN));

    // Roll back (the executor's switch_back: both links at the old build).
    fx.host
        .select_agent(InstallMode::Host, &BLUE, &BLUE)
        .await
        .expect("roll back");
    assert_eq!(link(&l.current_link()), "lib/flexnode-blue");
    assert_eq!(link(&l.last_good_link()), "lib/flexnode-blue");
    assert_eq!(leftovers(&l.agent_dir()), Vec::<String>::new());
    assert_eq!(leftovers(&l.bin_dir()), Vec::<String>::new());
}

#[tokio::test]
async fn selected_agent_reads_only_slot_links() {
    let fx = fixture();
    let l = &fx.layout;
    assert_eq!(fx.host.selected_agent(InstallMode::Host).await, Ok(None));
    std::fs::create_dir_all(l.agent_dir()).expect("dir");
    std::os::unix::fs::symlink("/usr/bin", l.current_link()).expect("link");
    failed(fx.host.selected_agent(InstallMode::Host).await);
    std::fs::remove_file(l.current_link()).expect("rm");
    std::fs::write(l.current_link(), b"file").expect("file");
    failed(fx.host.selected_agent(InstallMode::Host).await);
}

#[tokio::test]
async fn discard_never_removes_current_or_last_good() {
    let fx = joined().await;
    let l = &fx.layout;
    write_exec(&l.slot_binary(Slot::Green), "#!/bin/sh\n");
    fx.host
        .select_agent(InstallMode::Host, &GREEN, &BLUE)
        .await
        .expect("select");
    fx.host.discard_candidate(&GREEN).await.expect("discard");
    fx.host.discard_candidate(&BLUE).await.expect("discard");
    assert!(l.slot_binary(Slot::Green).exists());
    assert!(l.slot_binary(Slot::Blue).exists());

    fx.host
        .select_agent(InstallMode::Host, &BLUE, &BLUE)
        .await
        .expect("roll back");
    fx.host.discard_candidate(&GREEN).await.expect("discard");
    assert!(!l.slot_dir(Slot::Green).exists());
    assert!(l.slot_binary(Slot::Blue).exists());
    // Absent is fine; images are containerd's.
    fx.host.discard_candidate(&GREEN).await.expect("again");
    fx.host
        .discard_candidate(&AgentBuild::Image {
            digest: sha(b"img"),
        })
        .await
        .expect("image");
}

#[tokio::test]
async fn remove_agent_links_keeps_the_slots() {
    let fx = joined().await;
    let l = &fx.layout;
    write_exec(&l.slot_binary(Slot::Green), "#!/bin/sh\n");
    fx.host
        .select_agent(InstallMode::Host, &GREEN, &BLUE)
        .await
        .expect("select");
    fx.host.remove_agent_links().await.expect("remove");
    for p in [l.current_link(), l.last_good_link(), l.bin_link()] {
        assert!(std::fs::symlink_metadata(&p).is_err(), "{}", p.display());
    }
    assert!(l.slot_binary(Slot::Blue).exists());
    assert!(l.slot_binary(Slot::Green).exists());
    assert_eq!(fx.host.selected_agent(InstallMode::Host).await, Ok(None));
    fx.host.remove_agent_links().await.expect("again");

    // Re-join reuses the slot.
    fx.host
        .install_agent(InstallMode::Host, &BLUE)
        .await
        .expect("re-join");
    assert_eq!(link(&l.current_link()), "lib/flexnode-blue");
}
