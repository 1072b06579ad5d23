-- flexnode node store, schema 4: the outcome of a step's effects, recorded with it and kept
-- until the core has been told. A process that dies between recording an outcome and
-- feeding it back leaves it here; the next one feeds it first (src/exec/mod.rs).
ALTER TABLE node ADD COLUMN report TEXT; -- JSON Input (EffectsDone / EffectsFailed), or NULL
