-- The node's Node as the agent last saw it (one row): `flexnode status` shows it while the
-- daemon is stopped. `seen` is the JSON of effects::NodeSeen.
CREATE TABLE node_seen (
    id      INTEGER PRIMARY KEY CHECK (id = 1),
    seen    TEXT NOT NULL,
    seen_at INTEGER NOT NULL
);
