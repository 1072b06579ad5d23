-- The node image each side's tree is provisioned from, chosen before the pull (intent before
-- action): a provisioning resumed after a crash, or a repave to the same goal, takes the same
-- bytes even if the tag moved meanwhile; `flexnode status` shows the active side's.
-- `reference` is registry/repository[:tag]@sha256:… as chosen (never a credential).
CREATE TABLE machine_images (
    side               TEXT PRIMARY KEY,
    generation         INTEGER NOT NULL,
    kubernetes_version TEXT NOT NULL,
    reference          TEXT NOT NULL,
    digest             TEXT NOT NULL,
    chosen_at          INTEGER NOT NULL
);
