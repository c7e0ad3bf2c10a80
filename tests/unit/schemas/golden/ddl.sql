CREATE TABLE IF NOT EXISTS schema_migrations
(
    name String,
    checksum String,
    applied_at DateTime64(3, 'UTC') DEFAULT now64(3)
)
ENGINE = MergeTree
ORDER BY name
;

-- 0001_initial
CREATE TABLE IF NOT EXISTS ops
(
    job LowCardinality(String),
    host LowCardinality(String),
    rank UInt32,
    dp_rank UInt32,
    pp_rank UInt32,
    tp_rank UInt32,
    cp_rank UInt32,
    step UInt64,
    optype Enum8('forward-compute' = 0, 'backward-compute' = 1, 'forward-send' = 2, 'forward-recv' = 3, 'backward-send' = 4, 'backward-recv' = 5, 'params-all-gather' = 6, 'grads-reduce-scatter' = 7, 'separate-grads-all-reduce' = 8, 'layernorm-grads-all-reduce' = 9, 'embedding-grads-all-reduce' = 10, 'optimizer-clip-main-grad' = 11, 'optimizer' = 12, 'gc' = 13),
    seq_id UInt64,
    mb_id Int32,
    chunk Int16,
    gmc Int32,
    time DateTime64(9, 'UTC') COMMENT 'op start (start_ns), aligned clock',
    duration_ns UInt64,
    bytes Nullable(UInt64),
    flops Nullable(Float64),
    stream LowCardinality(Nullable(String)),
    inserted_at DateTime64(3, 'UTC') DEFAULT now64(3)
)
ENGINE = ReplacingMergeTree
PARTITION BY toDate(time)
ORDER BY (job, step, rank, optype, seq_id)
TTL toDateTime(time) + INTERVAL 7 DAY
;

CREATE TABLE IF NOT EXISTS steps
(
    job LowCardinality(String),
    step UInt64,
    time DateTime64(3, 'UTC') COMMENT 'step start (start_ns)',
    t_base Float64 COMMENT 'recorded step time, s',
    t_sim Nullable(Float64) COMMENT 'simulated step time, s; NULL when not analysed (partial step)',
    t_ideal Nullable(Float64) COMMENT 'simulated time without stragglers, s; NULL when not analysed',
    slowdown Nullable(Float64) COMMENT 't_sim / t_ideal; NULL when not analysed',
    waste Nullable(Float64) COMMENT '1 - 1/slowdown; NULL when not analysed',
    partial UInt8 COMMENT '1 when closed by timeout with workers missing',
    missing_workers Array(String) COMMENT 'dp,stage of each missing worker',
    n_ops UInt64,
    analysed_at DateTime64(3, 'UTC'),
    version UInt64
)
ENGINE = ReplacingMergeTree(version)
ORDER BY (job, step)
;

CREATE TABLE IF NOT EXISTS step_attribution
(
    job LowCardinality(String),
    step UInt64,
    time DateTime64(3, 'UTC') COMMENT 'step start',
    dimension LowCardinality(String),
    `group` String,
    slowdown Float64,
    version UInt64,
    CONSTRAINT dimension_known CHECK dimension IN ('optype', 'dp_rank', 'stage', 'worker')
)
ENGINE = ReplacingMergeTree(version)
ORDER BY (job, step, dimension, `group`)
;

CREATE TABLE IF NOT EXISTS hangs
(
    job LowCardinality(String),
    episode_id String COMMENT 'the alert_id of the hang alert',
    time DateTime64(3, 'UTC') COMMENT 'when the hang was declared',
    last_progress DateTime64(3, 'UTC') COMMENT 'last progress of any rank',
    resolved_at Nullable(DateTime64(3, 'UTC')),
    step UInt64,
    culprit_ranks Array(UInt32),
    waiting_ranks Array(UInt32),
    silent_ranks Array(UInt32) COMMENT 'ranks whose heartbeats stopped',
    culprit_hosts Array(String),
    culprit_where String COMMENT 'op in flight or innermost frame of the culprit',
    summary String,
    version UInt64
)
ENGINE = ReplacingMergeTree(version)
ORDER BY (job, episode_id)
;

CREATE TABLE IF NOT EXISTS stacks
(
    job LowCardinality(String),
    episode_id String,
    time DateTime64(3, 'UTC'),
    stack String COMMENT 'folded frames, outermost first, joined by ;',
    native UInt8,
    ranks Array(UInt32),
    ranks_text String COMMENT 'ranks in this path, as ranges: 0-3,5',
    absent_ranks_text String COMMENT 'ranks not in this path, as ranges',
    n_ranks UInt32,
    version UInt64
)
ENGINE = ReplacingMergeTree(version)
ORDER BY (job, episode_id, stack)
;

