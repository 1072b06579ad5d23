-- flexnode node store, schema 2: the images the agent itself pulled. Only these are ever
-- removed; an image an operator pulled is never touched.

CREATE TABLE agent_images (
    digest     TEXT    PRIMARY KEY,  -- 64 lowercase hex
    reference  TEXT    NOT NULL,     -- registry/repository@sha256:…
    pulled_at  INTEGER NOT NULL
);
