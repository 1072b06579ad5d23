//! The `Containerd` contract. Each case pushes (or serves) its own image, so the cases can share
//! one containerd and registry.

use super::failed_message;
use flexnode::effects::Containerd;
use flexnode::lifecycle::agent::Sha256Hex;
use sha2::{Digest, Sha256};

/// What differs between implementations.
#[allow(async_fn_in_trait)]
pub trait ContainerdFixture {
    type C: Containerd;
    fn containerd(&self) -> &Self::C;
    /// An image the registry serves under repository `e2e/<name>`: its digest.
    async fn image(&self, name: &str) -> Sha256Hex;
    /// `registry/repository@sha256:…` for that registry.
    fn reference(&self, repository: &str, digest: &Sha256Hex) -> String;
}

/// A digest no registry has.
pub fn absent_digest(seed: &str) -> Sha256Hex {
    Sha256Hex::parse(&hex::encode(Sha256::digest(
        format!("not an image: {seed}").as_bytes(),
    )))
    .expect("hex")
}

async fn present<C: Containerd>(c: &C, digest: &Sha256Hex) -> bool {
    c.image_present(digest)
        .await
        .unwrap_or_else(|e| panic!("image_present {digest}: {e}"))
}

pub async fn run_all<F: ContainerdFixture>(implementation: &'static str, fx: &F) {
    run_cases!(
        implementation,
        fx,
        [
            pull_makes_the_image_present,
            pull_twice_is_idempotent,
            pull_of_a_digest_the_registry_lacks_fails,
            pull_of_a_reference_pinned_elsewhere_fails,
            remove_agent_image_is_idempotent,
            an_image_pulls_again_after_removal,
            check_of_an_image_not_pulled_fails,
        ]
    );
}

/// pull(reference, digest), then image_present(digest); other digests stay absent.
pub async fn pull_makes_the_image_present<F: ContainerdFixture>(fx: &F) {
    let c = fx.containerd();
    let digest = fx.image("contract-pull").await;
    let reference = fx.reference("e2e/contract-pull", &digest);
    assert!(!present(c, &digest).await, "present before the pull");
    c.pull(&reference, &digest).await.expect("pull");
    assert!(present(c, &digest).await, "absent after the pull");
    assert!(!present(c, &absent_digest("pull")).await);
}

/// A second pull succeeds and leaves one image: a single remove takes it.
pub async fn pull_twice_is_idempotent<F: ContainerdFixture>(fx: &F) {
    let c = fx.containerd();
    let digest = fx.image("contract-twice").await;
    let reference = fx.reference("e2e/contract-twice", &digest);
    c.pull(&reference, &digest).await.expect("pull");
    c.pull(&reference, &digest).await.expect("second pull");
    assert!(present(c, &digest).await);
    c.remove_agent_image(&digest).await.expect("remove");
    assert!(!present(c, &digest).await, "present after one remove");
}

/// A digest the registry does not have: Failed, saying so and naming the digest; nothing is
/// present.
pub async fn pull_of_a_digest_the_registry_lacks_fails<F: ContainerdFixture>(fx: &F) {
    let c = fx.containerd();
    // The repository exists; the digest does not.
    fx.image("contract-missing").await;
    let wrong = absent_digest("missing");
    let msg = failed_message(
        "pull of a missing digest",
        c.pull(&fx.reference("e2e/contract-missing", &wrong), &wrong)
            .await,
    );
    assert!(
        msg.contains("not found") && msg.contains(&wrong.oci()),
        "does not say what is missing: {msg}"
    );
    assert!(!present(c, &wrong).await, "present after a failed pull");
}

/// The reference must be pinned to the digest asked for; nothing is pulled otherwise.
pub async fn pull_of_a_reference_pinned_elsewhere_fails<F: ContainerdFixture>(fx: &F) {
    let c = fx.containerd();
    let good = fx.image("contract-pinned").await;
    let wrong = absent_digest("pinned");
    let msg = failed_message(
        "pull of a reference pinned to another digest",
        c.pull(&fx.reference("e2e/contract-pinned", &good), &wrong)
            .await,
    );
    assert!(
        msg.contains("pinned to") && msg.contains(&good.oci()),
        "{msg}"
    );
    assert!(!present(c, &wrong).await);
    assert!(!present(c, &good).await);
    let unpinned = fx
        .reference("e2e/contract-pinned", &good)
        .replace(&format!("@{}", good.oci()), ":v1");
    failed_message("pull of a tag", c.pull(&unpinned, &good).await);
    assert!(!present(c, &good).await);
}

/// remove_agent_image: absent afterwards; again, or for a digest never pulled, is fine.
pub async fn remove_agent_image_is_idempotent<F: ContainerdFixture>(fx: &F) {
    let c = fx.containerd();
    let digest = fx.image("contract-remove").await;
    c.pull(&fx.reference("e2e/contract-remove", &digest), &digest)
        .await
        .expect("pull");
    c.remove_agent_image(&digest).await.expect("remove");
    assert!(!present(c, &digest).await, "present after remove");
    c.remove_agent_image(&digest).await.expect("remove again");
    c.remove_agent_image(&absent_digest("remove"))
        .await
        .expect("remove of an image never pulled");
}

pub async fn an_image_pulls_again_after_removal<F: ContainerdFixture>(fx: &F) {
    let c = fx.containerd();
    let digest = fx.image("contract-again").await;
    let reference = fx.reference("e2e/contract-again", &digest);
    c.pull(&reference, &digest).await.expect("pull");
    c.remove_agent_image(&digest).await.expect("remove");
    c.pull(&reference, &digest)
        .await
        .expect("pull after remove");
    assert!(present(c, &digest).await);
    c.remove_agent_image(&digest).await.expect("remove");
}

/// check_image of a digest that was never pulled (or was removed) fails, and leaves the image
/// absent.
pub async fn check_of_an_image_not_pulled_fails<F: ContainerdFixture>(fx: &F) {
    let c = fx.containerd();
    failed_message(
        "check of an image never pulled",
        c.check_image(&absent_digest("check")).await,
    );
    let digest = fx.image("contract-check").await;
    c.pull(&fx.reference("e2e/contract-check", &digest), &digest)
        .await
        .expect("pull");
    c.remove_agent_image(&digest).await.expect("remove");
    failed_message("check of a removed image", c.check_image(&digest).await);
    assert!(!present(c, &digest).await);
}
