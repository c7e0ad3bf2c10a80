-- The slowdown signals the what-if cannot see (docs/detection.md, section 3): one row
-- per rank and step (the rankwatch.signals message), derived by the ops worker from the
-- rank_steps summaries of ops v2 messages. Re-derived rows replace older ones.
CREATE TABLE IF NOT EXISTS rank_signals
(
    job LowCardinality(String),
    step UInt64,
    rank UInt32,
    host LowCardinality(String),
    dp_rank UInt32,
    pp_rank UInt32,
    time DateTime64(3, 'UTC') COMMENT 'step begin on this rank (start_ns)',
    t_step Float64 COMMENT 's, previous step end to this step end',
    t_inter Float64 COMMENT 's, previous step end to this step begin',
    v_inter Float64 COMMENT 't_inter / t_step',
    v_minority Float64 COMMENT 'untimed time inside the step / (t_step - t_inter)',
    throughput Nullable(Float64) COMMENT 'samples/s',
    flops_per_s Nullable(Float64) COMMENT 'declared FLOPs / compute time less GC inside it',
    busbw Nullable(Float64) COMMENT 'bytes/s, bus bandwidth (NCCL factors)',
    gc_s Float64,
    gc_count UInt32,
    data_wait_s Float64,
    issue_p50_us Nullable(Float64) COMMENT 'GPU start - CPU launch; NULL without a GPU',
    issue_p99_us Nullable(Float64),
    anomalies Array(LowCardinality(String)) COMMENT 'kinds with an open episode on this rank',
    version UInt64
)
ENGINE = ReplacingMergeTree(version)
PARTITION BY toDate(time)
ORDER BY (job, step, rank)
TTL toDateTime(time) + INTERVAL 30 DAY
;

-- Alerts of the signals worker: the kinds of alerts v2.
ALTER TABLE alerts DROP CONSTRAINT IF EXISTS kind_known
;

ALTER TABLE alerts ADD CONSTRAINT IF NOT EXISTS kind_known CHECK kind IN ('straggler', 'hang', 'faulty_machine', 'flops-drop', 'bandwidth-drop', 'issue-stall', 'void-high', 'gc-pauses', 'dataloader-bound', 'throughput-drop')
;
