-- What the hang and Minder workers must remember across a restart (docs/detection.md,
-- "After a restart"): a detector's state per job as a JSON snapshot, replaced by each
-- newer one (Minder: continuity counters, open episodes, the window's carried samples;
-- hang: the step-time baseline).
CREATE TABLE IF NOT EXISTS detector_state
(
    job LowCardinality(String),
    detector LowCardinality(String) COMMENT 'hang or minder',
    time DateTime64(3, 'UTC') COMMENT 'when the snapshot was taken',
    state String COMMENT 'JSON object, the detector''s own format',
    version UInt64
)
ENGINE = ReplacingMergeTree(version)
ORDER BY (job, detector)
;

-- Alert states sent on rankwatch.alerts, recorded after the send: a restarted hang or
-- Minder worker re-sends a job's stored alert states that have no row here.
CREATE TABLE IF NOT EXISTS announced
(
    job LowCardinality(String),
    alert_id String,
    state LowCardinality(String),
    time DateTime64(3, 'UTC') COMMENT 'when it was sent'
)
ENGINE = ReplacingMergeTree
ORDER BY (job, alert_id, state)
;
