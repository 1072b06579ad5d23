//! The candidate check (`src/effects/host/candidate.rs`): `version` without a shell or an
//! environment, bad candidates refused, a hanging one killed.

use super::*;

#[tokio::test]
async fn check_candidate_runs_version_without_a_shell_or_environment() {
    let fx = joined().await;
    write_exec(
        &fx.layout.slot_binary(Slot::Green),
        "#!/bin/sh\nread line\necho \"flexnode 9.9.9 args=$* PATH=$PATH HOME=${HOME-unset} stdin=${line:-none}\"\necho second line\n",
    );
    let out = fx.host.check_candidate(Slot::Green).await.expect("check");
    assert_eq!(
        out,
        format!("flexnode 9.9.9 args=version PATH={CHECK_PATH} HOME=unset stdin=none")
    );
}

#[tokio::test]
async fn check_candidate_refuses_bad_candidates() {
    let fx = joined().await;
    let green = fx.layout.slot_binary(Slot::Green);

    let m = failed(fx.host.check_candidate(Slot::Green).await);
    assert!(m.contains("not installed"), "{m}");

    write_exec(&green, "#!/bin/sh\necho 'flexnode 1.0.0'\nexit 3\n");
    let m = failed(fx.host.check_candidate(Slot::Green).await);
    assert!(m.contains("failed") && m.contains('3'), "{m}");

    write_exec(&green, "#!/bin/sh\necho 'something else 1.0'\n");
    let m = failed(fx.host.check_candidate(Slot::Green).await);
    assert!(m.contains("flexnode <version>"), "{m}");

    std::fs::write(&green, b"not executable").expect("write");
    std::fs::set_permissions(&green, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let m = failed(fx.host.check_candidate(Slot::Green).await);
    assert!(m.contains("cannot run"), "{m}");

    // Chatty: only the first 4 KiB are kept, the rest is drained.
    write_exec(
        &green,
        "#!/bin/sh\necho 'flexnode 1.2.3'\nhead -c 1000000 /dev/zero\n",
    );
    assert_eq!(
        fx.host.check_candidate(Slot::Green).await,
        Ok("flexnode 1.2.3".to_string())
    );
}

#[tokio::test]
async fn check_candidate_kills_a_hanging_candidate() {
    let fx = joined().await;
    let host = fx
        .host
        .clone()
        .with_check_timeout(Duration::from_millis(500));
    write_exec(
        &fx.layout.slot_binary(Slot::Green),
        "#!/bin/sh\nexec sleep 30\n",
    );
    let started = Instant::now();
    let m = failed(host.check_candidate(Slot::Green).await);
    assert!(m.contains("did not finish"), "{m}");
    assert!(started.elapsed() < Duration::from_secs(5));
}
