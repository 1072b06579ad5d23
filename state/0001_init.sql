-- flexnode node store, schema 1.
-- One row of node state plus the intent of the step being executed; operations seen with
-- their results (an outbox for publication); and an append-only transition journal.

CREATE TABLE node (
    id          INTEGER PRIMARY KEY CHECK (id = 1),
    state       TEXT    NOT NULL,  -- JSON NodeState
    pending     TEXT,              -- JSON effects of the step not yet confirmed (the intent)
    pending_seq INTEGER,           -- journal entry of that intent
    updated_at  INTEGER NOT NULL   -- unix ms
);

CREATE TABLE operations (
    uid                 TEXT    PRIMARY KEY,
    name                TEXT    NOT NULL,
    generation          INTEGER NOT NULL DEFAULT 0,
    kind                TEXT    NOT NULL,
    first_seen_at       INTEGER NOT NULL,
    result_reason       TEXT,     -- NULL until a terminal result exists
    result_message      TEXT,
    started_at          INTEGER,
    completed_at        INTEGER,
    machine_generation  INTEGER,
    published_at        INTEGER   -- NULL while the result waits to be published
);

CREATE INDEX operations_unpublished ON operations (completed_at)
    WHERE result_reason IS NOT NULL AND published_at IS NULL;

CREATE TABLE journal (
    seq         INTEGER PRIMARY KEY AUTOINCREMENT,
    at          INTEGER NOT NULL,
    from_state  TEXT    NOT NULL,
    input       TEXT    NOT NULL,
    to_state    TEXT    NOT NULL,
    effects     TEXT    NOT NULL,  -- JSON array of one-line, redacted summaries
    outcome     TEXT,              -- NULL while the effects run
    outcome_at  INTEGER
);

-- Append-only: rows are never deleted, and only a missing outcome may be filled in.
CREATE TRIGGER journal_no_delete BEFORE DELETE ON journal
BEGIN
    SELECT RAISE(ABORT, 'the journal is append-only');
END;

CREATE TRIGGER journal_outcome_once BEFORE UPDATE ON journal
WHEN OLD.outcome IS NOT NULL
  OR NEW.seq IS NOT OLD.seq OR NEW.at IS NOT OLD.at OR NEW.from_state IS NOT OLD.from_state
  OR NEW.input IS NOT OLD.input OR NEW.to_state IS NOT OLD.to_state
  OR NEW.effects IS NOT OLD.effects
BEGIN
    SELECT RAISE(ABORT, 'journal entries are immutable once their outcome is recorded');
END;
