-- The batch each op record came in (the hook's per-rank batch_seq): a worker that
-- restarts re-reads the batches of its open steps and must not store their records
-- again (rankwatch.streams.recovery reads these ids back).
ALTER TABLE ops ADD COLUMN IF NOT EXISTS batch_seq UInt64 DEFAULT 0 COMMENT 'the hook''s per-rank batch counter'
;

-- An alert's own timestamp at full precision (time is in ms, for Grafana): a worker
-- that re-announces a stored alert sends the ts_ns it first sent.
ALTER TABLE alerts ADD COLUMN IF NOT EXISTS ts_ns Int64 DEFAULT toUnixTimestamp64Nano(time) COMMENT 'the message ts_ns'
;
