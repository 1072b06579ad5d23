-- The drain under way or the cordon it placed (one at most). Recorded before the Node is
-- cordoned (intent before action), so a crash never leaves the Node cordoned without a
-- record, and only the holder's cordon is ever lifted: `cordoned` says the Node carries the
-- holder's mark (0: not yet, or the Node was cordoned by someone else, whose cordon stays).
-- `progress` is the drain's last line for `flexnode status`.
CREATE TABLE cordon (
    id       INTEGER PRIMARY KEY CHECK (id = 1),
    holder   TEXT NOT NULL,
    cordoned INTEGER NOT NULL,
    since    INTEGER NOT NULL,
    progress TEXT NOT NULL
);