CREATE TABLE IF NOT EXISTS machine_scores
(
    job LowCardinality(String),
    host LowCardinality(String),
    time DateTime64(3, 'UTC') COMMENT 'window end',
    metric LowCardinality(String),
    score Float64,
    candidate UInt8
)
ENGINE = ReplacingMergeTree
ORDER BY (job, metric, host, time)
TTL toDateTime(time) + INTERVAL 30 DAY
;

CREATE TABLE IF NOT EXISTS machine_faults
(
    job LowCardinality(String),
    host LowCardinality(String),
    time DateTime64(3, 'UTC') COMMENT 'when reported',
    first_seen DateTime64(3, 'UTC') COMMENT 'start of the candidacy',
    metric LowCardinality(String),
    score Float64,
    alert_id String,
    resolved_at Nullable(DateTime64(3, 'UTC')),
    version UInt64
)
ENGINE = ReplacingMergeTree(version)
ORDER BY (job, host, first_seen)
;

CREATE TABLE IF NOT EXISTS alerts
(
    job LowCardinality(String),
    alert_id String,
    kind LowCardinality(String),
    state LowCardinality(String),
    severity LowCardinality(String),
    time DateTime64(3, 'UTC') COMMENT 'ts_ns',
    summary String,
    evidence String COMMENT 'JSON object',
    CONSTRAINT kind_known CHECK kind IN ('straggler', 'hang', 'faulty_machine'),
    CONSTRAINT state_known CHECK state IN ('firing', 'resolved'),
    CONSTRAINT severity_known CHECK severity IN ('info', 'warning', 'critical')
)
ENGINE = ReplacingMergeTree
ORDER BY (job, alert_id, state, time)
;

CREATE TABLE IF NOT EXISTS jobs
(
    job String,
    dp_size UInt32,
    pp_size UInt32,
    tp_size UInt32,
    cp_size UInt32,
    vpp_size UInt32,
    world_size UInt32,
    schedule LowCardinality(String) COMMENT 'e.g. 1f1b, interleaved-1f1b',
    hosts Array(String),
    first_seen DateTime64(3, 'UTC'),
    last_seen DateTime64(3, 'UTC'),
    version UInt64
)
ENGINE = ReplacingMergeTree(version)
ORDER BY job
;

CREATE TABLE IF NOT EXISTS dead_letters
(
    time DateTime64(3, 'UTC'),
    topic LowCardinality(String),
    `partition` Int32 COMMENT '-1 when not from Kafka',
    `offset` Int64 COMMENT '-1 when not from Kafka',
    key String,
    reason LowCardinality(String) COMMENT 'InvalidMessage.reason',
    detail String,
    payload String COMMENT 'the message bytes, truncated',
    payload_bytes UInt64 COMMENT 'size before truncation'
)
ENGINE = ReplacingMergeTree
ORDER BY (topic, `partition`, `offset`, time)
TTL toDateTime(time) + INTERVAL 30 DAY
;

-- 0002_batch_ids_and_alert_ns
ALTER TABLE ops ADD COLUMN IF NOT EXISTS batch_seq UInt64 DEFAULT 0 COMMENT 'the hook''s per-rank batch counter'
;

ALTER TABLE alerts ADD COLUMN IF NOT EXISTS ts_ns Int64 DEFAULT toUnixTimestamp64Nano(time) COMMENT 'the message ts_ns'
;

-- 0003_detector_state
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

-- 0004_rank_signals
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

ALTER TABLE alerts DROP CONSTRAINT IF EXISTS kind_known
;

ALTER TABLE alerts ADD CONSTRAINT IF NOT EXISTS kind_known CHECK kind IN ('straggler', 'hang', 'faulty_machine', 'flops-drop', 'bandwidth-drop', 'issue-stall', 'void-high', 'gc-pauses', 'dataloader-bound', 'throughput-drop')
;

-- 0005_scenarios
CREATE TABLE IF NOT EXISTS scenarios
(
    job LowCardinality(String),
    time DateTime64(3, 'UTC') COMMENT 'when the run computed it',
    run_id String COMMENT 'one id per run',
    position UInt16 COMMENT 'order in the run (the baseline first when there is one)',
    name String,
    settings String COMMENT 'JSON object of the changed settings',
    swept_key LowCardinality(String) COMMENT 'the --sweep key; empty when none',
    swept_value Nullable(Float64) COMMENT 'the swept value when a number',
    step_time_s Float64 COMMENT 'simulated step time, mean over the steps',
    baseline_s Float64 COMMENT 'the job as measured, simulated, s',
    speedup Float64 COMMENT 'baseline_s / step_time_s',
    steps UInt32 COMMENT 'steps calibrated on',
    last_step UInt64 COMMENT 'newest step calibrated on'
)
ENGINE = ReplacingMergeTree
ORDER BY (job, time, run_id, position)
TTL toDateTime(time) + INTERVAL 90 DAY
;
